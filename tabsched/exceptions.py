"""The errors tabsched raises.

Every message names the place of the problem (argument, file, device, slot,
token, key) and fits on one line; the CLI prints it as it is and exits 1.
"""

__all__ = [
    "TabschedError",
    "InvalidScheduleError",
    "DeadlockError",
    "MemoryBudgetError",
    "UnknownNameError",
    "InvalidParameterError",
    "MissingDependencyError",
    "OutputError",
]


class TabschedError(Exception):
    """Base class of every error tabsched raises on purpose."""


class InvalidScheduleError(TabschedError, ValueError):
    """A table, cell or schedule file breaks the data model (DESIGN.md)."""


class DeadlockError(TabschedError, ValueError):
    """The row orders contradict the dependencies: no execution exists.

    ``cycle`` holds the operations on one cycle as ``(op, device, slot)``.
    """

    def __init__(self, message, cycle=()):
        super().__init__(message)
        self.cycle = tuple(cycle)


class MemoryBudgetError(TabschedError, ValueError):
    """A device's memory cannot fit its budget."""


class UnknownNameError(TabschedError, ValueError):
    """A family, preset or option value that does not exist; the message lists valid ones."""


class InvalidParameterError(TabschedError, ValueError):
    """A parameter value or combination that a generator or cost model rejects."""


class MissingDependencyError(TabschedError, ImportError):
    """An optional dependency (an extra such as ``plot`` or ``dask``) is not installed;
    the message gives the command that installs it."""


class OutputError(TabschedError, OSError):
    """A file tabsched was asked to write cannot be written; the message names it.

    Raised before any work where the path can be checked up front (a folder that
    does not exist), else when the write fails, which leaves the previous file as
    it was (see :func:`tabsched.files.atomic_write`).
    """
