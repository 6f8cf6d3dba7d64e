"""PyTorch pipelining's CSVs where they were first: a thin re-export, kept for existing imports.

The PyTorch formats live in :mod:`tabsched.formats`:
:mod:`tabsched.formats.pytorch_csv` (``TorchSchedule``, ``read_pytorch``,
``from_pytorch_csv``, compute_only written), :mod:`tabsched.formats.pytorch_comms`
(compute_comms: its SEND/RECV read into transfers, and written as PyTorch's runtime
lowers a schedule) and :mod:`tabsched.formats.pytorch_ranks` (what PyTorch can run,
and its stage -> rank maps). This module only imports their public names, so
``from tabsched.pytorch import to_compute_comms`` keeps working; new code imports
from those modules.
"""

from tabsched.formats.pytorch_comms import to_compute_comms
from tabsched.formats.pytorch_csv import (FORMATS, P2P_MODES, TorchSchedule, from_pytorch_csv,
                                          read_pytorch, to_compute_only, write_pytorch)
from tabsched.formats.pytorch_ranks import (STAGE_MAPS, describe_stage_map, pytorch_refusal,
                                            stage_map, torch_stage_to_device)

__all__ = ["TorchSchedule", "read_pytorch", "from_pytorch_csv", "to_compute_only",
           "to_compute_comms", "write_pytorch", "pytorch_refusal", "stage_map",
           "torch_stage_to_device", "describe_stage_map", "FORMATS", "P2P_MODES",
           "STAGE_MAPS"]
