"""Schedule families: one module each, all behind ``generate(name, **params)``.

Every module in this package that does not start with ``_`` registers a family
when it is imported; the package imports it when its family is first asked for
by name (the module named after the family, ``-`` as ``_``, or the one
``_MODULE_OF`` names), and every one of them when the families are listed, so
adding a family is adding a module. A command that generates a few families
compiles only their modules.

>>> generate("gpipe", devices=2, microbatches=2).rows[1]
[None, Op(kind='F', stage=1, microbatch=0), Op(kind='F', stage=1, microbatch=1), Op(kind='B', stage=1, microbatch=0), Op(kind='B', stage=1, microbatch=1), None]
"""

import importlib
import pkgutil

from tabsched.schedules._registry import (Family, Parameter, check_parameters,
                                          describe_parameters, families, fixed_table, generate,
                                          get_family, register, set_loader)

__all__ = ["generate", "check_parameters", "fixed_table", "families", "get_family", "register",
           "Family", "Parameter", "describe_parameters"]

_FAMILY_MODULES = [module.name for module in pkgutil.iter_modules(__path__)
                   if not module.name.startswith("_")]
#: Families whose module is not named after them: where to look first (a name not
#: found where it points, or not listed, makes the package import every module).
_MODULE_OF = {"1f1b": "one_f_one_b", "interleaved-1f1b": "interleaved",
              "zb-h1": "zb_handcrafted", "zb-h2": "zb_handcrafted", "v-half": "v_shape",
              "v-min": "v_shape"}
_everything: list[bool] = []   # [True] once every family module is imported


def _load(name=None):
    """Import the family module ``name`` points at, or every one (``name`` None)."""
    if name is not None:
        module = _MODULE_OF.get(name, name.replace("-", "_"))
        if module in _FAMILY_MODULES:
            importlib.import_module(f"{__name__}.{module}")
            return
    if not _everything:
        for module in _FAMILY_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _everything.append(True)


set_loader(_load)
