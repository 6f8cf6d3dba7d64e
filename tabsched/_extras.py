"""Optional dependencies: imported on demand, or one line saying how to install them.

tabsched's core needs numpy and click only. Pictures need matplotlib (the ``plot``
extra) and distributed sweeps need Dask (the ``dask`` extra). The install hint fits how
tabsched itself was installed: ``pip install 'tabsched[plot]'`` for a normal install,
``pip install -e '<checkout>[plot]'`` for an editable one (what PEP 610's
``direct_url.json`` records).

>>> install_command("plot").startswith("pip install")
True
"""

import importlib
import json

from tabsched.exceptions import MissingDependencyError

__all__ = ["install_command", "require"]


def _editable_checkout():
    """The source folder of an editable install of tabsched, else None."""
    from importlib import metadata     # ~10 ms to import: only when a hint is written
    try:
        text = metadata.distribution("tabsched").read_text("direct_url.json")
        record = json.loads(text) if text else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return None
    url = record.get("url", "")
    if record.get("dir_info", {}).get("editable") and url.startswith("file://"):
        return url[len("file://"):]
    return None


def install_command(extra):
    """The pip command that adds ``extra`` to this installation of tabsched."""
    checkout = _editable_checkout()
    if checkout is not None:
        return f"pip install -e '{checkout}[{extra}]'"
    return f"pip install 'tabsched[{extra}]'"


def require(module, extra, purpose):
    """Import ``module``, or raise :class:`MissingDependencyError` naming ``extra``.

    >>> require("json", "none", "tests").__name__
    'json'
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.partition(".")[0]
        raise MissingDependencyError(
            f"{purpose} needs {top}, which is not installed: {install_command(extra)}") from None
