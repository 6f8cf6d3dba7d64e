"""Cost models: what each operation and transfer costs, and how memory is counted.

A cost model answers, vectorised over a table's operations:

* ``op_durations(table)`` -- the duration of every operation;
* ``transfer_costs(table, transfers)`` -- duration and bytes of every transfer;
* ``activation_sizes(table)`` -- the activation each operation's
  (stage, microbatch) holds from the start of its ``F`` to the end of its
  backward (``I`` releases ``input_grad_release`` of it, ``W`` the rest);
* ``transient_sizes(table)`` -- memory each operation holds only while it runs;
* ``persistent_memory(table)`` -- memory each device holds all the time.

The package holds the seam and what the models stand on:

* :mod:`~tabsched.costs.base` -- ``CostModel`` (the seam), ``UnitCosts`` (the
  idealized-table level) and ``StageCosts`` (profiled per-stage numbers);
* :mod:`~tabsched.costs.model_costs` -- ``ModelCosts``: a transformer on a
  system, in seconds and bytes;
* :mod:`~tabsched.costs.transformer` -- the transformer description (FLOPs,
  bytes moved, activations, working memory, parameters);
* :mod:`~tabsched.costs.kernels` -- the kernels of a layer, the embedding and the
  output layer per operation kind (FLOPs, bytes read and written, class);
* :mod:`~tabsched.costs.placement` -- where each parallel group of an execution
  (:mod:`tabsched.execution`) sits on the system's nodes, and so which network
  tier its collectives cross;
* :mod:`~tabsched.costs.system` -- the system description (a roofline per
  kernel, efficiency tables, wave quantization, links);
* :mod:`~tabsched.costs.gemm` -- measured GEMM efficiency by shape
  (``GemmTable``, a system's ``gemm_efficiency``) and the GEMM sweep CSV reader;
  :mod:`~tabsched.costs.system_import` turns a sweep into a system TOML;
* :mod:`~tabsched.costs.nccl` -- measured collective bus bandwidth by collective,
  tier, ranks and size (``CollectiveTables``, a system's ``collective_bandwidth``)
  and the reader of nccl-tests' output, which ``system_import`` turns into tables;
* :mod:`~tabsched.costs.collectives` -- ring all-reduce, reduce-scatter and
  all-gather, used by tensor and data parallelism and replica syncs alike, or a
  measured table's bus bandwidth where one covers a group's collective;
* :mod:`~tabsched.costs.units` -- quantities with units (``80GB``, ``2us``);
* ``_presets`` and ``presets/`` -- the built-in TOML presets (package data).
"""

from tabsched.costs.base import CostModel, StageCosts, UnitCosts
from tabsched.costs.gemm import GemmTable
from tabsched.costs.model_costs import ModelCosts
from tabsched.costs.nccl import CollectiveTables
from tabsched.costs.system import System, load_system, system_presets
from tabsched.costs.transformer import TransformerModel, load_model, model_presets
from tabsched.costs.units import format_quantity, parse_quantity
from tabsched.execution import Execution, Parallelism

__all__ = ["CostModel", "UnitCosts", "StageCosts", "ModelCosts", "Execution", "Parallelism",
           "TransformerModel",
           "load_model", "model_presets", "System", "load_system", "system_presets",
           "parse_quantity", "format_quantity", "GemmTable", "CollectiveTables"]
