"""Schedule families: one module each, all behind ``generate(name, **params)``.

Every module in this package that does not start with ``_`` is imported and
registers its family, so adding a family is adding a module.

>>> generate("gpipe", devices=2, microbatches=2).rows[1]
[None, Op(kind='F', stage=1, microbatch=0), Op(kind='F', stage=1, microbatch=1), Op(kind='B', stage=1, microbatch=0), Op(kind='B', stage=1, microbatch=1), None]
"""

import importlib
import pkgutil

from tabsched.schedules._registry import (Family, Parameter, describe_parameters, families,
                                          generate, get_family, register)

__all__ = ["generate", "families", "get_family", "register", "Family", "Parameter",
           "describe_parameters"]

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_module.name}")
