"""Systems: what a device computes, how fast its memory is, how devices talk.

A :class:`System` describes identical devices grouped into nodes of
``devices_per_node``: devices ``k*n .. k*n+n-1`` form node ``k``.

Compute (a roofline per kernel; Williams, Waterman and Patterson 2009)
    An operation is a list of kernels (:mod:`tabsched.costs.kernels`), each
    with its FLOPs, bytes moved and class. Its time is the sum over kernels of
    ``max(flops / (peak_flops * e_c), bytes / (memory_bandwidth * e_m)) +
    launch_latency``, where ``e_c`` is the matrix efficiency and ``e_m`` the
    memory (vector) efficiency. Vector kernels (element-wise work: norms,
    softmax, dropout, activations) count no FLOPs, as Narayanan et al. count
    none for them: they are timed by their bytes alone.
Efficiency as a function of kernel size
    ``compute_efficiency`` (matrix kernels) is a number or a table
    ``[[flops, e], ...]`` over a kernel's FLOPs; ``memory_efficiency`` (the
    bandwidth every kernel's memory traffic reaches) is a number or a table
    ``[[bytes, e], ...]`` over its bytes moved. Between the points of a table
    the efficiency is linear in ``log10(work)``; below the first point it is
    the first value, above the last the last. A table's work must grow and its
    efficiency must not fall from one entry to the next (a bigger kernel is
    never less efficient), and every value lies in (0, 1]. Matrix kernels may
    in addition follow a saturating curve in the tokens ``T`` of their
    operation, ``T / (T + half_efficiency_tokens)`` (Hockney's ``n_1/2``; the
    default, 0, is flat), so half a microbatch costs more than half.
Measured GEMM efficiency by shape (``gemm_efficiency``)
    A table of measured ``(m, n, k)`` points with its ``source``
    (:mod:`tabsched.costs.gemm`): a matrix kernel whose products the table
    covers takes the table's efficiency, read in log2 over the shape; every
    other kernel, and every kernel of a system without one, is priced by
    ``compute_efficiency`` as above.
Wave quantization of matrix kernels (``matrix_wave``)
    A GPU computes a matrix product in tiles of its output, one tile per
    streaming multiprocessor at a time; the last wave of tiles leaves SMs idle
    (NVIDIA, "Matrix Multiplication Background User's Guide", section 3.2). A
    product of ``n`` output elements fills ``w = n / matrix_wave`` waves
    (``matrix_wave`` = SMs x tile elements) and reaches ``w / ceil(w)`` of the
    tiled rate; tabsched takes the expectation of that over the fractional
    part, ``w / (w + 1/2)`` (half a wave lost on average), since libraries
    choose among tile shapes. Default 0: no quantization. The efficiency
    table's values then describe full waves.
Transfers (Hockney)
    ``time = latency + bytes / (bandwidth * efficiency)`` on the link between
    two devices: the intra-node link inside a node, the inter-node link
    between nodes; ``intra_node_efficiency`` and ``inter_node_efficiency``
    (default 1) are the parts of the line rate a transfer reaches (protocol
    overhead). Overrides make one link or one node slow: a ``link_overrides``
    entry sets bandwidth and/or latency of the link between two devices (both
    directions); a ``node_overrides`` entry sets them for every link into or
    out of a node's devices (a transfer between two overridden nodes takes the
    slower). Link overrides win over node overrides; the link's efficiency
    applies to an overridden bandwidth too.
Collectives
    Ring all-reduce, reduce-scatter and all-gather
    (:mod:`tabsched.costs.collectives`) on the slowest link of the ring, or,
    where ``collective_bandwidth`` has a measured table that covers one, at its
    bus bandwidth (:mod:`tabsched.costs.nccl`).
Compute beside a collective (``overlap_slowdown``)
    A collective that runs beside a kernel (Megatron-LM's tensor-parallel
    all-reduce beside the weight gradient) takes SMs and memory bandwidth from
    it: while the collective runs, the kernel progresses ``1 + s`` times slower
    (``s = overlap_slowdown``, default 0). With the collective's time ``C`` and
    the kernel's ``P`` alone, the pair lasts ``max(C, P + C * s / (1 + s))``: the
    kernel finishes under the collective, or the collective ends first and the
    kernel runs the rest of its work at full speed.
Contention
    ``none``: transfers never wait for each other; ``link``: each directed
    device pair is a FIFO; ``nic``: transfers between nodes also share the
    sending node's egress and the receiving node's ingress port (see
    :func:`tabsched.lower.lower`). ``blocking_sends``: a transfer keeps its
    sender's compute stream busy until it ends.

Every quantity may be given with a unit (``"450GB/s"``, ``"2us"``,
``"1PFLOP/s"``, ``"80GB"``, and ``"100GFLOP"`` or ``"64MB"`` for the work of
a table) or as a number in SI base units.

>>> system = load_system("mid_nw_mid_cp")
>>> system.peak_flops, system.intra_node_bandwidth, system.intra_node_latency
(1000000000000000.0, 50000000000.0, 5e-07)
>>> system.transfer_time(50e6, 0, 1)   # 500 ns + 50 MB / 50 GB/s
0.0010005
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tabsched.costs import _presets
from tabsched.costs.collectives import ring_time
from tabsched.costs.gemm import GemmTable, kernel_efficiency
from tabsched.costs.nccl import CollectiveTables
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import CONTENTION_MODES
from tabsched.table import MAX_ID

__all__ = ["System", "LinkOverride", "NodeOverride", "load_system", "system_presets"]

_REQUIRED = ("peak_flops", "memory_bandwidth", "devices_per_node", "intra_node_bandwidth",
             "intra_node_latency", "inter_node_bandwidth", "inter_node_latency")
_OPTIONAL = ("compute_efficiency", "half_efficiency_tokens", "memory_efficiency",
             "intra_node_efficiency", "inter_node_efficiency", "matrix_wave",
             "launch_latency", "memory_capacity", "contention", "blocking_sends",
             "link_overrides", "node_overrides", "name", "gemm_efficiency",
             "collective_bandwidth", "overlap_slowdown", "nics_per_node", "fp8_peak_flops",
             "fp8_compute_efficiency", "fp8_gemm_efficiency")
_QUANTITIES = {"peak_flops": "FLOP/s", "fp8_peak_flops": "FLOP/s", "memory_bandwidth": "B/s",
               "intra_node_bandwidth": "B/s", "inter_node_bandwidth": "B/s",
               "intra_node_latency": "s", "inter_node_latency": "s", "launch_latency": "s",
               "memory_capacity": "B"}


class LinkOverride(NamedTuple):
    """The link between ``devices[0]`` and ``devices[1]`` (both directions)."""

    devices: tuple
    bandwidth: float | None = None
    latency: float | None = None


class NodeOverride(NamedTuple):
    """Every link into or out of the devices of ``node``."""

    node: int
    bandwidth: float | None = None
    latency: float | None = None


# Sane ranges of what a file (or a caller) may say, in SI units. A value outside them is a
# typo or a unit slip (50 for 50 GB/s), never a device: 1e-300 B/s would make a transfer
# last 1e+307 s and the makespan overflow to inf. They are wide on purpose, orders of
# magnitude beyond every device built or announced, so that no real system is refused.
#: Bandwidth of a memory or a link, B/s: from 1 kB/s (a 9600-baud modem moves 1.2 kB/s)
#: to 1 PB/s (over 100x the 8 TB/s of a B200's HBM3e, 1000x NVLink 5's 900 GB/s each way).
BANDWIDTH_RANGE = (1e3, 1e15)
#: Peak FLOP/s of one device: from 1 MFLOP/s (an 8087 coprocessor did 0.05) to
#: 1 EFLOP/s (400x a GB200's 2.5 PFLOP/s of dense BF16).
PEAK_FLOPS_RANGE = (1e6, 1e18)
#: Latency of a transfer, s: a link answers in ns to us (InfiniBand about 1 us, a
#: transatlantic round trip 70 ms); one hour is no link.
LATENCY_RANGE = (0.0, 3600.0)
#: Fixed cost of one kernel, s: a CUDA launch costs about 1-5 us; one second is 10^5 that.
LAUNCH_LATENCY_RANGE = (0.0, 1.0)
#: A kernel at most 11x slower beside a collective (measured: 1.19x on average, 1.4x at most;
#: Lee et al. 2025, arXiv 2507.03114).
OVERLAP_SLOWDOWN_RANGE = (0.0, 10.0)
#: Memory of one device, B: from 1 kB to 1 PB (5,000x the 192 GB of a B200).
MEMORY_CAPACITY_RANGE = (1e3, 1e15)
#: An efficiency is a part of a peak: below 1e-6 the peak, not the efficiency, is wrong.
EFFICIENCY_RANGE = (1e-6, 1.0)
#: Work at the points of an efficiency table, FLOP or B: from 1 to 1e30 (a kernel of 1e30
#: FLOP runs 13 million years on a GB200).
WORK_RANGE = (1.0, 1e30)
#: Output elements of one wave of tiles: 132 SMs x 256x128 tiles is 4.3e6 on an H100;
#: 1e9 is 200x that. 0: no wave quantization; else at least 1 (one SM, a 1-element tile).
MATRIX_WAVE_RANGE = (0.0, 1e9)
#: Tokens at which a matrix kernel reaches half its efficiency: 0 (flat) to 1e9, past
#: any microbatch's tokens (8 samples of 128k tokens are 1e6).
HALF_EFFICIENCY_TOKENS_RANGE = (0.0, 1e9)
#: Devices in one node (one fast-link domain): an NVL72 rack has 72, NVL576 576.
MAX_DEVICES_PER_NODE = 65536
#: Network ports (NICs) of one node: a DGX has 8, an AWS p5 node 32 EFA adapters for its
#: 8 GPUs; 64 per device of the largest node is far past any machine built.
MAX_NICS_PER_NODE = 64 * MAX_DEVICES_PER_NODE
#: Characters of a name (a file's path by default: Linux's PATH_MAX is 4096) and of a
#: description (one line).
MAX_NAME = 4096
MAX_DESCRIPTION = 500


def _positive(name, value, unit, bounds=BANDWIDTH_RANGE):
    """A quantity > 0 in ``bounds`` (SI units), from a number or a text with ``unit``."""
    return _presets.number(name, value, *bounds, unit=unit, positive=True)


def _non_negative(name, value, unit=None, bounds=LATENCY_RANGE):
    """A quantity >= 0 in ``bounds``; without ``unit``, a plain number."""
    return _presets.number(name, value, *bounds, unit=unit)


def _fraction(name, value):
    """A number in (0, 1], at least ``EFFICIENCY_RANGE[0]``."""
    number = _presets.number(name, value, -math.inf, math.inf)
    if not 0 < number <= 1:
        raise InvalidParameterError(f"{name} must be in (0, 1], not "
                                    f"{_presets.shown_value(value)}")
    if number < EFFICIENCY_RANGE[0]:
        raise InvalidParameterError(f"{name} must be at least {EFFICIENCY_RANGE[0]:g} (a "
                                    f"smaller part of the peak means the peak is wrong), not "
                                    f"{_presets.shown_value(value)}")
    return number


def _efficiency(name, value, unit):
    """A number in (0, 1], or a table ``((work, efficiency), ...)`` monotone in work.

    Tables come from TOML as arrays of two-element arrays; ``work`` may carry
    ``unit`` (``"100GFLOP"``, ``"64MB"``). Returns a float or a tuple of pairs.
    """
    if not isinstance(value, (list, tuple)):
        return _fraction(name, value)
    if not value:
        raise InvalidParameterError(f"{name} must be a number or a table of [work, "
                                    f"efficiency] pairs, not an empty table")
    table = []
    for k, entry in enumerate(value):
        where = f"{name}[{k}]"
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise InvalidParameterError(f"{where} must be a pair [work, efficiency], "
                                        f"not {_presets.shown_value(entry)}")
        work = _positive(f"{where} work", entry[0], unit, WORK_RANGE)
        efficiency = _fraction(f"{where} efficiency", entry[1])
        if table and work <= table[-1][0]:
            raise InvalidParameterError(f"{where}: work {_presets.shown_value(entry[0])} does "
                                        f"not grow from the entry before "
                                        f"({table[-1][0]:g}); list the table in increasing "
                                        f"work")
        if table and efficiency < table[-1][1]:
            raise InvalidParameterError(f"{where}: efficiency {efficiency:g} falls below "
                                        f"{table[-1][1]:g} of the smaller kernel before it "
                                        f"(the table must not fall as work grows)")
        table.append((work, efficiency))
    return tuple(table)


def _interpolate(efficiency, work):
    """Efficiency (a number or a table) at ``work`` (array), linear in log10(work)."""
    work = np.asarray(work, dtype=np.float64)
    if not isinstance(efficiency, tuple):
        return np.full(work.shape, efficiency)
    points = np.log10([point for point, _ in efficiency])
    values = np.array([value for _, value in efficiency])
    return np.interp(np.log10(np.maximum(work, 1e-300)), points, values)


def _top(efficiency):
    """The efficiency of the largest kernels (a table's last value)."""
    return efficiency[-1][1] if isinstance(efficiency, tuple) else efficiency


_OVERRIDE_KEYS = {"link_overrides": "devices", "node_overrides": "node"}


def _overrides(key, value):
    """The entries of ``link_overrides`` or ``node_overrides``: an array of tables."""
    if not isinstance(value, (list, tuple)) or isinstance(value, (LinkOverride, NodeOverride)):
        raise InvalidParameterError(f"{key} must be an array of tables ([[{key}]] entries, "
                                    f"each with {_OVERRIDE_KEYS[key]} and a bandwidth and/or "
                                    f"latency), not {_presets.shown_value(value)}")
    return value


def _override_fields(name, entry, index_key):
    if not isinstance(entry, (dict, LinkOverride, NodeOverride)):
        raise InvalidParameterError(f"{name} must be a table with {index_key} and a bandwidth "
                                    f"and/or latency, not {_presets.shown_value(entry)}")
    entry = entry._asdict() if isinstance(entry, tuple) else dict(entry)
    known = {index_key, "bandwidth", "latency"}
    unknown = sorted(str(key) for key in set(entry) - known)
    if unknown:
        raise InvalidParameterError(f"{name}: unknown key {_presets.shown_value(unknown[0])}"
                                    f"{_presets.suggestion(unknown[0], known)} (expected "
                                    f"{index_key}, bandwidth, latency)")
    if index_key not in entry:
        raise InvalidParameterError(f"{name}: missing key {index_key!r}")
    bandwidth = entry.get("bandwidth")
    latency = entry.get("latency")
    if bandwidth is None and latency is None:
        raise InvalidParameterError(f"{name}: give a bandwidth, a latency or both")
    return (entry[index_key],
            None if bandwidth is None else _positive(f"{name}.bandwidth", bandwidth, "B/s"),
            None if latency is None else _non_negative(f"{name}.latency", latency, "s"))


def _device_index(name, value):
    """A device or node number: the table's ids are int32, so larger ones cannot exist."""
    return _presets.integer(name, value, 0, MAX_ID)


@dataclass(frozen=True)
class System:
    """Devices, nodes and links; see the module docstring for the cost formulas.

    Parameters
    ----------
    peak_flops : float or str
        Peak dense FLOP/s of one device (``"989TFLOP/s"``).
    memory_bandwidth : float or str
        Memory bandwidth of one device (``"3.35TB/s"``).
    devices_per_node : int
    intra_node_bandwidth, inter_node_bandwidth : float or str
        Bandwidth of one direction of a device-to-device link (``"450GB/s"``).
    intra_node_latency, inter_node_latency : float or str
        Latency of a transfer (``"2us"``).
    compute_efficiency : float or table
        Part of ``peak_flops`` a matrix kernel reaches (0 < e <= 1; default 1),
        or a table ``[[flops, e], ...]`` over the kernel's FLOPs.
    memory_efficiency : float or table
        Part of ``memory_bandwidth`` a kernel's memory traffic reaches, or a
        table ``[[bytes, e], ...]`` over its bytes moved (default 1).
    half_efficiency_tokens : float
        Tokens at which a matrix kernel's efficiency is half its table value
        (default 0: flat).
    launch_latency : float or str
        Fixed time added to every kernel (default 0).
    intra_node_efficiency, inter_node_efficiency : float
        Part of a link's bandwidth a transfer or collective reaches (default 1).
    matrix_wave : float
        Output elements one wave of tiles covers (SMs x tile); 0: no wave
        quantization (default).
    gemm_efficiency : GemmTable or dict, optional
        Measured GEMM efficiency over ``(m, n, k)`` with its ``source``
        (:mod:`tabsched.costs.gemm`; a TOML table ``[gemm_efficiency]``), for
        the one dtype ``peak_flops`` describes; the matrix kernels it covers
        take its value, the others ``compute_efficiency`` (default None: no
        table).
    collective_bandwidth : CollectiveTables or list of dicts, optional
        Measured bus bandwidth of collectives by collective, tier, group size
        and message size, each table with its ``source``
        (:mod:`tabsched.costs.nccl`; TOML ``[[collective_bandwidth]]``
        entries); the collectives they cover take their bandwidth, the others
        the ring on the tier's link (default None: no tables).
    overlap_slowdown : float
        How much slower a kernel runs while a collective runs beside it (0 to
        10; default 0; module docstring).
    nics_per_node : int, optional
        Network ports (NICs) of one node, each of ``inter_node_bandwidth``
        (default None: one per device, ``devices_per_node``). A collective
        whose group has several members on each node spreads its channels over
        the node's ports (:func:`tabsched.costs.collectives.group_time`).
    fp8_peak_flops : float or str, optional
        Dense FP8 tensor-core rate (None: no FP8, as on A100; an execution with
        ``fp8`` is refused on such a system).
    fp8_compute_efficiency : float, optional
        Part of ``fp8_peak_flops`` an FP8 product outside the FP8 table reaches
        (None: ``compute_efficiency``).
    fp8_gemm_efficiency : GemmTable or dict, optional
        Measured FP8 GEMM efficiency over ``(m, n, k)``, as ``gemm_efficiency``,
        relative to ``fp8_peak_flops`` (TOML ``[fp8_gemm_efficiency]``).
    memory_capacity : float or str, optional
        Memory of one device: every result says which devices go over it
        (``Result.capacity_violations``); ``--memory-budget capacity`` uses it.
    contention : {"none", "link", "nic"}
    blocking_sends : bool
    link_overrides, node_overrides : sequences of dicts or LinkOverride/NodeOverride
    name, description : str
    """

    peak_flops: float
    memory_bandwidth: float
    devices_per_node: int
    intra_node_bandwidth: float
    intra_node_latency: float
    inter_node_bandwidth: float
    inter_node_latency: float
    compute_efficiency: object = 1.0
    half_efficiency_tokens: float = 0.0
    memory_efficiency: object = 1.0
    intra_node_efficiency: float = 1.0
    inter_node_efficiency: float = 1.0
    matrix_wave: float = 0.0
    launch_latency: float = 0.0
    memory_capacity: float | None = None
    contention: str = "link"
    blocking_sends: bool = False
    link_overrides: tuple = field(default=())
    node_overrides: tuple = field(default=())
    name: str = "custom"
    description: str = ""
    gemm_efficiency: GemmTable | None = None
    collective_bandwidth: CollectiveTables | None = None
    overlap_slowdown: float = 0.0
    nics_per_node: int | None = None
    fp8_peak_flops: float | None = None
    fp8_compute_efficiency: float | None = None
    fp8_gemm_efficiency: GemmTable | None = None

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        set_("peak_flops", _positive("peak_flops", self.peak_flops, "FLOP/s", PEAK_FLOPS_RANGE))
        for key in ("memory_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth"):
            set_(key, _positive(key, getattr(self, key), "B/s"))
        for key in ("intra_node_latency", "inter_node_latency"):
            set_(key, _non_negative(key, getattr(self, key), "s"))
        set_("launch_latency", _non_negative("launch_latency", self.launch_latency, "s",
                                             LAUNCH_LATENCY_RANGE))
        set_("compute_efficiency", _efficiency("compute_efficiency", self.compute_efficiency,
                                               "FLOP"))
        set_("memory_efficiency", _efficiency("memory_efficiency", self.memory_efficiency, "B"))
        if self.gemm_efficiency is not None:
            set_("gemm_efficiency", GemmTable.from_value(self.gemm_efficiency, self.peak_flops))
        if self.collective_bandwidth is not None:
            set_("collective_bandwidth", CollectiveTables.from_value(self.collective_bandwidth))
        self._check_fp8(set_)
        for key in ("intra_node_efficiency", "inter_node_efficiency"):
            set_(key, _fraction(key, getattr(self, key)))
        set_("overlap_slowdown", _non_negative("overlap_slowdown", self.overlap_slowdown,
                                               bounds=OVERLAP_SLOWDOWN_RANGE))
        set_("matrix_wave", _non_negative("matrix_wave", self.matrix_wave,
                                          bounds=MATRIX_WAVE_RANGE))
        if 0 < self.matrix_wave < 1:   # 1e-313 would make every product infinitely many waves
            raise InvalidParameterError(f"matrix_wave must be 0 (no wave quantization) or at "
                                        f"least 1 output element, not "
                                        f"{_presets.shown_value(self.matrix_wave)}")
        set_("half_efficiency_tokens",
             _non_negative("half_efficiency_tokens", self.half_efficiency_tokens,
                           bounds=HALF_EFFICIENCY_TOKENS_RANGE))
        if self.memory_capacity is not None:
            set_("memory_capacity", _positive("memory_capacity", self.memory_capacity, "B",
                                              MEMORY_CAPACITY_RANGE))
        set_("devices_per_node", _presets.integer("devices_per_node", self.devices_per_node, 1,
                                                  MAX_DEVICES_PER_NODE))
        if self.nics_per_node is not None:
            set_("nics_per_node", _presets.integer("nics_per_node", self.nics_per_node, 1,
                                                   MAX_NICS_PER_NODE))
        if not isinstance(self.contention, str) or self.contention not in CONTENTION_MODES:
            raise InvalidParameterError(f"contention {_presets.shown_value(self.contention)} is "
                                        f"not one of {', '.join(CONTENTION_MODES)}")
        if not isinstance(self.blocking_sends, (bool, np.bool_)):
            raise InvalidParameterError(f"blocking_sends must be true or false, not "
                                        f"{_presets.shown_value(self.blocking_sends)}")
        set_("blocking_sends", bool(self.blocking_sends))
        _presets.text("name", self.name, MAX_NAME)
        _presets.text("description", self.description, MAX_DESCRIPTION)
        links = []
        for k, entry in enumerate(_overrides("link_overrides", self.link_overrides)):
            name = f"link_overrides[{k}]"
            devices, bandwidth, latency = _override_fields(name, entry, "devices")
            if not isinstance(devices, (list, tuple)) or len(devices) != 2:
                raise InvalidParameterError(f"{name}.devices must be two devices, "
                                            f"not {_presets.shown_value(devices)}")
            pair = tuple(_device_index(f"{name}.devices", device) for device in devices)
            if pair[0] == pair[1]:
                raise InvalidParameterError(f"{name}.devices must be two different devices, "
                                            f"not {list(pair)}")
            links.append(LinkOverride(pair, bandwidth, latency))
        set_("link_overrides", tuple(links))
        nodes = []
        for k, entry in enumerate(_overrides("node_overrides", self.node_overrides)):
            name = f"node_overrides[{k}]"
            node, bandwidth, latency = _override_fields(name, entry, "node")
            nodes.append(NodeOverride(_device_index(f"{name}.node", node), bandwidth, latency))
        set_("node_overrides", tuple(nodes))

    def _check_fp8(self, set_):
        """The FP8 keys: a rate, then what needs it (an efficiency, a table)."""
        if self.fp8_peak_flops is None:
            for key in ("fp8_compute_efficiency", "fp8_gemm_efficiency"):
                if getattr(self, key) is not None:
                    raise InvalidParameterError(f"{key} needs fp8_peak_flops (the FP8 rate "
                                                f"it is a part of)")
            return
        set_("fp8_peak_flops", _positive("fp8_peak_flops", self.fp8_peak_flops, "FLOP/s",
                                         PEAK_FLOPS_RANGE))
        if self.fp8_compute_efficiency is not None:
            set_("fp8_compute_efficiency", _fraction("fp8_compute_efficiency",
                                                     self.fp8_compute_efficiency))
        if self.fp8_gemm_efficiency is not None:
            set_("fp8_gemm_efficiency", GemmTable.from_value(
                self.fp8_gemm_efficiency, self.fp8_peak_flops, "fp8_gemm_efficiency"))

    def fp8_view(self):
        """This system as its FP8 products see it: ``fp8_peak_flops`` as the peak, the FP8
        table as the GEMM table and ``fp8_compute_efficiency`` (or ``compute_efficiency``)
        for the products it does not cover (:func:`tabsched.costs.model_work.kernel_seconds`);
        None without an FP8 rate."""
        if self.fp8_peak_flops is None:
            return None
        view = self.__dict__.get("_fp8_view")
        if view is None:
            efficiency = (self.compute_efficiency if self.fp8_compute_efficiency is None
                          else self.fp8_compute_efficiency)
            view = dataclasses.replace(self, peak_flops=self.fp8_peak_flops,
                                       compute_efficiency=efficiency,
                                       gemm_efficiency=self.fp8_gemm_efficiency,
                                       fp8_peak_flops=None, fp8_compute_efficiency=None,
                                       fp8_gemm_efficiency=None)
            object.__setattr__(self, "_fp8_view", view)
        return view

    def check_devices(self, num_devices):
        """Raise for an override that names a device or node a run of ``num_devices`` lacks.

        Overrides are read before the run is known; a cost model calls this
        when it meets the table, so that an override of a device the run does
        not have is an error naming it, not silently ignored. Devices
        ``k*n .. k*n+n-1`` form node ``k`` (``n = devices_per_node``).

        >>> system = System(1e15, 1e12, 4, 1e11, 0, 1e10, 0,
        ...                 link_overrides=[{"devices": [2, 9], "bandwidth": "1GB/s"}])
        >>> system.check_devices(8)
        Traceback (most recent call last):
        ...
        tabsched.exceptions.InvalidParameterError: system custom: link_overrides[0].devices names device 9, but the run has 8 devices (0..7)
        """
        for k, override in enumerate(self.link_overrides):
            missing = [device for device in override.devices if device >= num_devices]
            if missing:
                raise InvalidParameterError(
                    f"system {self.name}: link_overrides[{k}].devices names device "
                    f"{missing[0]}, but the run has {num_devices} devices "
                    f"(0..{num_devices - 1})")
        nodes = -(-num_devices // self.devices_per_node)
        for k, override in enumerate(self.node_overrides):
            if override.node >= nodes:
                raise InvalidParameterError(
                    f"system {self.name}: node_overrides[{k}].node names node {override.node}, "
                    f"but the run's {num_devices} devices fill {nodes} node"
                    f"{'s' if nodes != 1 else ''} of {self.devices_per_node} (0..{nodes - 1})")
        return self

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- compute
    def compute_efficiency_at(self, tokens, flops=None):
        """Matrix-kernel efficiency for kernels of ``flops`` in operations of ``tokens`` rows.

        The table value at ``flops`` (the largest kernels' value when ``flops``
        is None) times ``T / (T + half_efficiency_tokens)``.

        >>> System(1e15, 1e12, 8, 1e9, 0, 1e9, 0, compute_efficiency=0.5,
        ...        half_efficiency_tokens=1024).compute_efficiency_at([1024, 3072])
        array([0.25 , 0.375])
        >>> table = System(1e15, 1e12, 8, 1e9, 0, 1e9, 0,
        ...                compute_efficiency=[["1GFLOP", 0.4], ["100GFLOP", 0.8]])
        >>> table.compute_efficiency_at(1, flops=[1e8, 1e9, 1e10, 1e12]).tolist()
        [0.4, 0.4, 0.6000000000000001, 0.8]
        """
        tokens = np.asarray(tokens, dtype=np.float64)
        top = (np.full(tokens.shape, _top(self.compute_efficiency)) if flops is None
               else _interpolate(self.compute_efficiency, flops))
        if self.half_efficiency_tokens == 0:
            return top * np.ones(tokens.shape)
        return top * tokens / (tokens + self.half_efficiency_tokens)

    def memory_efficiency_at(self, nbytes):
        """Memory (vector) efficiency for kernels moving ``nbytes`` (array)."""
        return _interpolate(self.memory_efficiency, nbytes)

    def wave_efficiency(self, outputs):
        """``w / (w + 1/2)`` for products of ``outputs`` elements, ``w`` waves (1 without waves).

        >>> system = System(1e15, 1e12, 8, 1e9, 0, 1e9, 0, matrix_wave=1000)
        >>> system.wave_efficiency([500, 1000, 10000]).tolist()
        [0.5, 0.6666666666666666, 0.9523809523809523]
        """
        outputs = np.asarray(outputs, dtype=np.float64)
        if self.matrix_wave == 0:
            return np.ones(outputs.shape)
        waves = outputs / self.matrix_wave
        return np.divide(waves, waves + 0.5, out=np.ones(outputs.shape), where=waves > 0)

    def kernel_times(self, matrix, flops, nbytes, tokens, outputs=None, measured=None):
        """Roofline seconds of kernels, without launch latency (arrays broadcast together).

        ``matrix``: True for matrix kernels (``peak_flops`` at the matrix
        efficiency of their FLOPs and tokens, and of the waves their
        ``outputs`` elements fill), False for vector kernels (timed by their
        bytes alone); the memory term is ``nbytes / (memory_bandwidth *
        memory_efficiency(nbytes))`` for both. ``measured``: the GEMM table's
        efficiency of each kernel (:meth:`gemm_efficiency_of`), NaN where the
        table does not cover it; where it is a number it replaces the matrix
        efficiency, wave quantization included.
        """
        flops = np.asarray(flops, dtype=np.float64)
        nbytes = np.asarray(nbytes, dtype=np.float64)
        rate = self.peak_flops * self.compute_efficiency_at(tokens, flops)
        if outputs is not None:
            rate = rate * self.wave_efficiency(outputs)
        if measured is not None:
            rate = np.where(np.isnan(measured), rate, self.peak_flops * measured)
        compute = np.divide(flops, rate, out=np.zeros(np.broadcast(flops, rate).shape),
                            where=(flops > 0) & np.asarray(matrix))
        memory = nbytes / (self.memory_bandwidth * self.memory_efficiency_at(nbytes))
        return np.maximum(compute, memory)

    def gemm_efficiency_of(self, shapes):
        """The GEMM table's efficiency of kernels whose products have ``shapes``
        (``(kernels, slots, 4, sizes)``, :meth:`KernelTable.gemm_shapes`): ``(kernels,
        sizes)``, NaN where not covered; None for a system without a table."""
        if self.gemm_efficiency is None:
            return None
        return kernel_efficiency(self.gemm_efficiency, shapes)

    def compute_time(self, flops, nbytes, tokens):
        """Roofline time of single matrix kernels of ``flops`` and ``nbytes``, plus launch.

        >>> system = System(1e12, 1e11, 8, 1e9, 0, 1e9, 0, launch_latency=1e-6)
        >>> system.compute_time([1e9, 1e6], [1e6, 1e9], [1, 1]).tolist()   # compute, memory
        [0.001001, 0.010001]
        """
        return self.kernel_times(True, flops, nbytes, tokens) + self.launch_latency

    # ---------------------------------------------------------------- network
    def link_matrices(self, num_devices):
        """``(bandwidth, latency)``, each ``num_devices x num_devices``, for ``[src, dst]``.

        The bandwidth is what a transfer reaches: the link's (or its override's)
        times the intra- or inter-node efficiency.
        """
        device = np.arange(num_devices)
        node = device // self.devices_per_node
        same = node[:, None] == node[None, :]
        bandwidth = np.where(same, self.intra_node_bandwidth, self.inter_node_bandwidth)
        latency = np.where(same, self.intra_node_latency, self.inter_node_latency)
        efficiency = np.where(same, self.intra_node_efficiency, self.inter_node_efficiency)
        node_bandwidth = np.full(int(node.max()) + 1 if num_devices else 0, np.inf)
        node_latency = np.full(len(node_bandwidth), -np.inf)
        node_set = np.zeros(len(node_bandwidth), dtype=bool)
        node_latency_set = np.zeros(len(node_bandwidth), dtype=bool)
        for override in self.node_overrides:
            if override.node < len(node_bandwidth):
                if override.bandwidth is not None:
                    node_set[override.node] = True
                    node_bandwidth[override.node] = min(node_bandwidth[override.node],
                                                        override.bandwidth)
                if override.latency is not None:
                    node_latency_set[override.node] = True
                    node_latency[override.node] = max(node_latency[override.node],
                                                      override.latency)
        if node_set.any():
            touched = node_set[node][:, None] | node_set[node][None, :]
            slower = np.minimum(node_bandwidth[node][:, None], node_bandwidth[node][None, :])
            bandwidth = np.where(touched, slower, bandwidth)
        if node_latency_set.any():
            touched = node_latency_set[node][:, None] | node_latency_set[node][None, :]
            slower = np.maximum(node_latency[node][:, None], node_latency[node][None, :])
            latency = np.where(touched, slower, latency)
        for override in self.link_overrides:
            a, b = override.devices
            if a < num_devices and b < num_devices:
                if override.bandwidth is not None:
                    bandwidth[a, b] = bandwidth[b, a] = override.bandwidth
                if override.latency is not None:
                    latency[a, b] = latency[b, a] = override.latency
        return bandwidth * efficiency, latency

    def transfer_time(self, nbytes, src, dst):
        """Hockney time of one transfer of ``nbytes`` from ``src`` to ``dst``."""
        bandwidth, latency = self.link_matrices(max(src, dst) + 1)
        return float(latency[src, dst] + nbytes / bandwidth[src, dst])

    def all_reduce_time(self, nbytes, devices, links=None):
        """Ring all-reduce of ``nbytes`` among ``devices`` (sorted, in ring order).

        ``2*(n-1)`` steps, each moving ``nbytes/n`` over every link of the ring at
        once, so each step takes the slowest link's Hockney time
        (:func:`tabsched.costs.collectives.ring_time`). One device needs no sync: 0.
        ``links``: ``link_matrices(n)`` for any ``n`` beyond the devices, if at hand.

        >>> load_system("mid_nw_mid_cp").all_reduce_time(4e9, [0, 1])   # 2*(500ns + 2GB/50GB/s)
        0.080001
        """
        devices = sorted(int(device) for device in devices)
        if len(devices) < 2:
            return 0.0
        bandwidth, latency = self.link_matrices(devices[-1] + 1) if links is None else links
        src = np.array(devices)
        dst = np.concatenate([src[1:], src[:1]])     # each device sends to the next
        return self.ring_time("all_reduce", nbytes, len(devices),
                              float(np.min(bandwidth[src, dst])), float(np.max(latency[src, dst])))

    def tier_link(self, tier):
        """``(bandwidth, latency)`` a collective reaches on the slowest link of a tier.

        ``"node"``: the group's devices share a node (NVLink); ``"network"``: one
        network port between nodes (how a group spreads over a node's ports is
        :func:`tabsched.costs.collectives.group_time`'s).
        """
        if tier == "node":
            return self.intra_node_bandwidth * self.intra_node_efficiency, self.intra_node_latency
        if tier == "network":
            return self.inter_node_bandwidth * self.inter_node_efficiency, self.inter_node_latency
        raise InvalidParameterError(f"tier {tier!r} is not one of node, network")

    @property
    def nics_per_device(self) -> float:
        """Network ports per device: ``nics_per_node / devices_per_node`` (1 by default)."""
        if self.nics_per_node is None:
            return 1.0
        return self.nics_per_node / self.devices_per_node

    @staticmethod
    def ring_time(collective, nbytes, ranks, bandwidth, latency):
        """See :func:`tabsched.costs.collectives.ring_time`."""
        return ring_time(collective, nbytes, ranks, bandwidth, latency)

    def summary(self):
        """Key numbers, JSON-ready (SI units)."""
        def plain(value):
            return [list(pair) for pair in value] if isinstance(value, tuple) else value
        return {"name": self.name, "peak_flops": self.peak_flops,
                "compute_efficiency": plain(self.compute_efficiency),
                "memory_bandwidth": self.memory_bandwidth,
                "memory_efficiency": plain(self.memory_efficiency),
                "memory_capacity": self.memory_capacity,
                "devices_per_node": self.devices_per_node,
                "nics_per_node": self.nics_per_node,
                "intra_node_bandwidth": self.intra_node_bandwidth,
                "intra_node_latency": self.intra_node_latency,
                "inter_node_bandwidth": self.inter_node_bandwidth,
                "inter_node_latency": self.inter_node_latency,
                "matrix_wave": self.matrix_wave,
                "intra_node_efficiency": self.intra_node_efficiency,
                "inter_node_efficiency": self.inter_node_efficiency,
                "launch_latency": self.launch_latency,
                "overlap_slowdown": self.overlap_slowdown,
                "contention": self.contention, "description": self.description,
                "gemm_efficiency": (None if self.gemm_efficiency is None
                                    else self.gemm_efficiency.to_value()),
                "collective_bandwidth": (None if self.collective_bandwidth is None
                                         else self.collective_bandwidth.to_value()),
                "fp8_peak_flops": self.fp8_peak_flops,
                "fp8_compute_efficiency": self.fp8_compute_efficiency,
                "fp8_gemm_efficiency": (None if self.fp8_gemm_efficiency is None
                                        else self.fp8_gemm_efficiency.to_value())}



def load_system(reference: str | os.PathLike[str] | System) -> System:
    """A :class:`System` from a preset name or a TOML file with the same keys.

    Required keys: ``peak_flops``, ``memory_bandwidth``, ``devices_per_node``,
    ``intra_node_bandwidth``, ``intra_node_latency``, ``inter_node_bandwidth``,
    ``inter_node_latency``; optional: ``compute_efficiency`` and
    ``memory_efficiency`` (numbers or tables),
    ``half_efficiency_tokens``, ``matrix_wave``, ``intra_node_efficiency``,
    ``inter_node_efficiency``, ``launch_latency``, ``overlap_slowdown``, ``nics_per_node``,
    ``memory_capacity``, ``contention``, ``blocking_sends``, ``link_overrides``
    and ``node_overrides`` (arrays of tables), ``gemm_efficiency`` (a table: see
    :mod:`tabsched.costs.gemm`), ``collective_bandwidth`` (an array of tables: see
    :mod:`tabsched.costs.nccl`), ``description``. A file with ``based_on = "PRESET"`` is
    that preset with the file's keys changed (none required) and the measured tables it
    lists in ``without`` dropped.

    >>> load_system("dgx-h100").devices_per_node
    8
    """
    if isinstance(reference, System):
        return reference
    data, source = _presets.load(reference, "system")
    if "based_on" not in data:
        return _presets.build(System, reference, "system", _REQUIRED, _OPTIONAL)
    return _derived(data, source)


#: The tables a derived system may drop (``without``): measurements of the base's hardware.
_DROPPABLE = ("gemm_efficiency", "fp8_gemm_efficiency", "collective_bandwidth",
              "link_overrides", "node_overrides")


def _derived(data, source):
    """A system ``based_on`` a preset: the preset with the file's keys changed and the
    tables named in ``without`` dropped (``hgx-h800``: the H100's compute and GEMM table,
    its own links, not the H100's NVLink measurements)."""
    _presets.check_keys(data, (), _REQUIRED + _OPTIONAL + ("based_on", "without"), source)
    base_name = _presets.text("based_on", data["based_on"], 200)
    presets = _presets.preset_index()["system"]
    if base_name not in presets:
        raise InvalidParameterError(f"{source}: based_on {_presets.shown_value(base_name)} is "
                                    f"not a system preset; valid: {', '.join(presets)}")
    if "based_on" in _presets.load(base_name, "system")[0]:
        raise InvalidParameterError(f"{source}: based_on {base_name!r} is itself derived; "
                                    f"name the preset it is based on")
    without = data.get("without", [])
    if not isinstance(without, list) or any(item not in _DROPPABLE for item in without):
        raise InvalidParameterError(f"{source}: without must list some of "
                                    f"{', '.join(_DROPPABLE)}, not "
                                    f"{_presets.shown_value(without)}")
    fields = {key: value for key, value in data.items()
              if key not in ("kind", "based_on", "without")}
    fields.setdefault("name", source)
    fields.update({key: None for key in without})
    try:
        return load_system(base_name).replace(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{source}: {error}") from None


def system_presets() -> dict[str, System]:
    """The system presets shipped with tabsched, ``{name: System}``."""
    return {name: load_system(name) for name in _presets.preset_index()["system"]}
