# Type stub of the compiled module tabsched._build (built from _build.pyx): its entry points
# take numpy arrays and return status codes, documented in the .pyx; type checkers see
# its names as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
