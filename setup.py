"""Build the Cython kernel; all metadata lives in pyproject.toml.

Set ``TABSCHED_DEBUG=1`` to build with bounds checks, wrap-around indexing and
initialisation checks turned back on (for a debug test run).
"""
import os

from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("TABSCHED_DEBUG", "") not in ("", "0")

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
        + ["-ffp-contract=off", "-fno-math-errno"],
    )
    for name in ("_kernel", "_build")
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
