"""Build the Cython kernel; all metadata lives in pyproject.toml.

Set ``TABSCHED_DEBUG=1`` to build with bounds checks, wrap-around indexing and
initialisation checks turned back on (for a debug test run), and
``TABSCHED_NATIVE=1`` to compile for this machine's instruction set
(``-march=native``: wider vectors for the Monte Carlo draws; the module then runs
only on CPUs like this one). Either way the numbers are the same to the bit: no
FMA contraction, so float32 and float64 arithmetic rounds as IEEE 754 says.
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("TABSCHED_DEBUG", "") not in ("", "0")
NATIVE = os.environ.get("TABSCHED_NATIVE", "") not in ("", "0")

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "nonecheck": DEBUG,
}

extensions = [
    Extension(
        f"tabsched.{name}",
        [f"tabsched/{name}.pyx"],
        # no FMA contraction: the same float rounding, so the same Monte Carlo draws,
        # on every machine; no errno from sqrt, so its loops vectorise
        extra_compile_args=(["-O0", "-g"] if DEBUG else ["-O3"])
        + (["-march=native"] if NATIVE else [])
        + ["-ffp-contract=off", "-fno-math-errno"],
    )
    for name in ("_kernel", "_build")
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
