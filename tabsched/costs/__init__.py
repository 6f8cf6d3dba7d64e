"""Cost models: what each operation and transfer costs, and how memory is counted.

A cost model answers, vectorised over a table's operations:

* ``op_durations(table)`` -- the duration of every operation;
* ``transfer_costs(table, transfers)`` -- duration and bytes of every transfer;
* ``activation_sizes(table)`` -- the activation each operation's
  (stage, microbatch) holds from the start of its ``F`` to the end of its
  backward (``I`` releases ``input_grad_release`` of it, ``W`` the rest);
* ``persistent_memory(table)`` -- memory each device holds all the time.

The package holds the seam and what the models stand on:

* :mod:`~tabsched.costs.base` -- ``CostModel`` (the seam), ``UnitCosts`` (the
  idealized-table level) and ``StageCosts`` (profiled per-stage numbers);
* :mod:`~tabsched.costs.model_costs` -- ``ModelCosts``: a transformer on a
  system, in seconds and bytes;
* :mod:`~tabsched.costs.transformer` -- the transformer description (FLOPs,
  bytes moved, activations, parameters);
* :mod:`~tabsched.costs.system` -- the system description (roofline,
  efficiency, links, collectives);
* :mod:`~tabsched.costs.units` -- quantities with units (``80GB``, ``2us``);
* ``_presets`` and ``presets/`` -- the built-in TOML presets (package data).
"""

from tabsched.costs.base import CostModel, StageCosts, UnitCosts
from tabsched.costs.model_costs import ModelCosts
from tabsched.costs.system import System, load_system, system_presets
from tabsched.costs.transformer import TransformerModel, load_model, model_presets
from tabsched.costs.units import format_quantity, parse_quantity

__all__ = ["CostModel", "UnitCosts", "StageCosts", "ModelCosts", "TransformerModel",
           "load_model", "model_presets", "System", "load_system", "system_presets",
           "parse_quantity", "format_quantity"]
