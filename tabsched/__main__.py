"""``python -m tabsched``: the same as the ``tabsched`` command."""

from tabsched.cli import main

if __name__ == "__main__":
    main()
