# Type stub of the compiled module tabsched._kernel_avx2 (built from _kernel_avx2.pyx): its entry points
# take numpy arrays and return status codes, documented in the .pyx; type checkers see
# its names as Any.
from typing import Any

def __getattr__(name: str) -> Any: ...
