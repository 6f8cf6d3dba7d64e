"""Build the Cython kernel; all metadata lives in pyproject.toml.

Set ``TABSCHED_DEBUG=1`` to build with bounds checks, wrap-around indexing and
initialisation checks turned back on (for a debug test run), and
``TABSCHED_NATIVE=1`` to compile for this machine's instruction set
(``-march=native``; the modules then run only on CPUs like this one). On x86-64 the
Monte Carlo pass is built a second time for AVX2 (``_kernel_avx2``), which ``_kernel``
runs on CPUs that have it. Either way the numbers are the same to the bit: no
FMA contraction, so float32 and float64 arithmetic rounds as IEEE 754 says.
"""
import os
import platform
import sys

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

# no FMA contraction: the same float rounding, so the same Monte Carlo draws, on every
# machine; no errno from sqrt, so its loops vectorise
FLAGS = (["-O0", "-g"] if DEBUG else ["-O3"]) + (["-march=native"] if NATIVE else []) + [
    "-ffp-contract=off", "-fno-math-errno"]

extensions = [
    Extension("tabsched._kernel", ["tabsched/_kernel.pyx"], extra_compile_args=FLAGS,
              depends=["tabsched/_montecarlo.pxi", "tabsched/_types.pxd"]),
    Extension("tabsched._build", ["tabsched/_build.pyx"], extra_compile_args=FLAGS,
              depends=["tabsched/_types.pxd"]),
    Extension("tabsched._csv_cells", ["tabsched/_csv_cells.pyx"], extra_compile_args=FLAGS,
              depends=["tabsched/_types.pxd"]),
]

# The Monte Carlo pass again, for AVX2 (8 float32 lanes where the x86-64 baseline has
# 4): _kernel picks it at run time on a CPU that has AVX2. GCC and Clang only (the flag
# and the CPU check are theirs); elsewhere the baseline build serves alone.
if platform.machine().lower() in ("x86_64", "amd64") and sys.platform != "win32":
    extensions.append(Extension("tabsched._kernel_avx2", ["tabsched/_kernel_avx2.pyx"],
                                depends=["tabsched/_montecarlo.pxi", "tabsched/_types.pxd"],
                                extra_compile_args=FLAGS + ["-mavx2"]))

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
