"""The kernels of a transformer layer, of the embedding and of the output layer.

Each operation of a table (``F``, ``I``, ``W``, and the recompute forward that
``I`` runs first) is a list of kernels, each with its FLOPs, bytes read, bytes
written and class, as Calculon lists them (Isaev et al. 2023, "Calculon: a
methodology and tool for high-level co-design of systems and large language
models", section 3): **matrix** kernels (matrix products, on tensor cores),
**vector** kernels (element-wise work, timed by its bytes) and **collective**
kernels (tensor-parallel all-reduce, reduce-scatter, all-gather: a message
size and a ring). The system times each kernel by its own roofline
(:meth:`tabsched.costs.system.System.kernel_times`) and the operation costs
their sum (Williams, Waterman and Patterson 2009 define the roofline per
kernel).

Everything is for one tensor rank and one sample (``b = 1``) of ``s`` tokens,
as ``fixed + per_sample * b``: weights are read once whatever ``b``, the rest
grows with it. Notation: ``h`` hidden, ``a`` heads, ``hk`` width of K and of V
(``kv_heads * h/a``), ``f`` ffn, ``k = 2`` matrices in the MLP's first product
for a gated MLP (gate and up), else 1; ``V`` vocabulary; ``d`` bytes per
element, ``g`` bytes per gradient element, ``m = 1`` byte per dropout-mask
element with dropout, else 0; ``t`` tensor ranks; ``sn = s/t`` with sequence
parallelism, else ``s`` (the tokens norms and dropouts touch).

Forward of a layer (Megatron-LM's order and fusions: fused bias-GeLU, fused
scale-mask-softmax, fused bias-dropout-add; Shoeybi et al. 2019, Fig. 3)
    ``norm1`` (read and write ``d*sn*h``); with sequence parallelism
    ``all_gather`` of ``d*s*h``; ``qkv`` (``2*s*h*(h+2hk)/t`` FLOPs; reads the
    input ``d*s*h`` and its weights, writes ``d*s*(h+2hk)/t``); eager
    attention: ``scores`` (``2*s*s*h/t``; reads Q and K, writes ``d*a*s*s/t``),
    ``softmax`` (reads and writes the scores), ``attention_dropout`` (reads
    them, writes them and a mask), ``attention_over_values`` (``2*s*s*h/t``;
    reads the probabilities and V, writes ``d*s*h/t``), or ``flash_attention``
    (``4*s*s*h/t`` times the causal mask's share of tiles, :func:`causal_share`; reads
    Q, K, V, writes ``d*s*h/t``: no ``s*s`` traffic);
    ``out_proj`` (``2*s*h*h/t``; writes the partial sums ``d*s*h``); the tensor
    ``all_reduce`` (``reduce_scatter`` with sequence parallelism) of
    ``d*s*h``; ``bias_dropout_add`` (reads the branch and the residual, writes
    the sum and a mask); then the same for the MLP: ``norm2``, (``all_gather``),
    ``mlp_up`` (``2*s*h*k*f/t``), ``activation`` (GeLU, or SwiGLU's
    ``silu(gate) * up``; reads ``d*s*k*f/t``, writes ``d*s*f/t``),
    ``mlp_down`` (``2*s*f*h/t``), ``all_reduce``, ``bias_dropout_add``.
Input-grad ``I`` (the same kernels backwards)
    each matrix product's data gradient (the same FLOPs as its forward; reads
    the output gradient and the weights, writes the input gradient); eager
    attention: ``attention_over_values_bwd`` (dP and dV, ``4*s*s*h/t``),
    ``attention_dropout_bwd``, ``softmax_bwd`` (reads dP and the probabilities),
    ``scores_bwd`` (dQ and dK, ``4*s*s*h/t``); flash: ``flash_attention_bwd``
    (``10*s*s*h/t`` times the causal share: FlashAttention's backward recomputes
    the scores ``Q K^T`` and then runs dV, dP, dQ and dK, five products where the
    forward has two; Dao 2023, section 3.1.2, Algorithm 2);
    the norms' backward (two passes over the gradient and the input, then the
    residual's gradient added: :func:`norm_backward`), and the collectives that mirror
    the forward's: an ``all_reduce`` after each column-parallel product
    (``all_gather`` before each row-parallel product and ``reduce_scatter``
    after each column-parallel one with sequence parallelism).
Weight-grad ``W``
    each matrix product's weight gradient (the same FLOPs; reads its input and
    output gradient, reads and writes the accumulated gradient ``g*P``); with
    ``bias``, each bias's gradient, a sum of its product's output gradient over
    the tokens (``*_bias_grad``).
Recompute forward (run before ``I``)
    ``selective``: the attention core of the forward again (eager only: a
    fused FlashAttention recomputes inside its own backward); ``full``: the
    whole forward, collectives included.
Context parallelism (``Execution.context_parallel`` *cp*, fused attention only)
    ``s`` is a context rank's ``sequence / cp`` tokens in every kernel; the fused
    attention's queries meet all ``S = sequence`` keys (``4*s*S*h/t`` FLOPs times the
    causal share: with causal load balancing each rank does ``1/cp`` of the whole), and the keys and values come
    over the context group (``_context_exchange``: ``cp_kv_ring`` beside the attention,
    ``cp_kv_all_gather`` before it, or Ulysses' ``cp_a2a_in`` and ``cp_a2a_out``).
FP8 (``Execution.fp8``: Transformer Engine's recipes, Micikevicius et al. 2022)
    The layer's linear products (``qkv``, ``out_proj``, ``mlp_up``, ``mlp_down``,
    their data and weight gradients) read FP8 operands (one byte per element; the
    forward in E4M3, the gradients in E5M2) and run at the system's FP8 rate and FP8
    GEMM table; their outputs stay in the model's dtype, as do the attention core's
    products, the norms, the embedding and the output layer. Each FP8 input is cast
    once, to FP8 and to its FP8 transpose (Hopper's FP8 products take only the TN
    layout): by its producer where TE fuses the cast (the norms before ``qkv`` and
    ``mlp_up`` without sequence parallelism, the activation and its backward), else
    by a ``*_cast`` kernel (the attention output; the gradients coming into
    ``mlp_down``, ``out_proj`` and ``qkv``; the gathered norm outputs with sequence
    parallelism). ``tensorwise`` scaling reads each tensor once more for its amax
    (``*_amax``) and fuses no cast. The weights' FP8 copies are made once per
    iteration (with the optimizer step: :class:`tabsched.costs.ModelCosts`); the
    amax history's update and its small all-reduce are left out.
Embedding (first stage) and output (last stage, with the loss and the multi-token-
prediction modules): :mod:`tabsched.costs.ends`.

FLOPs are counted for matrix products only (one multiply-add = 2 FLOPs), so
the totals are Narayanan et al.'s closed form (2021, appendix); the bias adds
and O(h) parameters are left out.

>>> from tabsched.costs.transformer import TransformerModel
>>> gpt = TransformerModel(layers=2, hidden=64, heads=4, sequence=16, vocab=100)
>>> [kernel.name for kernel in layer_kernels(gpt)["F"]][:5]
['layernorm1', 'qkv', 'scores', 'softmax', 'attention_dropout']
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from tabsched.costs.collectives import COLLECTIVES
from tabsched.costs.experts import load_factor, moe_forward, moe_input_grad, moe_weight_grad
from tabsched.costs.latent import (latent_forward, latent_input_grad, latent_weight_grad,
                                   latent_widths)
from tabsched.costs.placement import GROUPS
from tabsched.execution import Execution

__all__ = ["Kernel", "KernelTable", "layer_kernels", "norm_backward",
           "CLASSES", "MATRIX", "VECTOR", "COLLECTIVE", "PHASES"]

MATRIX, VECTOR, COLLECTIVE = "matrix", "vector", "collective"
CLASSES = (MATRIX, VECTOR, COLLECTIVE)
#: The kernel lists of an operation: forward, input-grad, weight-grad, and the
#: recompute forward that the input-grad runs first.
PHASES = ("F", "I", "W", "R")


@dataclass(frozen=True)
class Kernel:
    """One kernel: ``(fixed, per_sample)`` pairs of FLOPs, bytes read and bytes written.

    A matrix kernel's ``outputs`` is the number of elements it produces (what
    its tiles cover; see ``matrix_wave`` in :mod:`tabsched.costs.system`). A
    collective kernel's ``message`` is the buffer it reduces or gathers (the
    full ``s*b*h`` activation, not one rank's part), in ``(fixed,
    per_sample)`` bytes; its ``collective`` names the ring algorithm, its
    ``group`` the parallel group it runs over (one of
    :data:`~tabsched.costs.placement.GROUPS`: the placement says which links
    that group crosses), and ``hides_behind`` names the kernel it runs beside
    when both are in one operation (Megatron-LM launches it asynchronously
    before that kernel).

    ``fp8``: a linear product run in FP8 (its operands one byte each, timed at the
    system's FP8 rate: :meth:`tabsched.costs.system.System.fp8_view`).

    A matrix kernel's ``gemms`` are the matrix products it runs, as a system's
    GEMM table reads them (:mod:`tabsched.costs.gemm`): each ``(m, n, k,
    batch)`` of ``(fixed, per_sample)`` pairs, for one tensor rank (the
    dimensions after tensor parallelism, as the product really runs), ``C[m, n]
    = A[m, k] @ B[k, n]``, ``batch`` products of that shape (attention's
    per-head products: ``b*a/t``), so that the kernel's FLOPs are the sum of
    ``2*m*n*k*batch``. Empty for a kernel that is not a product of matrices
    (FlashAttention's fused kernel).
    """

    name: str
    cls: str
    flops: tuple = (0.0, 0.0)
    read: tuple = (0.0, 0.0)
    written: tuple = (0.0, 0.0)
    collective: str | None = None
    message: tuple = (0.0, 0.0)
    outputs: tuple = (0.0, 0.0)
    hides_behind: str | None = None
    group: str | None = None
    gemms: tuple = ()
    fp8: bool = False

    def at(self, samples):
        """``(flops, read, written, message)`` for microbatches of ``samples`` samples."""
        samples = np.asarray(samples, dtype=np.float64)
        return tuple(pair[0] + pair[1] * samples
                     for pair in (self.flops, self.read, self.written, self.message))


class KernelTable:
    """A list of kernels as arrays, evaluated for many microbatch sizes at once."""

    def __init__(self, kernels):
        self.kernels = list(kernels)
        self.names = [kernel.name for kernel in self.kernels]
        cls = np.array([kernel.cls for kernel in self.kernels], dtype=object)
        self.matrix = cls == MATRIX
        self.collective = cls == COLLECTIVE
        self.kinds = [kernel.collective for kernel in self.kernels]
        self.groups = [kernel.group for kernel in self.kernels]
        self.hides_behind = [kernel.hides_behind for kernel in self.kernels]
        self.fp8 = np.array([kernel.fp8 for kernel in self.kernels], dtype=bool)
        self._coefficients = {
            field: np.array([getattr(kernel, field) for kernel in self.kernels],
                            dtype=np.float64).reshape(len(self.kernels), 2)
            for field in ("flops", "read", "written", "message", "outputs")}

    def __len__(self):
        return len(self.kernels)

    def work(self, samples):
        """``{field: array (kernels x sizes)}``: flops, read, written, message, outputs."""
        samples = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        return {field: coefficient[:, :1] + coefficient[:, 1:] * samples[None, :]
                for field, coefficient in self._coefficients.items()}

    def gemm_coefficients(self):
        """``(kernels, slots, 4, 2)``: the ``(fixed, per_sample)`` pairs of ``m, n, k,
        batch`` of each kernel's products (:attr:`Kernel.gemms`; ``slots`` the most any
        kernel has, zeros in an unused slot). Built on demand: only a system with a GEMM
        table asks (:func:`tabsched.costs.model_work.gemm_coefficients` remembers it)."""
        where = [(index, slot) for index, kernel in enumerate(self.kernels)
                 for slot in range(len(kernel.gemms))]
        slots = 1 + max((slot for _, slot in where), default=0)
        coefficients = np.zeros((len(self.kernels), slots, 4, 2))
        if where:
            index, slot = np.array(where).T
            coefficients[index, slot] = [gemm for kernel in self.kernels for gemm in kernel.gemms]
        return coefficients

    def gemm_shapes(self, samples, coefficients=None):
        """``(kernels, slots, 4, sizes)``: ``m, n, k, batch`` of each kernel's products for
        microbatches of ``samples`` (batch 0 in an unused slot), from ``coefficients``
        (:meth:`gemm_coefficients`, built here if not given)."""
        samples = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        if coefficients is None:
            coefficients = self.gemm_coefficients()
        return coefficients[..., :1] + coefficients[..., 1:] * samples


# ---------------------------------------------------------------- builders
_SERIAL = Execution()


def _shape(model, parallel, dense=False):
    """The dimensions the kernel builders read, for one tensor rank and one sample;
    ``dense``: a mixture-of-experts model's dense layer (its first ``dense_layers``)."""
    parallel = _SERIAL if parallel is None else parallel
    t = parallel.tensor_parallel
    tokens = float(model.sequence) / parallel.context_parallel      # a context rank's
    wq, wk, wv, wo = (float(width) for width in latent_widths(model))
    x = dict(
        h=float(model.hidden), s=tokens, S=float(model.keys), d=float(model.dtype_bytes),
        g=float(model.grad_bytes), t=float(t), hk=float(model.kv_width), f=float(model.ffn),
        k=2.0 if model.gated_ffn else 1.0, a=float(model.heads), V=float(model.vocab),
        m=1.0 if model.dropout else 0.0, bias=model.bias,
        sn=tokens / t if parallel.sequence_parallel else tokens,
        sp=parallel.sequence_parallel, flash=parallel.flash, fp8=parallel.fp8,
        cp=parallel.context_exchange, wq=wq, wk=wk, wv=wv, wo=wo, mla=None,
        moe=bool(model.experts) and not dense,
        # a sequence slice's keys (TransformerModel.sliced): its queries meet more tokens
        # than its own; None for a whole sequence (one context rank's keys are its own)
        kv=None if model.attention_keys is None else float(model.attention_keys))
    if model.kv_lora_rank is not None:
        x["mla"] = dict(qr=float(model.q_lora_rank or 0), kvr=float(model.kv_lora_rank),
                        dr=float(model.qk_rope_head_dim),
                        ukv=float(model.heads * (model.qk_nope_head_dim + model.v_head_dim)))
    if x["moe"]:
        x.update(E=float(model.experts), topk=float(model.top_k), fe=float(model.expert_ffn),
                 shared=float(model.shared_experts), load=float(load_factor(model)),
                 e=float(parallel.expert_parallel))
    return x, parallel


def _matrix(name, flops, weights, reads, writes, element, gemms=()):
    """A matrix product: ``flops``, ``reads`` and ``writes`` per sample; ``weights`` bytes once.

    Its output has ``writes / element`` elements; ``gemms`` are its products' shapes
    (:func:`_rows`, :func:`_heads`).
    """
    return Kernel(name, MATRIX, (0.0, flops), (weights, reads), (0.0, writes),
                  outputs=(0.0, writes / element), gemms=tuple(gemms))


def _rows(s, n, k):
    """One product over a microbatch's tokens: ``m = s*b`` rows, ``n`` and ``k`` fixed."""
    return ((0.0, s), (n, 0.0), (k, 0.0), (1.0, 0.0))


def _weights(m, n, s):
    """A weight gradient ``m x n``: its contraction runs over the ``k = s*b`` tokens."""
    return ((m, 0.0), (n, 0.0), (0.0, s), (1.0, 0.0))


def _heads(count, m, n, k):
    """``count`` products per sample (one per attention head of the rank) of ``m x n x k``."""
    return ((m, 0.0), (n, 0.0), (k, 0.0), (0.0, count))


def _vector(name, reads, writes):
    return Kernel(name, VECTOR, (0.0, 0.0), (0.0, reads), (0.0, writes))


def _collective(name, collective, message, hides_behind=None, group="tensor"):
    """A collective over ``group``: every collective inside a layer, the embedding and
    the output layer runs over the tensor group (Megatron-LM's vocabulary-parallel
    embedding and cross entropy reduce over the tensor ranks too)."""
    assert collective in COLLECTIVES and group in GROUPS
    return Kernel(name, COLLECTIVE, collective=collective, message=(0.0, message),
                  hides_behind=hides_behind, group=group)


def _kernel(name, cls, flops, read, written, **fields):
    return Kernel(name, cls, flops, read, written, **fields)


def _forward(x, norm_name):
    """Forward kernels of one layer (see the module docstring)."""
    h, s, d, t, hk = x["h"], x["s"], x["d"], x["t"], x["hk"]
    sn, wo = x["sn"], x["wo"]
    gather = [_collective("all_gather", "all_gather", d * s * h)] if x["sp"] else []
    kernels = [_vector(f"{norm_name}1", d * sn * h, d * sn * h)]
    if x["mla"] is not None:
        kernels += latent_forward(x, _BUILD)
    else:
        qkv = x["wq"] + 2 * hk           # the query's width and the keys' and values'
        kernels += [*gather,
                    _matrix("qkv", 2 * s * h * qkv / t, d * h * qkv / t, d * s * h,
                            d * s * qkv / t, d, [_rows(s, qkv / t, h)])]
    kernels += attention_forward(x)
    kernels += [_matrix("out_proj", 2 * s * wo * h / t, d * wo * h / t, d * s * wo / t,
                        d * s * h, d, [_rows(s, h, wo / t)]),
                _combine(x), _residual(x)]
    if x["moe"]:
        return kernels + moe_forward(x, norm_name, _BUILD)
    return kernels + [_vector(f"{norm_name}2", d * sn * h, d * sn * h),
                      *_mlp(x, x["f"], "mlp"), _residual(x)]


def _residual(x, branches=1):
    """The fused bias-dropout-add after a branch (a plain residual add without dropout)."""
    d, sn, h, m = x["d"], x["sn"], x["h"], x["m"]
    return _vector("bias_dropout_add" if m else "residual_add", (1 + branches) * d * sn * h,
                   d * sn * h + m * sn * h)


def _mlp(x, f, prefix):
    """A tensor-parallel MLP of width ``f``: the dense layer's (``mlp_up``, ``activation``,
    ``mlp_down``), or a mixture of experts' shared experts (``shared_up`` ...), with the
    all-gather before it and the all-reduce (reduce-scatter) after it."""
    h, s, d, t, k = x["h"], x["s"], x["d"], x["t"], x["k"]
    gather = [_collective("all_gather", "all_gather", d * s * h)] if x["sp"] else []
    activation = "activation" if prefix == "mlp" else f"{prefix}_activation"
    return [*gather,
            _matrix(f"{prefix}_up", 2 * s * h * k * f / t, d * h * k * f / t, d * s * h,
                    d * s * k * f / t, d, [_rows(s, k * f / t, h)]),
            _vector(activation, d * s * k * f / t, d * s * f / t),
            _matrix(f"{prefix}_down", 2 * s * f * h / t, d * f * h / t, d * s * f / t,
                    d * s * h, d, [_rows(s, h, f / t)]),
            _combine(x)]


def _mlp_bwd(x, f, prefix):
    """The data gradients of :func:`_mlp`, in the order the backward runs them."""
    h, s, d, t, k = x["h"], x["s"], x["d"], x["t"], x["k"]
    gather = [_collective("all_gather", "all_gather", d * s * h)] if x["sp"] else []
    activation = "activation_bwd" if prefix == "mlp" else f"{prefix}_activation_bwd"
    return [*gather,
            _matrix(f"{prefix}_down_dgrad", 2 * s * f * h / t, d * f * h / t, d * s * h,
                    d * s * f / t, d, [_rows(s, f / t, h)]),
            _vector(activation, d * s * f / t + d * s * k * f / t, d * s * k * f / t),
            *_input_gather(x, f"{prefix}_up_dgrad"),
            _matrix(f"{prefix}_up_dgrad", 2 * s * k * f * h / t, d * h * k * f / t,
                    d * s * k * f / t, d * s * h, d, [_rows(s, h, k * f / t)]),
            _backward_combine(x, f"{prefix}_up_wgrad")]


def _combine(x):
    """The collective after a row-parallel product: all-reduce, or reduce-scatter with SP."""
    name = "reduce_scatter" if x["sp"] else "all_reduce"
    return _collective(name, name, x["d"] * x["s"] * x["h"])


def attention_forward(x):
    """The attention core's forward kernels (what selective recomputation runs again).

    Widths over all heads: ``wq`` of the queries and keys' scores, ``wk`` and ``wv`` of
    the keys and values read, ``wo`` of the output (``h``, ``hk``, ``hk``, ``h`` for
    grouped-query attention; :func:`tabsched.costs.latent.latent_widths`)."""
    s, d, t = x["s"], x["d"], x["t"]
    wq, wk, wv, wo = x["wq"], x["wk"], x["wv"], x["wo"]
    if x["flash"]:
        S = x["S"]      # the keys a rank's queries meet: the whole sequence over its ring
        reads = (d * s * (wq + wk + wv) / t if x["cp"] == "a2a"
                 else d * (s * wq + S * (wk + wv)) / t)
        return [*_context_exchange(x, "F"),
                _matrix("flash_attention", 2 * s * S * (wq + wo) * causal_share(x) / t, 0.0,
                        reads, d * s * wo / t, d),
                *_context_exchange(x, "F", after=True)]
    return _slice_attention_forward(x)


#: Key columns per tile of a fused attention kernel: FlashAttention-2 runs blocks of 128
#: query rows by 64 or 128 key columns, FlashAttention-3 and cuDNN's fused attention 128 by
#: 128 for head widths up to 128 (Dao 2023, "FlashAttention-2", section 3.1 and its block-
#: size choice; Shah et al. 2024, "FlashAttention-3", section 4). The causal mask skips
#: every tile wholly above the diagonal and computes the ones it crosses in full.
FLASH_TILE = 128.0


def causal_share(x):
    """The share of the ``s x S`` score square a fused causal attention kernel computes.

    Tiles of :data:`FLASH_TILE` keys wholly above the diagonal are skipped (Dao 2023,
    section 3.1.1, "Causal masking": 1.7-1.8x faster than without the mask). A whole
    sequence of ``N`` tiles computes ``N (N + 1) / 2`` of ``N^2``; a context rank with
    Megatron-LM's causal load balancing (two chunks of the sequence, one from each end)
    does ``1/cp`` of that, the same share of its ``s x S``. A sequence slice's ``s``
    queries sit at the end of its ``kv`` keys: the ``kv - s`` earlier keys in full, the
    last ``s`` as a triangle (Seq1F1B, Sun et al. 2024, section 3.2).

    >>> round(causal_share({"s": 2048.0, "S": 2048.0, "kv": None}), 4)   # 16 tiles: 17/32
    0.5312
    >>> causal_share({"s": 1024.0, "S": 2048.0, "kv": 2048.0})  # slice 2 of 2: (64 + 36)/128
    0.78125
    """
    tile = FLASH_TILE
    if x["kv"] is None:
        n = math.ceil(x["S"] / tile)
        return (n + 1) / (2 * n)
    queries, keys = math.ceil(x["s"] / tile), math.ceil(x["kv"] / tile)
    queries = min(queries, keys)
    return (queries * (keys - queries) + queries * (queries + 1) / 2) / (queries * keys)


def _slice_attention_forward(x):
    """The eager attention core: ``s`` queries over ``kv`` keys (a sequence slice's) or,
    unsliced, over all ``s``.

    The scores, the softmax, the dropout and the product with the values, over a score
    matrix ``s x kv`` (Seq1F1B, Sun et al. 2024, section 3.2: slice ``i`` of ``k`` has ``s/k`` queries
    and the ``(i+1) s/k`` keys and values of slices ``0 .. i``, read from the key-value
    cache the earlier slices left); with ``kv == s`` the counts are the whole sequence's.
    """
    s, d, t, m, a = x["s"], x["d"], x["t"], x["m"], x["a"]
    kv = s if x["kv"] is None else x["kv"]
    wq, wk, wv, wo = x["wq"], x["wk"], x["wv"], x["wo"]
    scores = d * a * s * kv / t
    heads = a / t
    kernels = [_matrix("scores", 2 * s * kv * wq / t, 0.0, d * (s * wq + kv * wk) / t, scores,
                       d, [_heads(heads, s, kv, wq / a)]),
               _vector("softmax", scores, scores)]
    if m:
        kernels.append(_vector("attention_dropout", scores, scores + m * a * s * kv / t))
    kernels.append(_matrix("attention_over_values", 2 * s * kv * wo / t, 0.0,
                           scores + d * kv * wv / t, d * s * wo / t, d,
                           [_heads(heads, s, wo / a, kv)]))
    return kernels


def _slice_attention_backward(x):
    """The eager attention core's data gradients for a sequence slice (``s`` queries over
    ``kv`` keys): :func:`_input_grad`'s products with the score matrix ``s x kv``; the
    key and value gradients cover all ``kv`` keys (they flow back into the earlier
    slices' cache, Seq1F1B section 3.1)."""
    s, kv, d, t, m, a = x["s"], x["kv"], x["d"], x["t"], x["m"], x["a"]
    wq, wk, wv, wo = x["wq"], x["wk"], x["wv"], x["wo"]
    scores = d * a * s * kv / t
    heads = a / t
    # dP = dO @ V^T (s x kv over a head's width), dV = P^T @ dO (kv x width over s)
    kernels = [_matrix("attention_over_values_bwd", 4 * s * kv * wo / t, 0.0,
                       d * (s * wo + kv * wv) / t + scores, scores + d * kv * wv / t, d,
                       [_heads(heads, s, kv, wo / a), _heads(heads, kv, wo / a, s)])]
    if m:
        kernels.append(_vector("attention_dropout_bwd", scores + m * a * s * kv / t, scores))
    return kernels + [
        _vector("softmax_bwd", 2 * scores, scores),
        # dQ = dS @ K (s x width over kv), dK = dS^T @ Q (kv x width over s)
        _matrix("scores_bwd", 4 * s * kv * wq / t, 0.0, scores + d * (s * wq + kv * wk) / t,
                d * (s * wq + kv * wk) / t, d,
                [_heads(heads, s, wq / a, kv), _heads(heads, kv, wq / a, s)])]


def _input_grad(x, norm_name):
    """Input-grad kernels of one layer, in the order the backward runs them."""
    h, s, d, t, hk = x["h"], x["s"], x["d"], x["t"], x["hk"]
    sn, m, a = x["sn"], x["m"], x["a"]
    wq, wk, wv, wo = x["wq"], x["wk"], x["wv"], x["wo"]
    # the forward's collectives mirrored: after a row-parallel product's data gradient,
    # nothing (an all-gather of the gradient with sequence parallelism, synchronous); after a
    # column-parallel one, an all-reduce (reduce-scatter) that Megatron-LM launches
    # asynchronously beside the weight gradient; with sequence parallelism the input a
    # column-parallel weight gradient needs is all-gathered again beside the data gradient
    # (megatron/mpu/layers.py, LinearWithGradAccumulationAndAsyncCommunication.backward)
    gather = [_collective("all_gather", "all_gather", d * s * h)] if x["sp"] else []
    dropout_bwd = _vector("bias_dropout_add_bwd" if m else "residual_add_bwd",
                          d * sn * h + m * sn * h, d * sn * h)
    if x["moe"]:
        kernels = moe_input_grad(x, norm_name, _BUILD)
    else:
        kernels = [dropout_bwd, *_mlp_bwd(x, x["f"], "mlp"),
                   *norm_backward(x, f"{norm_name}2")]
    kernels += [dropout_bwd, *gather,
                _matrix("out_proj_dgrad", 2 * s * h * wo / t, d * wo * h / t, d * s * h,
                        d * s * wo / t, d, [_rows(s, wo / t, h)])]
    if x["flash"]:
        S = x["S"]
        keys = s if x["cp"] == "a2a" else S     # Ulysses: S tokens of a cp-th of the heads
        kernels += [*_context_exchange(x, "I"),
                    _matrix("flash_attention_bwd",
                            2 * s * S * (3 * wq + 2 * wo) * causal_share(x) / t, 0.0,
                            d * (s * (wq + 2 * wo) + keys * (wk + wv)) / t,
                            d * (s * wq + keys * (wk + wv)) / t, d),
                    *_context_exchange(x, "I", after=True)]
    elif x["kv"] is not None:
        kernels += _slice_attention_backward(x)
    else:
        scores = d * a * s * s / t
        heads = a / t
        # dP = dO @ V^T (s x s, over a head's width) and dV = P^T @ dO (s x width, over s)
        kernels.append(_matrix("attention_over_values_bwd", 4 * s * s * wo / t, 0.0,
                               d * s * (wo + wv) / t + scores, scores + d * s * wv / t, d,
                               [_heads(heads, s, s, wo / a), _heads(heads, s, wo / a, s)]))
        if m:
            kernels.append(_vector("attention_dropout_bwd", scores + m * a * s * s / t, scores))
        kernels += [_vector("softmax_bwd", 2 * scores, scores),
                    # dQ = dS @ K and dK = dS^T @ Q: two products of s x width over s
                    _matrix("scores_bwd", 4 * s * s * wq / t, 0.0, scores + d * s * (wq + wk) / t,
                            d * s * (wq + wk) / t, d, [_heads(2 * heads, s, wq / a, s)])]
    if x["mla"] is not None:
        kernels += latent_input_grad(x, _BUILD)
    else:
        qkv = wq + 2 * hk
        kernels += [*_input_gather(x, "qkv_dgrad"),
                    _matrix("qkv_dgrad", 2 * s * qkv * h / t, d * h * qkv / t,
                            d * s * qkv / t, d * s * h, d, [_rows(s, h, qkv / t)]),
                    _backward_combine(x, "qkv_wgrad")]
    return kernels + norm_backward(x, f"{norm_name}1")


def norm_backward(x, name, residual=True):
    """The backward of a norm over ``sn`` tokens of width ``h`` whose input is also a
    residual branch's (``residual``), as the fused kernels Megatron-LM and PyTorch run it.

    Megatron-LM's ``fused_kernels/layer_norm_cuda_kernel.cu`` (apex's, as in the 2022
    runs; PyTorch's own ``layer_norm_kernel.cu`` is built the same way) makes two passes
    over the output gradient and the input: ``cuComputePartGradGammaBeta`` (then a small
    reduction of its partial sums) for the scale's and shift's gradients, and
    ``cuComputeGradInput`` for the input's. The norm's input is also the residual
    stream, so autograd adds its two gradients (the residual's and the norm's) in a third
    kernel. Per token: ``{name}_bwd_weight`` reads ``dy`` and ``x``; ``{name}_bwd``
    reads them again and writes ``dx``; ``{name}_residual_grad`` reads ``dx`` and the
    residual's gradient and writes their sum. The partial sums (``16 x h`` floats) are
    left out. Transformer Engine's fused norm backward makes one pass; it is not told
    apart here."""
    d, sn, h = x["d"], x["sn"], x["h"]
    kernels = [_vector(f"{name}_bwd_weight", 2 * d * sn * h, 0.0),
               _vector(f"{name}_bwd", 2 * d * sn * h, d * sn * h)]
    if residual:
        kernels.append(_vector(f"{name}_residual_grad", 2 * d * sn * h, d * sn * h))
    return kernels


def _bias_grad(x, name, width, tokens):
    """A bias's gradient: the sum over the rank's ``tokens`` of its product's output
    gradient, ``width`` wide (Megatron-LM: ``grad_output.sum(dim=0)`` in
    ``LinearWithGradAccumulationAndAsyncCommunication.backward`` for a column-parallel
    product's own bias; autograd's reduction of the broadcast bias of the fused bias-GeLU
    and bias-dropout-add for the biases Megatron-LM adds there, ``skip_bias_add``). Reads
    the gradient once; the ``width`` sums written are left out. None without biases."""
    if not x["bias"]:
        return []
    return [_vector(f"{name}_bias_grad", x["d"] * tokens * width, 0.0)]


def _context_exchange(x, phase, after=False):
    """The context-parallel exchange of keys and values beside (``p2p``) or before
    (``allgather``) the fused attention, over the context group; none without context
    parallelism; ``after``: what follows the attention (``a2a``'s second all-to-all).
    Ulysses (``a2a``) all-to-alls a rank's part of the queries, keys and values (the
    message of one rank: nccl-tests' all-to-all size) before the attention, and the output
    after it; its backward the other way round; none of it hidden. A rank meets every other
    rank's keys and values once: the ring's ``cp - 1`` steps move what an all-gather of the
    whole ``S`` keys' K and V moves (``d*S*2hk/t`` bytes; ``d*S*(wk+wv)/t`` with MLA), so they are priced as one (each
    step's send beside the previous block's attention: the pair model of ``hides_behind``).
    The backward passes the key-value blocks again and their gradients the other way (ring
    attention's backward, or ``allgather``'s all-gather and reduce-scatter of dK, dV):
    twice those bytes."""
    exchange = x["cp"]
    if exchange is None:
        return []
    if exchange == "a2a":
        # a rank's queries, keys and values in, its output back (forward); the output's
        # gradient in, those of the queries, keys and values back (backward)
        d, s, t = x["d"], x["s"], x["t"]
        qkv, out = d * s * (x["wq"] + x["wk"] + x["wv"]) / t, d * s * x["wo"] / t
        first, then = (qkv, out) if phase == "F" else (out, qkv)
        name = "cp_a2a" if phase == "F" else "cp_a2a_bwd"
        return [_collective(f"{name}_{'out' if after else 'in'}", "all_to_all",
                            then if after else first, group="context")]
    if after:
        return []
    kv = x["d"] * x["S"] * (x["wk"] + x["wv"]) / x["t"]
    if exchange == "p2p":
        if phase == "F":
            return [_collective("cp_kv_ring", "all_gather", kv, "flash_attention",
                                group="context")]
        return [_collective("cp_kv_ring_bwd", "all_gather", 2 * kv, "flash_attention_bwd",
                            group="context")]
    if phase == "F":
        return [_collective("cp_kv_all_gather", "all_gather", kv, group="context")]
    return [_collective("cp_kv_all_gather", "all_gather", kv, group="context"),
            _collective("cp_dkv_reduce_scatter", "reduce_scatter", kv, group="context")]


def _backward_combine(x, partner):
    """The data gradient's all-reduce (reduce-scatter) after a column-parallel product."""
    name = "reduce_scatter" if x["sp"] else "all_reduce"
    return _collective(name, name, x["d"] * x["s"] * x["h"], hides_behind=partner)


def _input_gather(x, partner):
    """With sequence parallelism: the all-gather of a column-parallel product's input again."""
    if not x["sp"]:
        return []
    return [_collective("all_gather_input", "all_gather", x["d"] * x["s"] * x["h"],
                        hides_behind=partner)]


def _weight_grad(x):
    """Weight-grad kernels of one layer (each accumulates into the gradient buffer)."""
    h, hk, f, t = x["h"], x["hk"], x["f"], x["t"]
    if x["moe"]:
        kernels = moe_weight_grad(x, _BUILD)
    else:
        kernels = _mlp_wgrad(x, f, "mlp")
    kernels.append(_wgrad(x, "out_proj_wgrad", x["wo"], h, x["wo"] / t, h))
    # the row-parallel product's bias is added after its reduction, on the rank's sn tokens
    kernels += _bias_grad(x, "out_proj", h, x["sn"])
    if x["mla"] is not None:
        return kernels + latent_weight_grad(x, _BUILD)
    qkv = x["wq"] + 2 * hk
    return kernels + [_wgrad(x, "qkv_wgrad", h, qkv, h, qkv / t),
                      *_bias_grad(x, "qkv", qkv / t, x["s"])]


def _wgrad(x, name, rows, cols, inputs, grads, split=True):
    """A weight gradient ``rows x cols`` (split over the tensor ranks, or, ``split``
    false, replicated on each): ``dW = X^T @ dY``, the rank's ``inputs`` columns of X and
    ``grads`` columns of dY, contracted over the rank's tokens (``sn`` for a replicated
    product, which runs on a rank's own tokens)."""
    d, g = x["d"], x["g"]
    s = x["s"] if split else x["sn"]
    params = rows * cols / (x["t"] if split else 1.0)
    return Kernel(name, MATRIX, (0.0, 2 * s * params), (g * params, d * s * (inputs + grads)),
                  (g * params, 0.0), outputs=(params, 0.0),
                  gemms=(_weights(inputs, grads, s),))


def _mlp_wgrad(x, f, prefix):
    """The weight gradients of :func:`_mlp`: its down product's, then its up product's."""
    h, k, t = x["h"], x["k"], x["t"]
    return [_wgrad(x, f"{prefix}_down_wgrad", f, h, f / t, h),
            *_bias_grad(x, f"{prefix}_down", h, x["sn"]),
            _wgrad(x, f"{prefix}_up_wgrad", h, k * f, h, k * f / t),
            *_bias_grad(x, f"{prefix}_up", k * f / t, x["s"])]


def layer_kernels(model, parallel=None, dense=False):
    """``{"F", "I", "W", "R"}``: kernel lists of one layer for one tensor rank.

    ``R`` is the recompute forward of the model's ``recompute`` mode. A mixture-of-experts
    model's layers are its MoE layers, or with ``dense`` its first ``dense_layers``
    (empty lists for a dense model, whose layers are all alike).
    """
    if dense and not model.experts:
        return {phase: [] for phase in PHASES}
    x, parallel = _shape(model, parallel, dense)
    norm = "rmsnorm" if model.norm == "rmsnorm" else "layernorm"
    forward = _forward(x, norm)
    backward, weight = _input_grad(x, norm), _weight_grad(x)
    if x["fp8"]:
        forward, backward, weight = (_in_fp8(x, kernels, phase) for kernels, phase in
                                     ((forward, "F"), (backward, "I"), (weight, "W")))
    if model.recompute == "full":
        recompute = forward
    elif model.recompute == "selective" and not x["flash"]:
        recompute = attention_forward(x)
    else:
        recompute = []
    recompute = [_prefixed(kernel, "recompute_") for kernel in recompute]
    return {"F": forward, "I": backward, "W": weight, "R": recompute}


def _prefixed(kernel, prefix):
    """``kernel`` named ``prefix + name`` (and the kernel it hides behind, likewise)."""
    return dataclasses.replace(kernel, name=prefix + kernel.name,
                               hides_behind=None if kernel.hides_behind is None
                               else prefix + kernel.hides_behind)


#: The layer's linear products (Transformer Engine's ``Linear``, ``LayerNormLinear`` and
#: ``LayerNormMLP`` GEMMs): what FP8 runs in FP8. The attention core's products, the
#: embedding and the output layer stay in the model's dtype (Megatron-Core builds the
#: output layer as its own ColumnParallelLinear, not a TE module).
FP8_PRODUCTS = {f"{name}{phase}" for name in ("qkv", "out_proj", "mlp_up", "mlp_down")
                for phase in ("", "_dgrad", "_wgrad")}
#: The tensor cast to FP8 before each product, by the kernel that writes it: a norm or the
#: activation writes it in FP8 itself (TE's fused LayerNorm-cast, activation-cast and
#: dactivation-cast kernels), the others need a cast kernel of their own.
_FP8_INPUTS = {"F": {"qkv": "norm", "out_proj": None, "mlp_up": "norm",
                     "mlp_down": "activation"},
               "I": {"mlp_down_dgrad": None, "mlp_up_dgrad": "activation",
                     "out_proj_dgrad": None, "qkv_dgrad": None}}


def _in_fp8(x, kernels, phase):
    """``kernels`` with their linear products in FP8 (see the module docstring).

    A product reads its operands in one byte each; every FP8 input is written once as
    FP8 and once as its FP8 transpose (Hopper's FP8 tensor cores take only the TN layout,
    so the weight gradient reads the transposed copy): a cast kernel reads the tensor in
    the model's dtype and writes two bytes per element, unless its producer writes FP8
    itself (same bytes as a 2-byte output). With sequence parallelism the gathered norm
    outputs are cast after the all-gather (the gather stays in the model's dtype).
    ``tensorwise`` (current scaling) needs each tensor's amax before the cast: one more
    read, and no fused cast; ``delayed`` and ``blockwise`` scale in the cast pass.
    """
    d, recipe = x["d"], x["fp8"]
    casts = _FP8_INPUTS.get(phase, {})
    result = []
    for kernel in kernels:
        if kernel.name not in FP8_PRODUCTS:
            result.append(kernel)
            continue
        producer = casts.get(kernel.name)
        fused = producer is not None and recipe != "tensorwise" and not (
            x["sp"] and producer == "norm")
        elements = kernel.read[1] / d if phase != "W" else 0.0
        if phase != "W" and not fused:
            if recipe == "tensorwise":
                result.append(_vector(f"{kernel.name}_amax", d * elements, 0.0))
            result.append(_vector(f"{kernel.name}_cast", d * elements, 2.0 * elements))
        if phase == "W":     # the accumulated gradient stays; inputs and gradients in FP8
            read = (kernel.read[0], kernel.read[1] / d)
        else:
            read = (kernel.read[0] / d, kernel.read[1] / d)
        result.append(dataclasses.replace(kernel, read=read, fp8=True))
    return result


#: The builders :mod:`tabsched.costs.experts` and :mod:`tabsched.costs.latent` make their
#: kernels with, so that every kernel is made one way.
_BUILD = {"matrix": _matrix, "vector": _vector, "collective": _collective, "rows": _rows,
          "norm_backward": norm_backward,
          "kernel": _kernel, "mlp": _mlp, "mlp_bwd": _mlp_bwd, "mlp_wgrad": _mlp_wgrad,
          "wgrad": _wgrad}

