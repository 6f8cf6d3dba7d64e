# Type stub of the compiled module tabsched._csv_cells (built from _csv_cells.pyx): its entry
# point takes bytes and numpy arrays and returns a count or a status, documented in the .pyx;
# type checkers see its names as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
