"""Transformer models: parameters, FLOPs, bytes moved and activation memory per layer.

A :class:`TransformerModel` is a decoder-only transformer: ``layers``
identical layers (attention with ``heads`` query heads and ``kv_heads``
key/value heads, then an MLP of width ``ffn``, each behind a norm), an input
embedding on the first pipeline stage, and a final norm, output layer and loss
on the last. Everything is per microbatch of ``b`` samples of ``sequence``
tokens each (``T = b*s``) and, under tensor parallelism
(:class:`~tabsched.execution.Execution`), per tensor rank.

Notation: ``h`` hidden, ``a`` heads, ``g`` kv_heads, ``dh = h/a``, ``hk = g*dh``
(width of K and of V), ``f`` ffn, ``s`` sequence, ``V`` vocab, ``d`` bytes per
element of the model's dtype, ``t`` tensor ranks, ``sn = s/t`` with sequence
parallelism, else ``s``.

Wider heads, experts, latent attention: ``head_dim`` (default ``h/a``) sets a head's
width, so the queries are ``a*head_dim`` wide and ``hk = g*head_dim`` (Qwen3's heads are
wider than ``h/a``); a mixture of experts (``experts`` > 0) and multi-head latent attention
(``kv_lora_rank``) replace the MLP and the attention projections below with
:mod:`tabsched.costs.experts`' and :mod:`tabsched.costs.latent`'s counts and kernels.

Parameters (weight matrices only; biases, norm scales and position
embeddings, O(h) per layer, are left out: under 0.05% at h >= 1024)
    per layer ``2*h*h + 2*h*hk + k*h*f`` with ``k = 3`` for a gated MLP
    (SwiGLU) and 2 otherwise; ``V*h`` for the embedding on the first stage and
    another ``V*h`` for the output layer on the last (a pipeline keeps a copy
    on each end even when the two are tied, as Megatron-LM does, and
    all-reduces the two copies' gradients: ``tied_embeddings``; a single
    stage holding both keeps one).
Work: a list of kernels per operation (:mod:`tabsched.costs.kernels`)
    FLOPs of matrix products (one multiply-add = 2 FLOPs; Narayanan et al.
    2021, appendix; the zero-bubble paper's split of the backward, Qi et al.
    2023, Table 1): ``F = 2*T*P + 4*b*s*s*h`` (the weight products plus QK^T
    and attention over V on the full s x s score matrix; for ``g = a``,
    ``f = 4h`` this is ``24*T*h^2 + 4*T*s*h``); ``I = 2*T*P + 8*b*s*s*h``;
    ``W = 2*T*P``; ``B = I + W``. Recomputation adds to ``I`` (and ``B``):
    ``selective`` the attention core forward, ``4*b*s*s*h`` (eager attention
    only), ``full`` a whole forward ``F``. Output layer: ``2*T*h*V`` in each
    of F, I and W; the embedding (a gather) counts no FLOPs. Under tensor
    parallelism every count is divided by ``t``.
    Bytes moved: every kernel's reads (its inputs, and its weights once) and
    writes; see :mod:`tabsched.costs.kernels`.
Activation bytes per layer (Korthikanti et al. 2022, section 4, per tensor)
    Kept whole by every tensor rank (divided by ``t`` with sequence
    parallelism): the QKV input ``d*h``, the MLP input ``d*h``, two norm inputs
    ``2*d*h`` and two dropout masks ``2*m*h`` per token. Split ``t`` ways:
    Q, K, V ``d*(h + 2hk)``, the output-projection input ``d*h``, the MLP's
    intermediates ``k'*d*f`` (``k' = 2``: activation input and output; 3 for a
    gated MLP: gate, up and their product) per token, and with eager attention
    the score-sized tensors ``(d + m*(d+1))*a*s*s*b`` (softmax output; with
    dropout its mask and output). ``m = 1`` with dropout (1-byte masks), else
    0. With ``d = 2``, dropout, ``g = a``, ``f = 4h`` this is exactly the
    paper's ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` (Table 2, tensor parallel),
    ``s*b*h/t*(34 + 5*a*s/h)`` with sequence parallelism, and
    ``s*b*h*(34 + 5*a*s/h)`` at ``t = 1`` for ``recompute="none"``;
    ``selective`` (and ``flash`` attention, which keeps no score tensors)
    drops the score-sized term (``34*s*b*h/t`` with sequence parallelism);
    ``full`` keeps the layer input only, ``d*sn*b*h``.
    First stage: the embedding's dropout mask ``m*sn*b*h``; last stage: the
    final norm and output-layer inputs and the fp32 logits,
    ``2*d*sn*b*h + 4*T*V/t`` (the paper's ``4*s*b*h/t*(1 + V/h)`` at ``d = 2``
    with sequence parallelism, section 4.3).
Working memory while an operation runs (``transient``; held only then)
    one layer's activation-gradient buffer in every backward: the residual
    stream's gradient in and out, ``2*d*s*b*h``, and the largest pair of
    intermediate gradients, the score gradients ``2*d*a*s*s*b/t`` with eager
    attention or the MLP's ``d*T*(1+k)*f/t``; with recomputation, the
    recomputed part of one layer's activations too (``full``: the whole
    ``recompute="none"`` activation less the kept input, as Megatron-LM
    re-runs the layer's forward keeping everything before its backward;
    ``selective``: the score-sized tensors).
Split backward (``I`` then ``W``)
    ``W`` needs the input of each weight matmul and the gradient of its output:
    ``d*T*(3h + f) + d*T*(3h + 2hk + k''*f)`` with ``k'' = 2`` for a gated MLP,
    else 1 (``32*s*b*h`` for a GPT layer at ``t = 1``; tensor-parallel parts
    divided by ``t``). ``I`` releases the rest of the stored activation:
    ``input_grad_release = 1 - kept / stored`` (at least 0; under full
    recomputation the checkpoint is smaller than what W needs, so it is all
    held until ``W``, which re-materialises the rest: 0).
Persistent bytes (mixed-precision Adam; Rajbhandari et al. 2020, ZeRO, section 3.1)
    ``bytes_per_param`` per parameter, by default the weights in the model's
    dtype (2 for fp16/bf16), the gradients in ``grad_bytes`` (default the
    dtype, as Megatron-LM keeps fp16 gradients for fp16 training; set 4 for
    fp32 gradient accumulation, Megatron-LM's choice for bf16) and the
    optimizer state ``optimizer_bytes`` (default 12: fp32 master weights,
    Adam's momentum and variance): 16 bytes for fp16/bf16. Optimizer-state
    sharding divides the ``optimizer_bytes`` part by the data-parallel size.
    The optimizer step moves ``optimizer_step_bytes`` per parameter of its
    shard (54 for fp16 Adam, as Megatron-LM's step reads and writes them).

Examples
--------
>>> gpt = TransformerModel(layers=2, hidden=64, heads=4, sequence=16, vocab=100)
>>> gpt.layer_parameters == 12 * 64 * 64
True
>>> int(gpt.layer_activation(1)) == 16 * 64 * (34 + 5 * 4 * 16 // 64)
True
>>> from tabsched.execution import Execution
>>> sp = Execution(tensor_parallel=4, sequence_parallel=True)
>>> int(gpt.layer_activation(1, parallel=sp)) == 16 * 64 * (34 + 5 * 4 * 16 // 64) // 4
True
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from tabsched._memo import memo
from tabsched.costs import _presets
from tabsched.costs.experts import (EXPERT_FIELDS, check_experts,
                                    moe_parameter_parts, moe_token_activation,
                                    moe_transient_width, moe_weight_grad_kept)
from tabsched.costs.ends import embedding_kernels, output_kernels
from tabsched.costs.kernels import FLASH_TILE, KernelTable, layer_kernels
from tabsched.costs.latent import (LATENT_FIELDS, check_latent, latent_parameter_parts,
                                   latent_token_activation, latent_weight_grad_kept,
                                   latent_widths)
from tabsched.exceptions import InvalidParameterError
from tabsched.execution import Execution
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, SLICE_PARTITIONS, WEIGHT_GRAD

__all__ = ["TransformerModel", "load_model", "model_presets", "RECOMPUTE_MODES", "DTYPES",
           "NORMS", "PARTITIONS", "SLICE_GRANULE", "slice_bounds"]

from tabsched.execution import RECOMPUTE_MODES  # noqa: E402  (one list, the execution's)
NORMS = ("layernorm", "rmsnorm")
#: Bytes per element of the dtypes a model may name.
DTYPES = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
_REQUIRED = ("layers", "hidden", "heads", "sequence", "vocab")
_OPTIONAL = ("kv_heads", "ffn", "gated_ffn", "dropout", "bias", "norm", "tied_embeddings", "dtype",
             "microbatch_size", "recompute", "grad_bytes", "optimizer_bytes", "bytes_per_param",
             "name", "head_dim", *EXPERT_FIELDS, *LATENT_FIELDS)
_SERIAL = Execution()


# Sane ranges of a model's sizes: a value outside them is a typo, never a model. They are
# wide on purpose, far beyond every published model, so that none is refused; within them
# every FLOP count stays finite in float64, and ModelCosts checks that activation bytes fit
# int64.
#: Layers: GPT-3 has 96, Megatron-LM's 1T model 128; 100,000 is 800x that.
MAX_LAYERS = 100_000
#: Hidden size (and heads, kv_heads, which divide it): Megatron-LM's 1T model has 25,600;
#: 2**20 is 40x that.
MAX_HIDDEN = 2**20
#: MLP width: 4 x 25,600 = 102,400 for the 1T model; 2**24 is 160x that.
MAX_FFN = 2**24
#: Tokens per sample: contexts of 1M-10M tokens are published; 2**27 is 134M.
MAX_SEQUENCE = 2**27
#: Vocabulary: Llama 3 has 128,256, Gemma 256,000; 2**24 is 65x that.
MAX_VOCAB = 2**24
#: Samples per microbatch: pipeline runs use a few (the presets 1); 2**24 is 16.7M.
MAX_MICROBATCH_SIZE = 2**24
#: Optimizer-state bytes per parameter: Adam keeps 12 (fp32 master weights and two
#: moments), 24 in fp64; 256 is ten fp64 states and more.
MAX_OPTIMIZER_BYTES = 256.0
#: Persistent bytes per parameter: 16 for mixed-precision Adam; 1024 is 64x that.
MAX_BYTES_PER_PARAM = 1024.0
#: Characters of a name (a file's path by default: Linux's PATH_MAX) and a description.
MAX_NAME = 4096
MAX_DESCRIPTION = 500
_LIMITS = {"layers": MAX_LAYERS, "hidden": MAX_HIDDEN, "heads": MAX_HIDDEN,
           "kv_heads": MAX_HIDDEN, "ffn": MAX_FFN, "sequence": MAX_SEQUENCE,
           "vocab": MAX_VOCAB, "microbatch_size": MAX_MICROBATCH_SIZE}


def _non_negative_number(name, value, high):
    return _presets.number(name, value, 0.0, high)


def _positive_int(name, value):
    return _presets.integer(name, value, 1, _LIMITS[name])


def _one_of(name, value, choices):
    """``value`` if it is one of the text ``choices``, else one line naming ``name``."""
    if not isinstance(value, str) or value not in choices:
        raise InvalidParameterError(f"{name} {_presets.shown_value(value)} is not one of "
                                    f"{', '.join(choices)}")
    return value


def _element_bytes(name, value, expected):
    """Bytes per element: an integer 1, 2, 4 or 8 (not a bool, not a float)."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or value not in (1, 2, 4, 8)):
        raise InvalidParameterError(f"{name} must be {expected}, not "
                                    f"{_presets.shown_value(value)}")
    return int(value)


@dataclass(frozen=True)
class TransformerModel:
    """A decoder-only transformer and how it is trained; see the module docstring.

    Parameters
    ----------
    layers, hidden, heads, sequence, vocab : int
    kv_heads : int, optional
        Key/value heads (grouped-query attention); default ``heads``.
    head_dim : int, optional
        Width of one attention head; default ``hidden / heads`` (Qwen3's heads are wider:
        the query projection then writes ``heads * head_dim``, not ``hidden``).
    ffn : int, optional
        MLP width; default ``4*hidden``.
    gated_ffn : bool
        A gated MLP (SwiGLU: three matrices) instead of two matrices.
    dropout : bool
        Dropout after attention scores, attention and MLP (1-byte masks).
    bias : bool
        The linear layers have biases (Megatron-LM's default ``add_bias_linear``, GPT-2/3;
        Llama, Mixtral, DeepSeek and Qwen3 have none). Their parameters are left out of
        the counts (O(h)), but their gradients are not free: each is a reduction over the
        tokens of its product's output gradient (:mod:`tabsched.costs.kernels`).
    norm : {"layernorm", "rmsnorm"}
    tied_embeddings : bool
        The output layer shares the embedding's weights (GPT): with the two
        on different devices, their gradients are all-reduced every iteration.
    dtype : str or int
        ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"`` or bytes per element.
    microbatch_size : int
        Samples in a full microbatch (a table's relative size 1.0).
    recompute : {"none", "selective", "full"}
    grad_bytes : int, optional
        Bytes per gradient element; default the dtype's.
    optimizer_bytes : float
        Optimizer-state bytes per parameter (default 12: fp32 master weights,
        Adam's two moments).
    bytes_per_param : float, optional
        Persistent bytes per parameter; default dtype + grad_bytes +
        optimizer_bytes.
    name, description : str
    attention_keys : int, optional
        Keys each query of the sequence attends to; default the whole sequence. Set
        by :meth:`sliced` for a sequence slice (Seq1F1B), whose ``s/k`` queries meet
        ``(i+1) s/k`` keys.
    """

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocab: int
    kv_heads: int | None = None
    ffn: int | None = None
    gated_ffn: bool = False
    dropout: bool = True
    bias: bool = True
    norm: str = "layernorm"
    tied_embeddings: bool = True
    dtype: object = "bf16"
    microbatch_size: int = 1
    recompute: str = "none"
    grad_bytes: int | None = None
    optimizer_bytes: float = 12.0
    bytes_per_param: float | None = None
    name: str = "custom"
    description: str = ""
    experts: int = 0
    top_k: int | None = None
    expert_ffn: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    routing_imbalance: float = 1.0
    mtp_layers: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    head_dim: int | None = None
    attention_keys: int | None = None

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        for key in _REQUIRED + ("microbatch_size",):
            set_(key, _positive_int(key, getattr(self, key)))
        set_("kv_heads", self.heads if self.kv_heads is None
             else _positive_int("kv_heads", self.kv_heads))
        set_("ffn", 4 * self.hidden if self.ffn is None else _positive_int("ffn", self.ffn))
        check_latent(self, set_)
        if self.head_dim is not None:
            set_("head_dim", _presets.integer("head_dim", self.head_dim, 1, MAX_HIDDEN))
        elif self.hidden % self.heads and self.kv_lora_rank is None:
            raise InvalidParameterError(f"hidden {self.hidden} is not divisible by heads "
                                        f"{self.heads} (give head_dim)")
        else:
            set_("head_dim", self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise InvalidParameterError(f"heads {self.heads} is not divisible by kv_heads "
                                        f"{self.kv_heads}")
        for key in ("gated_ffn", "dropout", "bias", "tied_embeddings"):
            if not isinstance(getattr(self, key), (bool, np.bool_)):
                raise InvalidParameterError(f"{key} must be true or false, not "
                                            f"{_presets.shown_value(getattr(self, key))}")
            set_(key, bool(getattr(self, key)))
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise InvalidParameterError(f"dtype {_presets.shown_value(self.dtype)} is not "
                                            f"one of {', '.join(DTYPES)} (or bytes per element)")
        else:
            set_("dtype", _element_bytes("dtype", self.dtype,
                                         f"one of {', '.join(DTYPES)} or 1, 2, 4, 8 bytes"))
        _one_of("recompute", self.recompute, RECOMPUTE_MODES)
        _one_of("norm", self.norm, NORMS)
        set_("grad_bytes", self.dtype_bytes if self.grad_bytes is None
             else _element_bytes("grad_bytes", self.grad_bytes, "1, 2, 4 or 8"))
        set_("optimizer_bytes", _non_negative_number("optimizer_bytes", self.optimizer_bytes,
                                                     MAX_OPTIMIZER_BYTES))
        if self.bytes_per_param is None:
            set_("bytes_per_param",
                 float(self.dtype_bytes + self.grad_bytes + self.optimizer_bytes))
        else:
            set_("bytes_per_param", _non_negative_number("bytes_per_param",
                                                         self.bytes_per_param,
                                                         MAX_BYTES_PER_PARAM))
        _presets.text("name", self.name, MAX_NAME)
        _presets.text("description", self.description, MAX_DESCRIPTION)
        check_experts(self, set_)
        if self.attention_keys is not None:
            set_("attention_keys", _presets.integer("attention_keys", self.attention_keys, 1,
                                                    MAX_SEQUENCE))

    @property
    def keys(self):
        """Keys each query attends to: ``attention_keys``, or the whole ``sequence``."""
        return self.sequence if self.attention_keys is None else self.attention_keys

    def sliced(self, index, count, partition="even"):
        """This model as one sequence slice prices it: slice ``index`` of ``count``.

        Seq1F1B (Sun et al. 2024, arXiv 2406.03488, section 3.2): slice ``i`` runs the
        linear layers (QKV, output projection, MLP), the norms, the embedding and the
        output layer on its tokens, and its causal attention lets its queries meet the
        keys of slices ``0 .. i``. With the token bounds ``b`` of :func:`slice_bounds`
        (``partition``: ``"even"``, ``s/k`` tokens each, ``count`` must divide the
        sequence; ``"compute"``, Seq1F1B's equal-FLOPs cut) the view is the model on
        ``sequence = b[i+1] - b[i]`` with ``attention_keys = b[i+1]``. Slice ``0`` of
        ``1`` is the model itself.
        """
        if count == 1 and index == 0:
            return self
        if self.attention_keys is not None:
            raise InvalidParameterError("sequence slices: the model is a slice already")
        if self.mtp_layers or self.kv_lora_rank is not None:
            raise InvalidParameterError(
                f"sequence slices: model {self.name}'s multi-token prediction or latent "
                f"attention is not priced per slice")
        bounds = slice_bounds(self, count, partition)
        return self.replace(sequence=bounds[index + 1] - bounds[index],
                            attention_keys=bounds[index + 1])

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------- parameters
    @property
    def dtype_bytes(self):
        """Bytes per element of activations, weights and transfers."""
        return DTYPES[self.dtype] if isinstance(self.dtype, str) else int(self.dtype)

    @property
    def kv_width(self):
        """Width ``hk = kv_heads * head_dim`` of each of K and V."""
        return self.kv_heads * self.head_dim

    @property
    def _mlp_matrices(self):
        return 3 if self.gated_ffn else 2

    def layer_parameter_parts(self, dense=False):
        """``(split, replicated, experts)`` weight-matrix parameters of one layer: split
        over the tensor ranks, held whole by each (MLA's down projections, a router), and
        the routed experts (split over the tensor ranks and the expert group). A
        mixture-of-experts model's layer is a MoE layer, or with ``dense`` one of its first
        ``dense_layers``."""
        split, replicated = latent_parameter_parts(self)
        if dense or not self.experts:
            return split + self._mlp_matrices * self.hidden * self.ffn, replicated, 0
        routed, shared, router = moe_parameter_parts(self)
        return split + shared, replicated + router, routed

    @property
    def layer_parameters(self):
        """Weight-matrix parameters of one transformer layer (a MoE model: a MoE layer)."""
        return sum(self.layer_parameter_parts())

    @property
    def dense_layer_parameters(self):
        """Parameters of a mixture-of-experts model's dense layer (its first layers)."""
        return sum(self.layer_parameter_parts(dense=True))

    @property
    def embedding_parameters(self):
        """Parameters of the input embedding (``vocab * hidden``), on the first stage."""
        return self.vocab * self.hidden

    @property
    def output_parameters(self):
        """Parameters of the output layer (``vocab * hidden``), on the last stage (the embedding's
        when tied)."""
        return self.vocab * self.hidden

    @property
    def parameters(self):
        """All parameters, counting the embedding and the output layer once each (and the
        multi-token-prediction modules, which share both)."""
        dense = self.dense_layers
        return ((self.layers - dense) * self.layer_parameters
                + dense * self.dense_layer_parameters + self.embedding_parameters
                + self.output_parameters + self.mtp_layers * self._mtp_module_parameters)

    @property
    def active_parameters(self):
        """Parameters one token meets: a MoE layer's router, shared experts and ``top_k``
        of its routed experts (DeepSeek-V3's 37B of 671B); all of them in a dense model."""
        if not self.experts:
            return self.parameters
        routed = self.layer_parameter_parts()[2]
        inactive = routed * (self.experts - self.top_k) // self.experts
        return self.parameters - inactive * (self.layers - self.dense_layers + self.mtp_layers)

    @property
    def _mtp_module_parameters(self):
        """One multi-token-prediction module (DeepSeek-V3, section 2.2): its projection of
        the hidden state and the next token's embedding (``2h x h``) and one layer."""
        return 2 * self.hidden * self.hidden + self.layer_parameters

    def stage_parameter_parts(self, layers, first, last, dense=0):
        """``(split, replicated, experts)`` parameters of a stage of ``layers`` layers,
        ``dense`` of them a MoE model's dense layers (see :meth:`layer_parameter_parts`;
        the embedding and the output layer are vocabulary-parallel: split). The last
        stage holds the multi-token-prediction modules, and a copy of the embedding
        for them when it is not also the first (as a pipeline keeps tied embeddings)."""
        tied_here = bool(first) and bool(last) and self.tied_embeddings
        parts = [0, 0, 0]
        for count, kind in ((layers - dense, self.layer_parameter_parts()),
                            (dense, self.layer_parameter_parts(dense=True))):
            for index in range(3):
                parts[index] += count * kind[index]
        parts[0] += (bool(first) * self.embedding_parameters
                     + (bool(last) and not tied_here) * self.output_parameters)
        if last and self.mtp_layers:
            split, replicated, experts = self.layer_parameter_parts()
            parts[0] += self.mtp_layers * (2 * self.hidden * self.hidden + split) + \
                (0 if first else self.embedding_parameters)
            parts[1] += self.mtp_layers * replicated
            parts[2] += self.mtp_layers * experts
        return tuple(parts)

    def stage_parameters(self, layers, first, last, dense=0):
        """Parameters of a stage of ``layers`` layers (first/last: embedding/output).

        A stage that is both first and last holds one copy of tied embeddings:
        its output layer uses the embedding's weights (Megatron-LM's
        ``word_embeddings_weight()``); only a pipeline keeps a copy on each end.

        >>> gpt = TransformerModel(layers=2, hidden=64, heads=4, sequence=16, vocab=100)
        >>> gpt.stage_parameters(2, True, True) == 2 * gpt.layer_parameters + 100 * 64
        True
        """
        return sum(self.stage_parameter_parts(layers, first, last, dense))

    @property
    def optimizer_step_bytes(self):
        """Bytes the optimizer step reads and writes per parameter.

        Megatron-LM's mixed-precision step (megatron/optimizer/optimizer.py,
        2022): copy the gradients to fp32 (read ``g``, write 4), unscale and
        check for inf (read 4, write 4), the gradient norm (read 4), Adam (read
        the fp32 gradient 4 and the state, write the state:
        ``4 + 2*optimizer_bytes``), copy the master weights to the model's
        (read 4, write ``d``), zero the gradients (write ``g``):
        ``2*g + d + 24 + 2*optimizer_bytes``, 54 bytes for fp16 with Adam.

        >>> TransformerModel(1, 64, 4, 16, 100, dtype="fp16").optimizer_step_bytes
        54.0
        """
        return (2.0 * self.grad_bytes + self.dtype_bytes + 24.0 + 2.0 * self.optimizer_bytes)

    def optimizer_state_bytes(self, shards=1):
        """Persistent bytes per parameter with the optimizer state over ``shards`` replicas."""
        state = max(0.0, self.bytes_per_param - self.dtype_bytes - self.grad_bytes)
        return self.bytes_per_param - state + state / shards

    # ------------------------------------------------------------ activations
    def _score_bytes(self, samples, parallel=_SERIAL):
        """Score-sized activation bytes (softmax output; dropout mask and output), per rank."""
        if parallel.flash:
            return 0 * samples
        d, mask = self.dtype_bytes, int(self.dropout)
        score = (d + mask * (d + 1)) * self.heads * self.sequence * self.keys * samples
        return score // parallel.tensor_parallel if isinstance(score, int) and \
            score % parallel.tensor_parallel == 0 else score / parallel.tensor_parallel

    @staticmethod
    def _divide(value, parts):
        """``value / parts``: exact for ints that divide, else a float."""
        if isinstance(value, (int, np.integer)) and value % parts == 0:
            return value // parts
        return value / parts

    def _token_activation(self, parallel=_SERIAL, dense=False):
        """Per-token activation bytes of one layer that do not scale with s*s:
        ``(whole, split, gathered)``.

        ``whole`` is held by every tensor rank (split with sequence parallelism),
        ``split`` is divided over the tensor ranks, ``gathered`` is held in full by
        every tensor rank whatever the sequence parallelism (MLA's latents, a MoE
        layer's gathered expert input: :mod:`tabsched.costs.latent`,
        :mod:`tabsched.costs.experts`). Transformer Engine keeps the linear products'
        inputs for their weight gradients in FP8 with ``fp8``: one byte each.
        """
        d, mask, h, f = self.dtype_bytes, int(self.dropout), self.hidden, self.ffn
        kept = 1 if parallel.fp8 is not None else d
        # the attention: its norm's input, the QKV (or down projections') input, a mask
        whole = d * h + kept * h + mask * h
        if self.kv_lora_rank is None:
            wq = self.heads * self.head_dim
            split, gathered = d * (wq + 2 * self.kv_width) + kept * wq, 0
        else:
            gathered, split = latent_token_activation(self)
            split += (kept - d) * latent_widths(self)[3]
        if self.experts and not dense:
            moe_whole, moe_split, moe_gathered = moe_token_activation(self, d)
            return (whole + d * h + mask * h + moe_whole, split + moe_split,
                    gathered + moe_gathered)
        # the MLP: its norm's input, its input, a mask; the intermediates
        whole += d * h + kept * h + mask * h
        split += (self._mlp_matrices - 1) * d * f + kept * f
        return whole, split, gathered

    def _rank_sequence(self, parallel):
        """Tokens of a sample one rank holds: the sequence, over the context ranks (an int:
        an execution's check makes ``2 cp`` divide it)."""
        cp = parallel.context_parallel
        return self.sequence // cp if self.sequence % cp == 0 else self.sequence / cp

    def layer_activation(self, samples, recompute=None, *, parallel=None, dense=False):
        """Bytes one layer keeps from its forward to its backward, per microbatch and tensor rank.

        ``samples`` may be an int (exact integer arithmetic where the parts
        divide) or a numpy array. ``recompute`` defaults to the model's; ``dense``: a
        mixture-of-experts model's dense layer.
        """
        parallel = _SERIAL if parallel is None else parallel
        recompute = self.recompute if recompute is None else recompute
        t = parallel.tensor_parallel
        tokens = samples * self._rank_sequence(parallel)
        whole_parts = t if parallel.sequence_parallel else 1
        if recompute == "full":
            return self._divide(self.dtype_bytes * tokens * self.hidden, whole_parts)
        whole, split, gathered = self._token_activation(parallel, dense)
        stored = self._divide(whole * tokens, whole_parts) + self._divide(split * tokens, t)
        if gathered:
            stored = stored + gathered * tokens
        if recompute == "none":
            stored = stored + self._score_bytes(samples, parallel)
        return stored

    def embedding_activation(self, samples, parallel=None):
        """Bytes the first stage keeps for its embedding (the dropout mask), per rank."""
        parallel = _SERIAL if parallel is None else parallel
        parts = parallel.tensor_parallel if parallel.sequence_parallel else 1
        return self._divide(int(self.dropout) * samples * self._rank_sequence(parallel)
                            * self.hidden, parts)

    def output_activation(self, samples, parallel=None):
        """Bytes the last stage keeps for its norm, output layer and fp32 logits, per rank
        (and for the multi-token-prediction modules after it)."""
        parallel = _SERIAL if parallel is None else parallel
        t = parallel.tensor_parallel
        tokens = samples * self._rank_sequence(parallel)
        parts = t if parallel.sequence_parallel else 1
        held = (self._divide(2 * self.dtype_bytes * tokens * self.hidden, parts)
                + self._divide(4 * tokens * self.vocab, t))
        if not self.mtp_layers:
            return held
        # each multi-token-prediction module: its two normed inputs, a layer, the output's
        module = (self._divide(2 * 2 * self.dtype_bytes * tokens * self.hidden, parts)
                  + self.layer_activation(samples, parallel=parallel) + held)
        return held + self.mtp_layers * module

    def weight_grad_kept(self, samples, parallel=None):
        """Bytes of one layer that ``W`` needs: matmul inputs and output gradients, per rank."""
        parallel = _SERIAL if parallel is None else parallel
        d, h, f, t = self.dtype_bytes, self.hidden, self.ffn, parallel.tensor_parallel
        tokens = samples * self._rank_sequence(parallel)
        parts = t if parallel.sequence_parallel else 1
        kept = 1 if parallel.fp8 is not None else d       # the inputs, in FP8 with fp8
        # the attention's products: their inputs and their outputs' gradients
        if self.kv_lora_rank is None:
            wq = self.heads * self.head_dim
            whole, split, gathered = kept * h + d * h, kept * wq + d * (wq + 2 * self.kv_width), 0
        else:
            whole, gathered, split = latent_weight_grad_kept(self, kept)
            whole += d * h
        if self.experts:
            moe = moe_weight_grad_kept(self, d)
            whole, split, gathered = whole + moe[0], split + moe[1], gathered + moe[2]
        else:
            whole += kept * h + d * h
            split += kept * f + d * (2 if self.gated_ffn else 1) * f
        return (self._divide(whole * tokens, parts) + self._divide(split * tokens, t)
                + gathered * tokens)

    def input_grad_release_for(self, parallel=None):
        """Part of a layer's stored activation that ``I`` frees (``W`` frees the rest; a
        mixture-of-experts model's MoE layer)."""
        kept = self.weight_grad_kept(1, parallel)
        stored = self.layer_activation(1, parallel=parallel)
        return max(0.0, 1.0 - kept / stored)

    @property
    def input_grad_release(self):
        """``input_grad_release_for`` without tensor parallelism."""
        return self.input_grad_release_for(None)

    def layer_transient(self, samples, parallel=None):
        """Bytes one layer's backward holds only while it runs (see the module docstring).

        Returns the bytes of the backward (``I`` or ``B``); forwards and ``W``
        hold nothing beyond what is kept.
        """
        parallel = _SERIAL if parallel is None else parallel
        b = np.asarray(samples, dtype=np.float64)
        d, h, s, t = (self.dtype_bytes, self.hidden, self._rank_sequence(parallel),
                      parallel.tensor_parallel)
        tokens = b * s
        up = 2 if self.gated_ffn else 1
        width = (1 + up) * self.ffn if not self.experts or self.dense_layers else 0
        if self.experts:
            width = max(width, moe_transient_width(self))
        largest = d * tokens * width / t
        if not parallel.flash:
            largest = np.maximum(largest, 2.0 * d * self.heads * s * self.keys * b / t)
        buffer = 2.0 * d * tokens * h + largest
        recomputed = (np.asarray(self.layer_activation(b, "none", parallel=parallel), float)
                      - np.asarray(self.layer_activation(b, parallel=parallel), float))
        return buffer + np.maximum(recomputed, 0.0)

    def transfer_bytes(self, samples, parallel=None):
        """Bytes of the activation (or its gradient) passed between stages, per tensor rank.

        ``d*b*s*h``, divided by ``t`` with scatter-gather or sequence parallelism (``s``
        a context rank's tokens with context parallelism).
        """
        parallel = _SERIAL if parallel is None else parallel
        return (self.dtype_bytes * samples * self._rank_sequence(parallel) * self.hidden
                / parallel.transfer_split)

    # ------------------------------------------------------------------ work
    def kernels(self, part="layer", parallel=None):
        """``{"F", "I", "W", "R"}`` kernel lists of one layer, the embedding or the output
        (``dense_layer``: a mixture-of-experts model's dense layer; empty lists for a dense
        model)."""
        parallel = _SERIAL if parallel is None else parallel
        if part == "dense_layer":
            return layer_kernels(self, parallel, dense=True)
        build = {"layer": layer_kernels, "embedding": embedding_kernels,
                 "output": output_kernels}[part]
        return build(self, parallel)

    def _work(self, part, samples, parallel):
        """FLOPs and bytes moved per kind (F, B, I, W) for ``samples``: sums over kernels."""
        b = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        lists = self.kernels(part, parallel)
        flops = np.zeros((4, len(b)))
        nbytes = np.zeros((4, len(b)))
        for kind, phases in ((FORWARD, "F"), (INPUT_GRAD, "RI"), (WEIGHT_GRAD, "W")):
            for phase in phases:
                if not lists[phase]:
                    continue
                work = KernelTable(lists[phase]).work(b)
                compute = ~KernelTable(lists[phase]).collective
                flops[kind] += work["flops"][compute].sum(axis=0)
                nbytes[kind] += (work["read"] + work["written"])[compute].sum(axis=0)
        flops[BACKWARD] = flops[INPUT_GRAD] + flops[WEIGHT_GRAD]
        nbytes[BACKWARD] = nbytes[INPUT_GRAD] + nbytes[WEIGHT_GRAD]
        return flops, nbytes

    def layer_work(self, samples, parallel=None):
        """FLOPs and bytes moved of one layer for microbatches of ``samples`` samples.

        Returns ``(flops, nbytes)``, each a float array of shape ``(4, n)``:
        rows in the table's kind order (F, B, I, W), one column per entry of
        ``samples``; sums over the kernels (:mod:`tabsched.costs.kernels`) of
        one tensor rank, collectives left out.
        """
        return self._work("layer", samples, parallel)

    def embedding_work(self, samples, parallel=None):
        """FLOPs and bytes of the input embedding (first stage), shaped as ``layer_work``."""
        return self._work("embedding", samples, parallel)

    def output_work(self, samples, parallel=None):
        """FLOPs and bytes of the final norm, output layer and loss (last stage)."""
        return self._work("output", samples, parallel)

    # -------------------------------------------------------------- describe
    def summary(self):
        """Key numbers, JSON-ready."""
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden,
                "heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn,
                "gated_ffn": self.gated_ffn, "bias": self.bias, "norm": self.norm,
                "tied_embeddings": self.tied_embeddings,
                "sequence": self.sequence, "vocab": self.vocab, "dtype": self.dtype,
                "microbatch_size": self.microbatch_size, "recompute": self.recompute,
                "bytes_per_param": self.bytes_per_param,
                "parameters": self.parameters, "description": self.description,
                **self._feature_summary()}

    def _feature_summary(self):
        """The fields of wider heads, a mixture of experts and latent attention, where the
        model has them (a plain model's summary is as it always was)."""
        extra = {}
        if self.head_dim * self.heads != self.hidden and self.kv_lora_rank is None:
            extra["head_dim"] = self.head_dim
        if self.experts:
            extra.update({key: getattr(self, key) for key in EXPERT_FIELDS},
                         active_parameters=self.active_parameters)
        if self.kv_lora_rank is not None:
            extra.update({key: getattr(self, key) for key in LATENT_FIELDS})
        return extra


def load_model(reference: str | os.PathLike[str] | TransformerModel) -> TransformerModel:
    """A :class:`TransformerModel` from a preset name or a TOML file with the same keys.

    Keys: ``layers``, ``hidden``, ``heads``, ``sequence``, ``vocab`` (required);
    ``kv_heads``, ``ffn``, ``gated_ffn``, ``dropout``, ``bias``, ``norm``,
    ``tied_embeddings``, ``dtype``, ``microbatch_size``, ``recompute``,
    ``grad_bytes``, ``optimizer_bytes``, ``bytes_per_param``, ``description``.

    >>> load_model("paper-128l").layers
    128
    >>> load_model("paper-12l")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.UnknownNameError: unknown model preset 'paper-12l' (did you mean 'paper-128l'?); valid models: ...
    """
    if isinstance(reference, TransformerModel):
        return reference
    return _presets.build(TransformerModel, reference, "model", _REQUIRED, _OPTIONAL)


def model_presets() -> dict[str, TransformerModel]:
    """The model presets shipped with tabsched, ``{name: TransformerModel}``."""
    return {name: load_model(name) for name in _presets.preset_index()["model"]}


#: How a sequence is cut into slices (:func:`slice_bounds`): ``even`` equal tokens,
#: ``compute`` equal FLOPs (Seq1F1B's computation-wise partition).
PARTITIONS = SLICE_PARTITIONS
#: Tokens a ``compute`` slice bound is a multiple of: FlashAttention's tile of keys
#: (:data:`tabsched.costs.kernels.FLASH_TILE`), so a slice holds whole tiles.
SLICE_GRANULE = int(FLASH_TILE)


def slice_bounds(model, count, partition="even"):
    """Token bounds ``b_0 = 0 < b_1 < ... < b_k = s`` of ``count`` sequence slices:
    slice ``i`` holds tokens ``b_i .. b_{i+1} - 1`` and its queries meet ``b_{i+1}`` keys.

    ``even``: ``b_i = i s/k`` (``count`` must divide the sequence). ``compute``: Seq1F1B's
    computation-wise partition (Sun et al. 2024, arXiv 2406.03488, section 3.3; its
    code's ``split_solver.py`` solves one equation per slice): bounds that give every
    slice the same FLOPs, the linear layers' in proportion to its tokens and the causal
    attention's in proportion to the query-key pairs it computes, so earlier slices
    hold more tokens. The FLOPs are the model's own kernels' (forward and backward of
    every layer and the output layer, FlashAttention, one rank: tensor parallelism
    divides all alike): ``L`` per token and ``P`` per query-key pair, where ``x`` tokens
    from the start compute ``x*x/2 + x*t/2`` pairs with the causal mask's tiles of
    ``t =`` :data:`SLICE_GRANULE` keys (:func:`~tabsched.costs.kernels.causal_share`).
    Each bound solves ``L x + P (x^2/2 + t x/2) = i/k`` of the whole, and is then
    rounded to a multiple of ``t`` tokens (where Seq1F1B's code rounds down to the
    tensor ranks), at least one tile per slice: of the bounds rounded to the nearest,
    down and up (and the even ones where they are multiples of ``t``), the ones whose
    slices' FLOPs are closest (the least max/min). The sequence must hold ``count``
    tiles; the last slice takes what is left.

    >>> gpt = TransformerModel(layers=2, hidden=64, heads=4, sequence=1024, vocab=100)
    >>> slice_bounds(gpt, 2)
    (0, 512, 1024)
    >>> slice_bounds(gpt, 2, "compute")        # attention dominates at h = 64
    (0, 640, 1024)
    """
    if not isinstance(partition, str) or partition not in PARTITIONS:
        raise InvalidParameterError(f"slice partition {_presets.shown_value(partition)} is "
                                    f"not one of {', '.join(PARTITIONS)}")
    count = _presets.integer("sequence slices", count, 1, MAX_SEQUENCE)
    s = model.sequence
    if count == 1:
        return (0, s)
    if partition == "even":
        if s % count:
            raise InvalidParameterError(
                f"sequence slices: {count} does not divide model {model.name}'s sequence "
                f"{s} (a slice must hold whole tokens)")
        return tuple(i * (s // count) for i in range(count + 1))
    if s < count * SLICE_GRANULE:
        raise InvalidParameterError(
            f"slice partition compute: model {model.name}'s sequence {s} cannot give each "
            f"of {count} slices {SLICE_GRANULE} tokens (a FlashAttention tile)")
    return _compute_bounds(model, count)


def _slice_flops(model, tokens, keys):
    """Forward and backward FLOPs of one sample of ``tokens`` queries over ``keys`` keys:
    every layer (a MoE model's dense ones too) and the output layer, FlashAttention."""
    view = model.replace(sequence=tokens, attention_keys=keys)
    flash = Execution(attention="flash")
    dense = view.dense_layers if view.experts else 0
    total = 0.0
    for part, copies in (("layer", view.layers - dense), ("dense_layer", dense),
                         ("output", 1), ("embedding", 1)):
        if copies:
            flops, _ = view._work(part, 1, flash)
            total += copies * float(flops[FORWARD, 0] + flops[BACKWARD, 0])
    return total


@memo(limit=64)
def _compute_bounds(model, count):
    """:func:`slice_bounds`' ``compute`` bounds (checked there), remembered per model."""
    s, t = model.sequence, SLICE_GRANULE
    one, two = _slice_flops(model, t, t), _slice_flops(model, t, 2 * t)
    pair = (two - one) / (t * t)              # FLOPs per query-key pair
    linear = (2 * one - two) / t              # FLOPs per token, less its diagonal tile's

    def before(x):                            # FLOPs of the tokens before x
        return linear * x + pair * (x * x / 2 + t * x / 2)

    def spread(bounds):
        work = np.diff([before(x) for x in bounds])
        return float(work.max() / work.min())

    a, b = pair / 2, linear + pair * t / 2
    targets = [2 * c / (b + np.sqrt(b * b + 4 * a * c))           # a x^2 + b x = c
               for c in (before(s) * i / count for i in range(1, count))]
    top = (s - t) // t * t                    # the last bound leaves a tile at least
    candidates = []
    for rounding in (np.round, np.floor, np.ceil):
        bounds, previous = [0], 0
        for i, x in enumerate(targets, 1):
            bound = max(int(rounding(x / t)) * t, previous + t)
            previous = min(bound, top - (count - 1 - i) * t)
            bounds.append(previous)
        candidates.append(tuple(bounds) + (s,))
    if s % count == 0 and (s // count) % t == 0:
        candidates.append(tuple(i * (s // count) for i in range(count + 1)))
    return min(candidates, key=spread)
