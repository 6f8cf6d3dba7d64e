"""Systems: what a device computes, how fast its memory is, how devices talk.

A :class:`System` describes identical devices grouped into nodes of
``devices_per_node``: devices ``k*n .. k*n+n-1`` form node ``k``.

Compute (a roofline per operation)
    ``time = max(flops / (peak_flops * e(T)), bytes / (memory_bandwidth *
    memory_efficiency)) + launch_latency``, where ``T`` is the number of tokens
    the operation works on (the row count of its matrix products) and the
    compute efficiency follows a saturating curve,
    ``e(T) = compute_efficiency * T / (T + half_efficiency_tokens)``: the
    efficiency is half its maximum at ``half_efficiency_tokens`` tokens and
    approaches ``compute_efficiency`` for large products. The default,
    ``half_efficiency_tokens = 0``, is flat: ``e = compute_efficiency``. It is
    Hockney's ``n_1/2`` for matrix products: each operation behaves as if it
    did ``half_efficiency_tokens`` more tokens of work. A microbatch of half
    the samples therefore costs what the roofline says -- more than half when
    the curve is not flat, the operation is memory-bound (the weights are read
    whatever the batch), or the launch latency counts.
Transfers (Hockney)
    ``time = latency + bytes / bandwidth`` on the link between two devices:
    the intra-node link inside a node, the inter-node link between nodes.
    Overrides make one link or one node slow: a ``link_overrides`` entry sets
    bandwidth and/or latency of the link between two devices (both
    directions); a ``node_overrides`` entry sets them for every link into or
    out of a node's devices (a transfer between two overridden nodes takes the
    slower). Link overrides win over node overrides.
Contention
    ``none``: transfers never wait for each other; ``link``: each directed
    device pair is a FIFO; ``nic``: transfers between nodes also share the
    sending node's egress and the receiving node's ingress port (see
    :func:`tabsched.lower.lower`). ``blocking_sends``: a transfer keeps its
    sender's compute stream busy until it ends.
Gradient sync (ring all-reduce) and optimizer step: see
    :meth:`System.all_reduce_time` and :meth:`System.compute_time`.

Every quantity may be given with a unit (``"450GB/s"``, ``"2us"``,
``"1PFLOP/s"``, ``"80GB"``) or as a number in SI base units.

>>> system = load_system("mid_nw_mid_cp")
>>> system.peak_flops, system.intra_node_bandwidth, system.intra_node_latency
(1000000000000000.0, 50000000000.0, 5e-07)
>>> system.transfer_time(50e6, 0, 1)   # 500 ns + 50 MB / 50 GB/s
0.0010005
"""

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tabsched.costs import _presets
from tabsched.exceptions import InvalidParameterError
from tabsched.lower import CONTENTION_MODES
from tabsched.costs.units import parse_quantity

__all__ = ["System", "LinkOverride", "NodeOverride", "load_system", "system_presets"]

_REQUIRED = ("peak_flops", "memory_bandwidth", "devices_per_node", "intra_node_bandwidth",
             "intra_node_latency", "inter_node_bandwidth", "inter_node_latency")
_OPTIONAL = ("compute_efficiency", "half_efficiency_tokens", "memory_efficiency",
             "launch_latency", "memory_capacity", "contention", "blocking_sends",
             "link_overrides", "node_overrides", "name")
_QUANTITIES = {"peak_flops": "FLOP/s", "memory_bandwidth": "B/s",
               "intra_node_bandwidth": "B/s", "inter_node_bandwidth": "B/s",
               "intra_node_latency": "s", "inter_node_latency": "s", "launch_latency": "s",
               "memory_capacity": "B"}


class LinkOverride(NamedTuple):
    """The link between ``devices[0]`` and ``devices[1]`` (both directions)."""

    devices: tuple
    bandwidth: float = None
    latency: float = None


class NodeOverride(NamedTuple):
    """Every link into or out of the devices of ``node``."""

    node: int
    bandwidth: float = None
    latency: float = None


def _positive(name, value, unit):
    number = parse_quantity(value, unit, name=name)
    if not np.isfinite(number) or number <= 0:
        raise InvalidParameterError(f"{name} must be > 0, not {value!r}")
    return number


def _non_negative(name, value, unit=None):
    if unit is None:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise InvalidParameterError(f"{name} must be a number, not {value!r}")
        number = float(value)
    else:
        number = parse_quantity(value, unit, name=name)
    if not np.isfinite(number) or number < 0:
        raise InvalidParameterError(f"{name} must be >= 0, not {value!r}")
    return number


def _override_fields(name, entry, index_key):
    if not isinstance(entry, (dict, LinkOverride, NodeOverride)):
        raise InvalidParameterError(f"{name} entries must be tables, not {entry!r}")
    entry = entry._asdict() if isinstance(entry, tuple) else dict(entry)
    unknown = sorted(set(entry) - {index_key, "bandwidth", "latency"})
    if unknown:
        raise InvalidParameterError(f"{name}: unknown key {unknown[0]!r} (expected "
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
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise InvalidParameterError(f"{name} must be an integer >= 0, not {value!r}")
    return int(value)


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
    compute_efficiency, memory_efficiency : float
        Parts of the peaks an operation reaches (0 < e <= 1; default 1).
    half_efficiency_tokens : float
        Tokens at which the compute efficiency is half its maximum (default 0: flat).
    launch_latency : float or str
        Fixed time added to every operation (default 0).
    memory_capacity : float or str, optional
        Memory of one device (informational; ``--memory-budget capacity`` uses it).
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
    compute_efficiency: float = 1.0
    half_efficiency_tokens: float = 0.0
    memory_efficiency: float = 1.0
    launch_latency: float = 0.0
    memory_capacity: float = None
    contention: str = "link"
    blocking_sends: bool = False
    link_overrides: tuple = field(default=())
    node_overrides: tuple = field(default=())
    name: str = "custom"
    description: str = ""

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        for key in ("peak_flops", "memory_bandwidth", "intra_node_bandwidth",
                    "inter_node_bandwidth"):
            set_(key, _positive(key, getattr(self, key), _QUANTITIES[key]))
        for key in ("intra_node_latency", "inter_node_latency", "launch_latency"):
            set_(key, _non_negative(key, getattr(self, key), "s"))
        for key in ("compute_efficiency", "memory_efficiency"):
            value = getattr(self, key)
            number = _non_negative(key, value)
            if number == 0 or number > 1:
                raise InvalidParameterError(f"{key} must be in (0, 1], not {value!r}")
            set_(key, number)
        set_("half_efficiency_tokens",
             _non_negative("half_efficiency_tokens", self.half_efficiency_tokens))
        if self.memory_capacity is not None:
            set_("memory_capacity", _positive("memory_capacity", self.memory_capacity, "B"))
        value = self.devices_per_node
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise InvalidParameterError(f"devices_per_node must be a positive integer, "
                                        f"not {value!r}")
        set_("devices_per_node", int(value))
        if self.contention not in CONTENTION_MODES:
            raise InvalidParameterError(f"contention {self.contention!r} is not one of "
                                        f"{', '.join(CONTENTION_MODES)}")
        if not isinstance(self.blocking_sends, (bool, np.bool_)):
            raise InvalidParameterError(f"blocking_sends must be true or false, not "
                                        f"{self.blocking_sends!r}")
        set_("blocking_sends", bool(self.blocking_sends))
        links = []
        for k, entry in enumerate(self.link_overrides):
            name = f"link_overrides[{k}]"
            devices, bandwidth, latency = _override_fields(name, entry, "devices")
            if (isinstance(devices, (str, bytes)) or not hasattr(devices, "__len__")
                    or len(devices) != 2):
                raise InvalidParameterError(f"{name}.devices must be two devices, "
                                            f"not {devices!r}")
            pair = tuple(_device_index(f"{name}.devices", device) for device in devices)
            if pair[0] == pair[1]:
                raise InvalidParameterError(f"{name}.devices must be two different devices, "
                                            f"not {list(pair)}")
            links.append(LinkOverride(pair, bandwidth, latency))
        set_("link_overrides", tuple(links))
        nodes = []
        for k, entry in enumerate(self.node_overrides):
            name = f"node_overrides[{k}]"
            node, bandwidth, latency = _override_fields(name, entry, "node")
            nodes.append(NodeOverride(_device_index(f"{name}.node", node), bandwidth, latency))
        set_("node_overrides", tuple(nodes))

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ---------------------------------------------------------------- compute
    def compute_efficiency_at(self, tokens):
        """``e(T)``: the compute efficiency for products of ``tokens`` rows.

        >>> System(1e15, 1e12, 8, 1e9, 0, 1e9, 0, compute_efficiency=0.5,
        ...        half_efficiency_tokens=1024).compute_efficiency_at([1024, 3072])
        array([0.25 , 0.375])
        """
        tokens = np.asarray(tokens, dtype=np.float64)
        if self.half_efficiency_tokens == 0:
            return np.full(tokens.shape, self.compute_efficiency)
        return self.compute_efficiency * tokens / (tokens + self.half_efficiency_tokens)

    def compute_time(self, flops, nbytes, tokens):
        """Roofline time of operations of ``flops`` and ``nbytes`` over ``tokens`` (arrays)."""
        flops = np.asarray(flops, dtype=np.float64)
        compute = np.divide(flops, self.peak_flops * self.compute_efficiency_at(tokens),
                            out=np.zeros(np.broadcast(flops, np.asarray(tokens)).shape),
                            where=flops > 0)
        memory = np.asarray(nbytes, dtype=np.float64) / (self.memory_bandwidth
                                                         * self.memory_efficiency)
        return np.maximum(compute, memory) + self.launch_latency

    # ---------------------------------------------------------------- network
    def link_matrices(self, num_devices):
        """``(bandwidth, latency)``, each ``num_devices x num_devices``, for ``[src, dst]``."""
        device = np.arange(num_devices)
        node = device // self.devices_per_node
        same = node[:, None] == node[None, :]
        bandwidth = np.where(same, self.intra_node_bandwidth, self.inter_node_bandwidth)
        latency = np.where(same, self.intra_node_latency, self.inter_node_latency)
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
        return bandwidth, latency

    def transfer_time(self, nbytes, src, dst):
        """Hockney time of one transfer of ``nbytes`` from ``src`` to ``dst``."""
        bandwidth, latency = self.link_matrices(max(src, dst) + 1)
        return float(latency[src, dst] + nbytes / bandwidth[src, dst])

    def all_reduce_time(self, nbytes, devices):
        """Ring all-reduce of ``nbytes`` among ``devices`` (sorted, in ring order).

        ``2*(n-1)`` steps, each moving ``nbytes/n`` over every link of the ring at
        once, so each step takes the slowest link's Hockney time (Patarasuk and
        Yuan 2009; Thakur et al. 2005): ``2*(n-1)*(latency + nbytes/(n*bandwidth))``.
        One device needs no sync: 0.

        >>> load_system("mid_nw_mid_cp").all_reduce_time(4e9, [0, 1])   # 2*(500ns + 2GB/50GB/s)
        0.080001
        """
        devices = sorted(int(device) for device in devices)
        n = len(devices)
        if n < 2:
            return 0.0
        bandwidth, latency = self.link_matrices(devices[-1] + 1)
        src = np.array(devices)
        dst = np.roll(src, -1)
        step = np.max(latency[src, dst] + (nbytes / n) / bandwidth[src, dst])
        return float(2 * (n - 1) * step)

    def summary(self):
        """Key numbers, JSON-ready (SI units)."""
        return {"name": self.name, "peak_flops": self.peak_flops,
                "compute_efficiency": self.compute_efficiency,
                "memory_bandwidth": self.memory_bandwidth,
                "memory_capacity": self.memory_capacity,
                "devices_per_node": self.devices_per_node,
                "intra_node_bandwidth": self.intra_node_bandwidth,
                "intra_node_latency": self.intra_node_latency,
                "inter_node_bandwidth": self.inter_node_bandwidth,
                "inter_node_latency": self.inter_node_latency,
                "contention": self.contention, "description": self.description}


def _from_data(data, source):
    _presets.check_keys(data, _REQUIRED, _OPTIONAL, source)
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", source)
    try:
        return System(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{source}: {error}") from None


def load_system(reference):
    """A :class:`System` from a preset name or a TOML file with the same keys.

    Required keys: ``peak_flops``, ``memory_bandwidth``, ``devices_per_node``,
    ``intra_node_bandwidth``, ``intra_node_latency``, ``inter_node_bandwidth``,
    ``inter_node_latency``; optional: ``compute_efficiency``,
    ``half_efficiency_tokens``, ``memory_efficiency``, ``launch_latency``,
    ``memory_capacity``, ``contention``, ``blocking_sends``, ``link_overrides``
    and ``node_overrides`` (arrays of tables), ``description``.

    >>> load_system("dgx-h100").devices_per_node
    8
    """
    if isinstance(reference, System):
        return reference
    data, source = _presets.load(reference, "system")
    return _from_data(data, source)


def system_presets():
    """The system presets shipped with tabsched, ``{name: System}``."""
    return {name: load_system(name) for name in _presets.preset_index()["system"]}
