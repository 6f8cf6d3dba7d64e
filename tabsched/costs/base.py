"""Cost models: what each operation and transfer costs, and how memory is counted.

A cost model prices; it does not compose. It answers, vectorised over a table's
operations:

* ``op_durations(table)`` -- the duration of every operation;
* ``transfer_costs(table, transfers)`` -- duration and bytes of every transfer
  (``transfer_parts``: its latency and its volume part);
* ``node_prices(lowered, kind)`` -- the duration of every node of an extra kind
  (:mod:`tabsched.nodes`: a gradient sync per synced stage, an optimizer step per
  device, and the kinds to come; 0 unless the model prices them);
* ``activation_sizes(table)`` -- the activation each operation's
  (stage, microbatch) holds from the start of its ``F`` to the end of its
  backward (``I`` releases ``input_grad_release`` of it, ``W`` the rest);
* ``transient_sizes(table)`` -- memory each operation holds only while it runs
  (working memory; zeros unless the model states it);
* ``persistent_memory(table)`` -- memory each device holds all the time.

and states ``memory_capacity``, the memory of one device in ``memory_unit``
(``None`` where the costs know no device: slot lengths do not).

and holds the :class:`~tabsched.execution.Execution` it prices (``execution``:
``contention``, ``devices_per_node``, ``p2p`` (or ``blocking_sends``), ``grad_sync`` and
``optimizer_step`` are read from it), and ``overlap``, the factor applied to the
summed parts of an overlapped cell (1.0: no overlap gain).

The lowering's composer (:mod:`tabsched.compose`) turns those prices into node
durations: ``node_durations(lowered)`` is that composition of this model's prices,
``stacked_node_durations(lowered, cost_models)`` of many models' at once
(``stacked_prices``, which a subclass may compute together, then one composition).

Cost models are frozen: once built, assigning to one raises
(``dataclasses.FrozenInstanceError``, an ``AttributeError``), so that nothing it
computed and remembered can go stale. ``with_execution(execution)`` gives the
same costs run another way.

``UnitCosts`` is the idealized-table level; ``StageCosts`` takes profiled
per-stage numbers; ``ModelCosts`` (:mod:`tabsched.costs.model_costs`) derives
everything from a transformer (:mod:`tabsched.costs.transformer`) on a system
(:mod:`tabsched.costs.system`), in seconds and bytes.
"""

import copy
import dataclasses
import functools
import numbers

import numpy as np

from tabsched.exceptions import InvalidParameterError
from tabsched.compose import Prices
from tabsched.execution import Execution
from tabsched.nodes import OPTIMIZER, SYNC

__all__ = ["CostModel", "UnitCosts", "StageCosts"]


def _non_negative(name, value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a number, not {value!r}") from None
    if not np.isfinite(value) or value < 0:
        raise InvalidParameterError(f"{name} must be finite and >= 0, not {value}")
    return value


def _fraction(name, value):
    value = _non_negative(name, value)
    if value > 1:
        raise InvalidParameterError(f"{name} must be between 0 and 1, not {value}")
    return value


def refuse_slices(costs, table):
    """Refuse a table of sequence slices under a cost model that has no sequence.

    A slice's price depends on its tokens and on the keys its causal attention meets
    (:meth:`tabsched.costs.ModelCosts.slice_view`); slot lengths and per-stage seconds
    know neither, so they would price every slice as a whole microbatch.
    """
    if table.sequence_slices is not None:
        raise InvalidParameterError(
            f"sequence slices need a model with a sequence (ModelCosts: --model and "
            f"--system); {type(costs).__name__} has none")


def _per_stage(name, value):
    """A scalar or a 1-D array of non-negative numbers (checked against stages later)."""
    if isinstance(value, numbers.Number):
        return _non_negative(name, value)
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != 1 or len(array) == 0:
        raise InvalidParameterError(f"{name} must be a number or a list with one per stage")
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if len(bad):
        raise InvalidParameterError(f"{name}[{bad[0]}] must be finite and >= 0, "
                                    f"not {array[bad[0]]}")
    array.flags.writeable = False
    return array


def _stage_values(name, value, table):
    if isinstance(value, float):
        return np.full(table.num_stages, value)
    if len(value) != table.num_stages:
        raise InvalidParameterError(f"{name} has {len(value)} entries but the table has "
                                    f"{table.num_stages} stages")
    return value


def microbatch_scaled(values, table):
    """``values`` (float64, one per operation, a new array) times each operation's
    microbatch's relative size: ``values`` itself when every size is 1 (``x * 1.0`` is
    ``x``), with no gather of the sizes."""
    sizes = table.microbatch_sizes
    if isinstance(sizes, tuple) and sizes.count(1.0) == len(sizes):
        return values
    return values * np.asarray(sizes, dtype=np.float64)[table.microbatch]


class CostModel:
    """Base class of the cost models; see the module docstring.

    A subclass's instances are frozen when its outermost ``__init__`` returns.
    """

    #: "table" for the idealized level, "simulation" when times are modelled.
    level = "simulation"
    #: "activations" (one stage's activation for one full microbatch) or "bytes".
    memory_unit = "activations"
    #: unit of every time a result reports.
    time_unit = "slots"
    #: How the model runs across devices; a cost model that prices no parallelism runs
    #: the default execution (contention none, no tail).
    execution = Execution()
    input_grad_release = 0.0
    overlap = 1.0
    #: Memory of one device in ``memory_unit`` (None: these costs know no device).
    memory_capacity = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None:
            return

        @functools.wraps(init)
        def frozen_after(self, *args, **kwargs):
            init(self, *args, **kwargs)
            if type(self).__init__ is frozen_after:   # the outermost constructor is done
                object.__setattr__(self, "_frozen", True)
        cls.__init__ = frozen_after

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot assign to field {name!r}: {type(self).__name__} is frozen (build a "
                f"new one, or use with_execution() to run it another way)")
        object.__setattr__(self, name, value)

    def _value(self):
        """What this cost model is, as a hashable value: cost models with equal values
        price everything alike, so they compare equal and share remembered answers
        (:mod:`tabsched._memo`). A subclass that does not say is only equal to itself."""
        return (type(self), id(self))

    def __eq__(self, other):
        return isinstance(other, CostModel) and self._value() == other._value()

    def __hash__(self):
        return hash(self._value())

    def __delattr__(self, name):
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(
                f"cannot delete field {name!r}: {type(self).__name__} is frozen")
        object.__delattr__(self, name)

    # The lowering options, read from the execution.
    @property
    def contention(self):
        """The link-contention model in force: the execution's, ``"none"`` when it names none."""
        return self.execution.contention or "none"

    @property
    def devices_per_node(self):
        """Table devices per node (what ``nic`` contention's ports count)."""
        return self.execution.devices_per_node

    @property
    def blocking_sends(self):
        """Whether a pipeline send holds its sender until it is received (``p2p == "blocking"``)."""
        return self.p2p == "blocking"

    @property
    def p2p(self):
        """How the pipeline's sends and receives are posted and waited (:mod:`tabsched.p2p`)."""
        return self.execution.p2p_mode

    @property
    def grad_sync(self):
        """The stages synced at the end when the table says nothing."""
        return self.execution.default_grad_sync

    @property
    def optimizer_step(self):
        """Whether an iteration ends with the optimizer step (the execution asks for it)."""
        return self.execution.needs_optimizer_step

    @property
    def sharding(self):
        """ZeRO-2/3's lowering options (:attr:`~tabsched.execution.Execution.sharding`)."""
        return self.execution.sharding

    def with_execution(self, execution):
        """These costs run as ``execution``: ``self`` when it is the one held already,
        else a copy holding it (a cost model that prices parallelism builds anew)."""
        if not isinstance(execution, Execution):
            raise InvalidParameterError(f"execution must be an Execution, not "
                                        f"{type(execution).__name__}")
        if execution == self.execution:
            return self
        changed = copy.copy(self)
        object.__setattr__(changed, "execution", execution)
        return changed

    def op_durations(self, table):
        """Each operation's duration, in the table's operation order (a subclass prices them)."""
        raise NotImplementedError

    def node_prices(self, lowered, kind):
        """Durations of the nodes of ``kind`` (an extra kind of :mod:`tabsched.nodes`) in
        ``lowered``, one per node in the order of ``lowered.nodes(kind)`` (default 0)."""
        return np.zeros(lowered.count(kind))

    def transfer_costs(self, table, transfers):
        """``(durations, nbytes)`` arrays, one entry per transfer."""
        empty = np.zeros(len(transfers))
        return empty, empty.copy()

    @property
    def free_transfers(self):
        """Whether every transfer these costs price lasts exactly 0, whatever the table:
        then a lowering for them may join the ends of a dependency across devices with
        a direct edge instead of a transfer node (``lower(free_transfers=True)``). True
        for a class that keeps this class's free transfers (neither
        :meth:`transfer_costs` nor :meth:`node_durations` replaced); a subclass that
        prices transfers says for itself."""
        cls = type(self)
        return (cls.transfer_costs is CostModel.transfer_costs
                and cls.node_durations is CostModel.node_durations)

    def transfer_parts(self, table, transfers):
        """``(latency, volume)`` per transfer: ``latency + volume`` is its duration.

        ``volume`` is the part that scales with the bytes and the link's
        bandwidth (``bytes / bandwidth``), ``latency`` the part that does not. A
        cost model that states no bandwidth counts its whole transfer time as
        volume: a link that is k times slower takes k times as long.
        """
        durations, _ = self.transfer_costs(table, transfers)
        durations = np.asarray(durations, dtype=np.float64)
        return np.zeros(len(durations)), durations

    def activation_sizes(self, table):
        """Activation memory of each operation's (stage, microbatch)."""
        refuse_slices(self, table)
        return microbatch_scaled(np.ones(len(table)), table)

    def transient_sizes(self, table):
        """Memory each operation holds from its start to its end only (default none)."""
        return np.zeros(len(table))

    def persistent_memory(self, table):
        """Memory each device holds for the whole iteration (weights, gradients, optimizer state);
        none here."""
        return np.zeros(table.num_devices)

    def shard_sizes(self, table):
        """``(gathered, gradients)`` per stage: what ZeRO-3 holds while a stage's
        parameters are gathered, and ZeRO-2/3 while its full gradients wait for their
        reduce-scatter (:func:`tabsched.sharding.shard_memory_events`); default none."""
        return np.zeros(table.num_stages), np.zeros(table.num_stages)

    def extra_prices(self, lowered):
        """``{kind: node_prices(lowered, kind)}`` for each extra kind ``lowered`` has."""
        return {kind: np.asarray(self.node_prices(lowered, kind), dtype=np.float64)
                for kind in lowered.extra_kinds}

    def overlap_factors(self, lowered):
        """The factor on each overlapped cell's summed operations (``lowered.
        overlapped_cells``' order): the constant ``overlap`` here; a cost model that knows
        what its operations overlap says it per cell (``ModelCosts``: the two-stream
        model, :mod:`tabsched.costs.streams`)."""
        return np.full(len(lowered.overlapped_cells), float(self.overlap))

    def pair_overlap_factor(self, table):
        """The factor on an overlapped pair of one full microbatch's forward and backward
        (what a closed form's ``F&B`` is): the constant ``overlap`` here."""
        return float(self.overlap)

    def node_durations(self, lowered, op_durations=None):
        """Durations of every node of a lowered table: this model's prices composed by
        the lowering (:meth:`~tabsched.lower.LoweredSchedule.compose`)."""
        table = lowered.table
        if op_durations is None:
            op_durations = self.op_durations(table)
        transfer_durations, _ = self.transfer_costs(table, lowered.transfers)
        return lowered.compose(op_durations, transfer_durations, self.extra_prices(lowered),
                               self.overlap_factors(lowered))

    def microbatch_durations(self, table):
        """``(kinds x stages)`` durations of one full microbatch on ``table``'s stages, if
        the cost model knows them without a table; None (the default): the formula
        level then measures them with ``op_durations`` on a probe table."""
        return None

    @classmethod
    def stacked_prices(cls, lowered, cost_models):
        """The prices of each of ``cost_models`` (all of this class) for ``lowered``, one
        row each (a :class:`tabsched.compose.Prices`): a subclass may share between them
        the work that does not depend on the member
        (:class:`~tabsched.costs.model_costs.ModelCosts` does), to the bit."""
        table = lowered.table
        return Prices.stack((costs.op_durations(table),
                             costs.transfer_costs(table, lowered.transfers)[0],
                             costs.extra_prices(lowered), costs.overlap_factors(lowered))
                            for costs in cost_models)

    @classmethod
    def stacked_node_durations(cls, lowered, cost_models):
        """``node_durations(lowered)`` of each of ``cost_models`` (all of this class), one
        row each, to the bit: their :meth:`stacked_prices` composed once."""
        return lowered.compose_stacked(cls.stacked_prices(lowered, cost_models))

    def memory_key(self):
        """Cost models with equal keys give every table the same ``activation_sizes``,
        ``transient_sizes``, ``persistent_memory`` and ``input_grad_release``, so that
        an evaluation of many shares them; by default each cost model is its own key."""
        return self

    def describe(self):
        """Parameters for reports and JSON."""
        return {"model": type(self).__name__}

    def __repr__(self):
        """``UnitCosts(F=1, B=2, I=1, W=1)``: the class and the settings of :meth:`describe`."""
        info = dict(self.describe())
        name = info.pop("model", type(self).__name__)
        return f"{name}({', '.join(f'{key}={_short(value)}' for key, value in info.items())})"


def _short(value, limit=4):
    """A setting for a repr: numbers as %g, long lists cut."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_short(item) for item in value[:limit])
        more = f", ... {len(value)} in all" if len(value) > limit else ""
        return f"[{shown}{more}]"
    return repr(value) if isinstance(value, str) else str(value)


#: The table level's default slot lengths ``(F, B, I, W)``: a full backward is an
#: input-grad plus a weight-grad (I + W = B), each as long as a forward, as the
#: zero-bubble paper counts them (Qi et al., ICLR 2024, section 2: T_F = T_B = T_W
#: for its B and W, so a whole backward takes 2 T_F; a transformer layer's backward
#: also does twice its forward's FLOPs, Narayanan et al., SC 2021, section 3.5).
#: With all four 1 (the grid as drawn, before 0.2) a split backward cost twice a full
#: one, so ZB-H1 needed more slots than 1F1B while ranking first by bubble.
DEFAULT_SLOT_LENGTHS = (1.0, 2.0, 1.0, 1.0)


class UnitCosts(CostModel):
    """The idealized-table level: a fixed length per kind, no communication.

    Parameters
    ----------
    f, b, i, w : float
        Slot length of a forward, full backward, input-grad and weight-grad of a
        full microbatch; default :data:`DEFAULT_SLOT_LENGTHS`, F=1 B=2 I=1 W=1. A
        microbatch of relative size ``x`` takes ``x`` times as long.
    input_grad_release : float
        Part of an activation freed when ``I`` ends; ``W`` frees the rest.
        Default 0: the whole activation lives until ``W``, as the zero-bubble
        papers count memory.
    overlap : float
        Factor on the summed length of an overlapped cell's parts.
    sync, optimizer : float
        Length of a gradient sync and of an optimizer step, when the evaluation
        has a tail (default 0).
    execution : Execution, optional
        How the table runs (its contention and tail; default ``Execution()``).

    Examples
    --------
    >>> UnitCosts(b=2).describe()
    {'model': 'UnitCosts', 'F': 1.0, 'B': 2.0, 'I': 1.0, 'W': 1.0}
    """

    level = "table"

    def __init__(self, f=DEFAULT_SLOT_LENGTHS[0], b=DEFAULT_SLOT_LENGTHS[1],
                 i=DEFAULT_SLOT_LENGTHS[2], w=DEFAULT_SLOT_LENGTHS[3], *, input_grad_release=0.0, overlap=1.0,
                 sync=0.0, optimizer=0.0, execution=None):
        self.lengths = np.array([_non_negative("f", f), _non_negative("b", b),
                                 _non_negative("i", i), _non_negative("w", w)])
        self.input_grad_release = _fraction("input_grad_release", input_grad_release)
        self.overlap = _non_negative("overlap", overlap)
        self.sync = _non_negative("sync", sync)
        self.optimizer = _non_negative("optimizer", optimizer)
        if execution is not None:
            if not isinstance(execution, Execution):
                raise InvalidParameterError(f"execution must be an Execution, not "
                                            f"{type(execution).__name__}")
            self.execution = execution

    def node_prices(self, lowered, kind):
        """``sync`` per gradient sync, ``optimizer`` per optimizer step, else 0."""
        price = {SYNC: self.sync, OPTIMIZER: self.optimizer}.get(kind, 0.0)
        return np.full(lowered.count(kind), price)

    def _value(self):
        return (type(self), tuple(self.lengths.tolist()), self.input_grad_release, self.overlap,
                self.sync, self.optimizer, self.execution)

    def op_durations(self, table):
        """Each operation's slot length by kind (F, B, I, W), times its microbatch's relative
        size."""
        refuse_slices(self, table)
        return microbatch_scaled(self.lengths[table.kind], table)

    def describe(self):
        """The lengths (and the overlap and input-grad release when set), JSON-ready."""
        info = {"model": "UnitCosts", **dict(zip("FBIW", self.lengths.tolist()))}
        if self.overlap != 1.0:
            info["overlap"] = self.overlap
        if self.input_grad_release:
            info["input_grad_release"] = self.input_grad_release
        return info


class StageCosts(CostModel):
    """Profiled per-stage durations and a communication cost.

    Parameters
    ----------
    forward : float or sequence
        Forward time of a full microbatch, one number for all stages or one per stage.
    backward : float or sequence, optional
        Full backward time; default twice the forward.
    input_grad, weight_grad : float or sequence, optional
        Split backward times; default half the backward each (input_grad), and the
        backward minus input_grad (weight_grad).
    comm : float or array (devices x devices)
        Time of one transfer, for every link or per directed link ``comm[src, dst]``.
    activation : float or sequence
        Activation memory per stage for a full microbatch (default 1).
    input_grad_release, overlap, sync, optimizer : float
        As in ``UnitCosts``.
    contention : {"none", "link", "nic"}
    devices_per_node : int, optional
        For ``nic`` contention.
    blocking_sends : bool
    execution : Execution, optional
        The execution the three keywords above change (default ``Execution()``).
    time_unit : str
        Label of the unit the numbers are in (default "s").

    Notes
    -----
    Durations scale linearly with a microbatch's relative size.

    Examples
    --------
    >>> costs = StageCosts([1.0, 2.0], comm=0.5)
    >>> costs.describe()["B"]
    [2.0, 4.0]
    """

    def __init__(self, forward, backward=None, input_grad=None, weight_grad=None, *,
                 comm=0.0, activation=1.0, input_grad_release=0.0, overlap=1.0,
                 contention=None, devices_per_node=None, blocking_sends=None,
                 sync=0.0, optimizer=0.0, time_unit="s", execution=None):
        self.forward = _per_stage("forward", forward)
        self.backward = (_per_stage("backward", backward) if backward is not None
                         else self.forward * 2)
        self.input_grad = (_per_stage("input_grad", input_grad) if input_grad is not None
                           else self.backward / 2)
        self.weight_grad = (_per_stage("weight_grad", weight_grad) if weight_grad is not None
                            else np.maximum(np.subtract(self.backward, self.input_grad), 0.0))
        if isinstance(comm, numbers.Number):
            self.comm = _non_negative("comm", comm)
        else:
            matrix = np.asarray(comm, dtype=np.float64)
            if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
                raise InvalidParameterError("comm must be a number or a square matrix "
                                            "(devices x devices)")
            bad = np.argwhere(~np.isfinite(matrix) | (matrix < 0))
            if len(bad):
                src, dst = bad[0]
                raise InvalidParameterError(f"comm[{src}][{dst}] must be finite and >= 0, "
                                            f"not {matrix[src, dst]}")
            self.comm = matrix
        self.activation = _per_stage("activation", activation)
        self.input_grad_release = _fraction("input_grad_release", input_grad_release)
        self.overlap = _non_negative("overlap", overlap)
        base = Execution() if execution is None else execution
        if not isinstance(base, Execution):
            raise InvalidParameterError(f"execution must be an Execution, not "
                                        f"{type(base).__name__}")
        given = {key: value for key, value in (
            ("contention", contention), ("devices_per_node", devices_per_node),
            ("blocking_sends", None if blocking_sends is None else bool(blocking_sends)))
            if value is not None}
        self.execution = base.replace(**given) if given else base
        self.sync = _non_negative("sync", sync)
        self.optimizer = _non_negative("optimizer", optimizer)
        self.time_unit = time_unit

    node_prices = UnitCosts.node_prices

    def _value(self):
        def plain(value):
            return (value.tobytes(), value.shape) if isinstance(value, np.ndarray) else value
        return (type(self), *(plain(getattr(self, name)) for name in (
            "forward", "backward", "input_grad", "weight_grad", "comm", "activation")),
            self.input_grad_release, self.overlap, self.sync, self.optimizer, self.time_unit,
            self.execution)

    def op_durations(self, table):
        """Each operation's duration from its stage and kind, times its microbatch's relative
        size."""
        per_kind = np.stack([_stage_values(name, getattr(self, name), table)
                             for name in ("forward", "backward", "input_grad", "weight_grad")])
        refuse_slices(self, table)
        return microbatch_scaled(per_kind[table.kind, table.stage], table)

    @property
    def free_transfers(self):
        """A single ``comm`` of 0 (a matrix, even of zeros, is checked against the
        table's devices when priced, so it does not count), unless a subclass prices
        transfers its own way."""
        cls = type(self)
        return (isinstance(self.comm, float) and self.comm == 0.0
                and cls.transfer_costs is StageCosts.transfer_costs
                and cls.node_durations is CostModel.node_durations)

    def transfer_costs(self, table, transfers):
        """Each transfer's duration: the one ``comm`` for all, or ``comm[source, destination]``."""
        if isinstance(self.comm, float):
            durations = np.full(len(transfers), self.comm)
        else:
            if self.comm.shape[0] != table.num_devices:
                raise InvalidParameterError(
                    f"comm is a {self.comm.shape[0]}x{self.comm.shape[0]} matrix but the "
                    f"table has {table.num_devices} devices")
            durations = self.comm[transfers.src, transfers.dst]
        return durations, np.zeros(len(transfers))

    def activation_sizes(self, table):
        """Activation bytes each forward leaves until its backward: its stage's, times its
        microbatch's size."""
        refuse_slices(self, table)
        per_stage = _stage_values("activation", self.activation, table)
        return microbatch_scaled(per_stage[table.stage], table)

    def describe(self):
        """The per-stage durations, the communication costs and the contention model, JSON-ready."""
        def plain(value):
            return value.tolist() if isinstance(value, np.ndarray) else value
        return {"model": "StageCosts", "F": plain(self.forward), "B": plain(self.backward),
                "I": plain(self.input_grad), "W": plain(self.weight_grad),
                "comm": plain(self.comm), "contention": self.contention}
