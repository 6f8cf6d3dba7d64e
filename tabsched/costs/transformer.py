"""Transformer models: parameters, FLOPs, bytes moved and activation memory per layer.

A :class:`TransformerModel` is a decoder-only transformer without tensor or
sequence parallelism: ``layers`` identical layers (attention with ``heads``
query heads and ``kv_heads`` key/value heads, then an MLP of width ``ffn``,
each behind a norm), an input embedding on the first pipeline stage, and a
final norm, output layer and loss on the last. Everything is per microbatch of
``b`` samples of ``sequence`` tokens each (``T = b*s`` tokens).

Notation: ``h`` hidden, ``a`` heads, ``g`` kv_heads, ``dh = h/a``, ``hk = g*dh``
(width of K and of V), ``f`` ffn, ``s`` sequence, ``V`` vocab, ``d`` bytes per
element of the model's dtype.

Parameters (weight matrices only; biases and norm scales, O(h) per layer, are
left out: under 0.05% at h >= 1024)
    per layer ``2*h*h + 2*h*hk + k*h*f`` with ``k = 3`` for a gated MLP
    (SwiGLU) and 2 otherwise; ``V*h`` for the embedding on the first stage and
    another ``V*h`` for the output layer on the last (a pipeline keeps a copy
    on each end even when the two are tied, as Megatron-LM does).
FLOPs per layer (one multiply-add = 2 FLOPs; Narayanan et al. 2021, appendix;
the zero-bubble paper's split of the backward, Qi et al. 2023, Table 1)
    ``F = 2*T*P + 4*b*s*s*h``: the weight matmuls plus QK^T and attention over V
    (the full s x s score matrix; a causal kernel skips about half of it).
    For ``h = a*dh``, ``g = a``, ``f = 4h`` this is ``24*T*h^2 + 4*T*s*h``.
    ``I = 2*T*P + 8*b*s*s*h`` (gradients of both inputs of both attention
    products); ``W = 2*T*P``; ``B = I + W``.
    Recomputation adds to ``I`` (and ``B``): ``selective`` the attention core
    forward, ``4*b*s*s*h``; ``full`` a whole forward ``F``.
    Output layer: ``2*T*h*V`` in each of F, I and W; the embedding (a gather)
    and the element-wise work (norms, softmax, loss) count no FLOPs.
Activation bytes per layer (Korthikanti et al. 2022, section 4.1, per tensor)
    attention: ``d*T*(3h + 2hk) + m*T*h`` plus the score-sized tensors
    ``(d + m*(d+1))*a*s*s*b`` (softmax output; with dropout its mask and
    output); MLP: ``d*T*h + k'*d*T*f + m*T*h`` with ``k' = 2`` (activation
    input and output) or 3 for a gated MLP (gate, up and their product); two
    norm inputs ``2*d*T*h``. ``m = 1`` with dropout (1-byte masks), else 0.
    With ``d = 2``, dropout, ``g = a``, ``f = 4h`` this is exactly the paper's
    ``s*b*h*(34 + 5*a*s/h)`` for ``recompute="none"``; ``selective`` drops the
    score-sized tensors (``34*s*b*h``); ``full`` keeps the layer input only,
    ``d*s*b*h`` (``2*s*b*h``).
    First stage: the embedding's dropout mask ``m*T*h``; last stage: the final
    norm and output-layer inputs and the fp32 logits, ``2*d*T*h + 4*T*V``
    (the paper's ``4*s*b*h*(1 + V/h)`` at ``d = 2``, section 4.3).
Split backward (``I`` then ``W``)
    ``W`` needs the input of each weight matmul and the gradient of its output:
    ``d*T*(3h + f) + d*T*(3h + 2hk + k''*f)`` with ``k'' = 2`` for a gated MLP,
    else 1 (``32*s*b*h`` for a GPT layer). ``I`` releases the rest of the
    stored activation: ``input_grad_release = 1 - kept / stored`` (at least 0;
    under full recomputation the checkpoint is smaller than what W needs, so
    it is all held until ``W``, which re-materialises the rest: 0).
Bytes moved (the roofline's memory term; a lower bound on HBM traffic)
    ``F``: weights read once ``d*P``, every intermediate activation written
    once (the ``recompute="none"`` activation), the output ``d*T*h``;
    ``I``: weights, every intermediate read once, the output gradient read and
    the input gradient written ``2*d*T*h``, plus what recomputation writes
    again (the score-sized tensors, or a whole forward); ``W``: weight
    gradients written ``d*P`` and what it keeps read; ``B = I + W``.
    Output layer: its weights ``d*V*h`` and its activation in each of F, I, W;
    embedding: ``2*d*T*h`` (rows read and written) in F and W.
Persistent bytes
    parameters x ``bytes_per_param``: 16 by default, mixed-precision Adam
    (bf16 weights 2 + gradients 2, fp32 master weights 4, momentum 4,
    variance 4; Rajbhandari et al. 2020, ZeRO, section 3.1).

Examples
--------
>>> gpt = TransformerModel(layers=2, hidden=64, heads=4, sequence=16, vocab=100)
>>> gpt.layer_parameters == 12 * 64 * 64
True
>>> int(gpt.layer_activation(1)) == 16 * 64 * (34 + 5 * 4 * 16 // 64)
True
"""

import dataclasses
from dataclasses import dataclass

import numpy as np

from tabsched.costs import _presets
from tabsched.exceptions import InvalidParameterError
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

__all__ = ["TransformerModel", "load_model", "model_presets", "RECOMPUTE_MODES", "DTYPES"]

RECOMPUTE_MODES = ("none", "selective", "full")
#: Bytes per element of the dtypes a model may name.
DTYPES = {"fp8": 1, "bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}
_REQUIRED = ("layers", "hidden", "heads", "sequence", "vocab")
_OPTIONAL = ("kv_heads", "ffn", "gated_ffn", "dropout", "dtype", "microbatch_size",
             "recompute", "bytes_per_param", "name")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidParameterError(f"{name} must be a positive integer, not {value!r}")
    return int(value)


@dataclass(frozen=True)
class TransformerModel:
    """A decoder-only transformer and how it is trained; see the module docstring.

    Parameters
    ----------
    layers, hidden, heads, sequence, vocab : int
    kv_heads : int, optional
        Key/value heads (grouped-query attention); default ``heads``.
    ffn : int, optional
        MLP width; default ``4*hidden``.
    gated_ffn : bool
        A gated MLP (SwiGLU: three matrices) instead of two matrices.
    dropout : bool
        Dropout after attention scores, attention and MLP (1-byte masks).
    dtype : str or int
        ``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"`` or bytes per element.
    microbatch_size : int
        Samples in a full microbatch (a table's relative size 1.0).
    recompute : {"none", "selective", "full"}
    bytes_per_param : float
        Persistent bytes per parameter: weights, gradients, optimizer state.
    name, description : str
    """

    layers: int
    hidden: int
    heads: int
    sequence: int
    vocab: int
    kv_heads: int = None
    ffn: int = None
    gated_ffn: bool = False
    dropout: bool = True
    dtype: object = "bf16"
    microbatch_size: int = 1
    recompute: str = "none"
    bytes_per_param: float = 16.0
    name: str = "custom"
    description: str = ""

    def __post_init__(self):
        def set_(key, value):
            object.__setattr__(self, key, value)
        for key in _REQUIRED + ("microbatch_size",):
            set_(key, _positive_int(key, getattr(self, key)))
        set_("kv_heads", self.heads if self.kv_heads is None
             else _positive_int("kv_heads", self.kv_heads))
        set_("ffn", 4 * self.hidden if self.ffn is None else _positive_int("ffn", self.ffn))
        if self.hidden % self.heads:
            raise InvalidParameterError(f"hidden {self.hidden} is not divisible by heads "
                                        f"{self.heads}")
        if self.heads % self.kv_heads:
            raise InvalidParameterError(f"heads {self.heads} is not divisible by kv_heads "
                                        f"{self.kv_heads}")
        for key in ("gated_ffn", "dropout"):
            if not isinstance(getattr(self, key), (bool, np.bool_)):
                raise InvalidParameterError(f"{key} must be true or false, not "
                                            f"{getattr(self, key)!r}")
            set_(key, bool(getattr(self, key)))
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise InvalidParameterError(f"dtype {self.dtype!r} is not one of "
                                            f"{', '.join(DTYPES)} (or bytes per element)")
        elif isinstance(self.dtype, bool) or self.dtype not in (1, 2, 4, 8):
            raise InvalidParameterError(f"dtype must be one of {', '.join(DTYPES)} or 1, 2, "
                                        f"4, 8 bytes, not {self.dtype!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise InvalidParameterError(f"recompute {self.recompute!r} is not one of "
                                        f"{', '.join(RECOMPUTE_MODES)}")
        try:
            bytes_per_param = float(self.bytes_per_param)
        except (TypeError, ValueError):
            bytes_per_param = -1.0
        if isinstance(self.bytes_per_param, bool) or not np.isfinite(bytes_per_param) \
                or bytes_per_param < 0:
            raise InvalidParameterError(f"bytes_per_param must be a number >= 0, not "
                                        f"{self.bytes_per_param!r}")
        set_("bytes_per_param", bytes_per_param)

    def replace(self, **changes):
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------- parameters
    @property
    def dtype_bytes(self):
        """Bytes per element of activations, weights and transfers."""
        return DTYPES[self.dtype] if isinstance(self.dtype, str) else int(self.dtype)

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def kv_width(self):
        """Width ``hk = kv_heads * head_dim`` of each of K and V."""
        return self.kv_heads * self.head_dim

    @property
    def _mlp_matrices(self):
        return 3 if self.gated_ffn else 2

    @property
    def layer_parameters(self):
        """Weight-matrix parameters of one transformer layer."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_width + self._mlp_matrices * h * self.ffn

    @property
    def embedding_parameters(self):
        return self.vocab * self.hidden

    @property
    def output_parameters(self):
        return self.vocab * self.hidden

    @property
    def parameters(self):
        """All parameters, counting the embedding and the output layer once each."""
        return (self.layers * self.layer_parameters + self.embedding_parameters
                + self.output_parameters)

    def stage_parameters(self, layers, first, last):
        """Parameters of a stage of ``layers`` layers (first/last: embedding/output)."""
        return (layers * self.layer_parameters + bool(first) * self.embedding_parameters
                + bool(last) * self.output_parameters)

    # ------------------------------------------------------------ activations
    def _score_bytes(self, samples):
        """Score-sized activation bytes (softmax output; dropout mask and output)."""
        d, mask = self.dtype_bytes, int(self.dropout)
        return (d + mask * (d + 1)) * self.heads * self.sequence * self.sequence * samples

    def _token_activation(self):
        """Activation bytes per token of one layer that do not scale with s*s."""
        d, mask, h, f = self.dtype_bytes, int(self.dropout), self.hidden, self.ffn
        attention = d * (3 * h + 2 * self.kv_width) + mask * h
        mlp = d * h + (self._mlp_matrices) * d * f + mask * h
        norms = 2 * d * h
        return attention + mlp + norms

    def layer_activation(self, samples, recompute=None):
        """Bytes one layer keeps from its forward to its backward, per microbatch.

        ``samples`` may be an int (exact integer arithmetic) or a numpy array.
        ``recompute`` defaults to the model's.
        """
        recompute = self.recompute if recompute is None else recompute
        tokens = samples * self.sequence
        if recompute == "full":
            return self.dtype_bytes * tokens * self.hidden
        stored = self._token_activation() * tokens
        if recompute == "none":
            stored = stored + self._score_bytes(samples)
        return stored

    def embedding_activation(self, samples):
        """Bytes the first stage keeps for its embedding (the dropout mask)."""
        return int(self.dropout) * samples * self.sequence * self.hidden

    def output_activation(self, samples):
        """Bytes the last stage keeps for its norm, output layer and fp32 logits."""
        tokens = samples * self.sequence
        return 2 * self.dtype_bytes * tokens * self.hidden + 4 * tokens * self.vocab

    def weight_grad_kept(self, samples):
        """Bytes of one layer that ``W`` needs: matmul inputs and output gradients."""
        d, h, f = self.dtype_bytes, self.hidden, self.ffn
        tokens = samples * self.sequence
        inputs = d * tokens * (3 * h + f)
        output_grads = d * tokens * (3 * h + 2 * self.kv_width
                                     + (2 if self.gated_ffn else 1) * f)
        return inputs + output_grads

    @property
    def input_grad_release(self):
        """Part of a layer's stored activation that ``I`` frees (``W`` frees the rest)."""
        kept = self.weight_grad_kept(1)
        stored = self.layer_activation(1)
        return max(0.0, 1.0 - kept / stored)

    def transfer_bytes(self, samples):
        """Bytes of the activation (or its gradient) passed between stages: ``d*b*s*h``."""
        return self.dtype_bytes * samples * self.sequence * self.hidden

    # ------------------------------------------------------------------ work
    def layer_work(self, samples):
        """FLOPs and bytes moved of one layer for microbatches of ``samples`` samples.

        Returns ``(flops, nbytes)``, each a float array of shape ``(4, n)``:
        rows in the table's kind order (F, B, I, W), one column per entry of
        ``samples``.
        """
        b = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        d, h, s = self.dtype_bytes, self.hidden, self.sequence
        tokens = b * s
        weights = float(self.layer_parameters)
        matmul = 2.0 * tokens * weights
        scores = 4.0 * b * s * s * h
        intermediates = self._token_activation() * tokens + self._score_bytes(b)
        flops = np.empty((4, len(b)))
        nbytes = np.empty((4, len(b)))
        flops[FORWARD] = matmul + scores
        nbytes[FORWARD] = d * weights + intermediates + d * tokens * h
        flops[INPUT_GRAD] = matmul + 2.0 * scores
        nbytes[INPUT_GRAD] = d * weights + intermediates + 2.0 * d * tokens * h
        if self.recompute == "selective":
            flops[INPUT_GRAD] += scores
            nbytes[INPUT_GRAD] += self._score_bytes(b)
        elif self.recompute == "full":
            flops[INPUT_GRAD] += flops[FORWARD]
            nbytes[INPUT_GRAD] += nbytes[FORWARD]
        flops[WEIGHT_GRAD] = matmul
        nbytes[WEIGHT_GRAD] = d * weights + self.weight_grad_kept(b)
        flops[BACKWARD] = flops[INPUT_GRAD] + flops[WEIGHT_GRAD]
        nbytes[BACKWARD] = nbytes[INPUT_GRAD] + nbytes[WEIGHT_GRAD]
        return flops, nbytes

    def embedding_work(self, samples):
        """FLOPs and bytes of the input embedding (first stage), shaped as ``layer_work``."""
        b = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        rows = 2.0 * self.dtype_bytes * b * self.sequence * self.hidden
        flops = np.zeros((4, len(b)))
        nbytes = np.zeros((4, len(b)))
        nbytes[FORWARD] = rows + self.embedding_activation(b)
        nbytes[WEIGHT_GRAD] = rows
        nbytes[BACKWARD] = rows
        return flops, nbytes

    def output_work(self, samples):
        """FLOPs and bytes of the final norm, output layer and loss (last stage)."""
        b = np.atleast_1d(np.asarray(samples, dtype=np.float64))
        tokens = b * self.sequence
        matmul = 2.0 * tokens * self.hidden * self.vocab
        per_pass = self.dtype_bytes * float(self.output_parameters) + self.output_activation(b)
        flops = np.empty((4, len(b)))
        nbytes = np.empty((4, len(b)))
        flops[[FORWARD, INPUT_GRAD, WEIGHT_GRAD]] = matmul
        nbytes[[FORWARD, INPUT_GRAD, WEIGHT_GRAD]] = per_pass
        flops[BACKWARD] = 2.0 * matmul
        nbytes[BACKWARD] = 2.0 * per_pass
        return flops, nbytes

    # -------------------------------------------------------------- describe
    def summary(self):
        """Key numbers, JSON-ready."""
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden,
                "heads": self.heads, "kv_heads": self.kv_heads, "ffn": self.ffn,
                "sequence": self.sequence, "vocab": self.vocab, "dtype": self.dtype,
                "microbatch_size": self.microbatch_size, "recompute": self.recompute,
                "parameters": self.parameters, "description": self.description}


def _from_data(data, source):
    _presets.check_keys(data, _REQUIRED, _OPTIONAL, source)
    fields = {key: value for key, value in data.items() if key != "kind"}
    fields.setdefault("name", source)
    try:
        return TransformerModel(**fields)
    except InvalidParameterError as error:
        raise InvalidParameterError(f"{source}: {error}") from None


def load_model(reference):
    """A :class:`TransformerModel` from a preset name or a TOML file with the same keys.

    Keys: ``layers``, ``hidden``, ``heads``, ``sequence``, ``vocab`` (required);
    ``kv_heads``, ``ffn``, ``gated_ffn``, ``dropout``, ``dtype``,
    ``microbatch_size``, ``recompute``, ``bytes_per_param``, ``description``.

    >>> load_model("paper-128l").layers
    128
    >>> load_model("paper-12l")
    Traceback (most recent call last):
    ...
    tabsched.exceptions.UnknownNameError: unknown model preset 'paper-12l' (did you mean 'paper-128l'?); valid models: ...
    """
    if isinstance(reference, TransformerModel):
        return reference
    data, source = _presets.load(reference, "model")
    return _from_data(data, source)


def model_presets():
    """The model presets shipped with tabsched, ``{name: TransformerModel}``."""
    return {name: load_model(name) for name in _presets.preset_index()["model"]}
