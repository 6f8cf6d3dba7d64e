"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, section 2.1).

A model with ``kv_lora_rank`` set attends through low-rank latents instead of
per-head key/value projections: the layer's input is projected down to a key-value
latent of ``kv_lora_rank`` (plus one shared rotary key of ``qk_rope_head_dim``),
normalised and projected up to every head's key (``qk_nope_head_dim``, the rotary
part appended) and value (``v_head_dim``); the query takes the same path through a
latent of ``q_lora_rank`` (or one ``h x a*(nope+rope)`` projection when
``q_lora_rank`` is 0 or unset, as DeepSeek-V2-Lite). The attention core then has
query and key heads of ``dqk = qk_nope_head_dim + qk_rope_head_dim`` and value heads
of ``v_head_dim``; the output projection maps ``a * v_head_dim`` back to ``h``.

How it runs under tensor parallelism, as Megatron-Core's ``MLASelfAttention``
(``megatron/core/transformer/multi_latent_attention.py``): the down projections are
duplicated on every tensor rank (their weights replicated, not split) and run on a
rank's own tokens (``sn``, the sequence-parallel share), the latents are all-gathered
over the tensor group (``latent_all_gather``; none without sequence parallelism),
and the up projections (with their norms fused in front: TE's
``LayerNormColumnParallelLinear``) and the output projection are split over the
tensor ranks as a dense layer's are. The backward mirrors it: the up products' data
gradients are partial sums over the tensor ranks, reduced (reduce-scattered with
sequence parallelism) after the latent norms' backward (``latent_reduce``).

Notation: ``a`` heads, ``qr`` q_lora_rank, ``kvr`` kv_lora_rank, ``dn``, ``dr``,
``dv`` the nope, rope and value head widths, ``dqk = dn + dr``; widths over all heads
``wq = a*dqk`` (queries and keys), ``wv = a*dv`` (values and the attention output),
``ukv = a*(dn + dv)`` (what the key-value up projection writes).

Parameters per layer: ``h*qr + qr*wq`` (or ``h*wq``), ``h*(kvr + dr) + kvr*ukv``,
``wv*h``; of them ``h*qr + h*(kvr + dr)`` replicated over the tensor ranks.
Activation bytes per token (beyond the norms' and residual's, which are a dense
layer's): the latents before and after their norms and the rotary key, held by every
tensor rank, ``d*(2*qr + 2*kvr + dr)``; split over the tensor ranks the queries, keys
and values ``d*(2*wq + wv)`` and the output projection's input ``d*wv``.
Left out: the replicated down projections' gradient all-reduce over the tensor ranks
under sequence parallelism (a few MB per layer, once per iteration).
"""

from __future__ import annotations

from tabsched.exceptions import InvalidParameterError

__all__ = ["LATENT_FIELDS", "check_latent", "latent_parameter_parts", "latent_widths",
           "latent_forward", "latent_input_grad", "latent_weight_grad",
           "latent_token_activation", "latent_weight_grad_kept"]

#: The model's MLA fields (all None: grouped-query attention).
LATENT_FIELDS = {"q_lora_rank": None, "kv_lora_rank": None, "qk_nope_head_dim": None,
                 "qk_rope_head_dim": None, "v_head_dim": None}
#: The widest latent or head: DeepSeek-V3's q latent is 1,536 and its heads 192; 2**20
#: is past any.
MAX_WIDTH = 2**20


def check_latent(model, set_):
    """Validate ``model``'s MLA fields: all of ``kv_lora_rank`` and the three head widths,
    or none of them (``q_lora_rank`` optional, 0 or unset for a direct query)."""
    from tabsched.costs import _presets
    given = {key: getattr(model, key) for key in LATENT_FIELDS}
    if all(value is None for value in given.values()):
        return
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if given[key] is None:
            named = ", ".join(name for name, value in given.items() if value is not None)
            raise InvalidParameterError(
                f"{named} given without {key}: multi-head latent attention needs "
                f"kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    for key, value in given.items():
        if value is None:
            continue
        low = 0 if key in ("q_lora_rank", "qk_nope_head_dim") else 1
        set_(key, _presets.integer(key, value, low, MAX_WIDTH))
    if model.qk_nope_head_dim + model.qk_rope_head_dim == 0:
        raise InvalidParameterError("qk_nope_head_dim + qk_rope_head_dim must be positive")
    if model.kv_heads != model.heads:
        raise InvalidParameterError(
            f"kv_heads {model.kv_heads} with multi-head latent attention: every head has "
            f"its own key and value (leave kv_heads out)")


def latent_widths(model):
    """``(wq, wk, wv, wo)``: the query, key, value and attention-output widths over all
    heads (grouped-query attention: ``h``, ``hk``, ``hk``, ``h``)."""
    if model.kv_lora_rank is None:
        width = model.heads * model.head_dim       # hidden, unless head_dim says otherwise
        return width, model.kv_width, model.kv_width, width
    a = model.heads
    wq = a * (model.qk_nope_head_dim + model.qk_rope_head_dim)
    wv = a * model.v_head_dim
    return wq, wq, wv, wv


def latent_parameter_parts(model):
    """``(split, replicated)`` attention parameters of one layer: what the tensor ranks
    divide among them, and what each holds whole (MLA's down projections)."""
    h = model.hidden
    if model.kv_lora_rank is None:
        width = model.heads * model.head_dim
        return 2 * h * width + 2 * h * model.kv_width, 0
    wq, _, wv, _ = latent_widths(model)
    qr, kvr, dr = model.q_lora_rank or 0, model.kv_lora_rank, model.qk_rope_head_dim
    ukv = model.heads * (model.qk_nope_head_dim + model.v_head_dim)
    split = (qr * wq if qr else h * wq) + kvr * ukv + wv * h
    replicated = h * qr + h * (kvr + dr)
    return split, replicated


def _dims(x):
    mla = x["mla"]
    return (x["h"], x["s"], x["sn"], x["d"], x["t"], mla["qr"], mla["kvr"], mla["dr"],
            mla["ukv"], x["wq"])


def latent_forward(x, build):
    """The kernels from the first norm's output to the attention core's input: the down
    projections, the latents' gather and norms, the up projections, the rotary part."""
    h, s, sn, d, t, qr, kvr, dr, ukv, wq = _dims(x)
    matrix, vector, rows = build["matrix"], build["vector"], build["rows"]
    kernels = []
    if qr:
        kernels.append(matrix("q_down", 2 * sn * h * qr, d * h * qr, d * sn * h, d * sn * qr,
                              d, [rows(sn, qr, h)]))
    kernels.append(matrix("kv_down", 2 * sn * h * (kvr + dr), d * h * (kvr + dr), d * sn * h,
                          d * sn * (kvr + dr), d, [rows(sn, kvr + dr, h)]))
    if x["sp"]:
        kernels.append(build["collective"]("latent_all_gather", "all_gather",
                                           d * s * (qr + kvr + dr)))
        if not qr:       # the query's column-parallel projection reads the whole input
            kernels.append(build["collective"]("all_gather", "all_gather", d * s * h))
    if qr:
        kernels += [vector("q_norm", d * s * qr, d * s * qr),
                    matrix("q_up", 2 * s * qr * wq / t, d * qr * wq / t, d * s * qr,
                           d * s * wq / t, d, [rows(s, wq / t, qr)])]
    else:
        kernels.append(matrix("q_proj", 2 * s * h * wq / t, d * h * wq / t, d * s * h,
                              d * s * wq / t, d, [rows(s, wq / t, h)]))
    kernels += [vector("kv_norm", d * s * kvr, d * s * kvr),
                matrix("kv_up", 2 * s * kvr * ukv / t, d * kvr * ukv / t, d * s * kvr,
                       d * s * ukv / t, d, [rows(s, ukv / t, kvr)]),
                # the rotary embedding of the queries and of the shared key, written into
                # every head's query and key
                vector("rope", d * s * (wq / t + dr), 2 * d * s * wq / t)]
    return kernels


def latent_input_grad(x, build):
    """The backward of :func:`latent_forward`, in the order it runs."""
    h, s, sn, d, t, qr, kvr, dr, ukv, wq = _dims(x)
    matrix, vector, rows = build["matrix"], build["vector"], build["rows"]
    kernels = [vector("rope_bwd", 2 * d * s * wq / t, d * s * (wq / t + dr))]
    if qr:
        kernels += [matrix("q_up_dgrad", 2 * s * wq * qr / t, d * qr * wq / t, d * s * wq / t,
                           d * s * qr, d, [rows(s, qr, wq / t)]),
                    vector("q_norm_bwd", 3 * d * s * qr, d * s * qr)]
    kernels += [matrix("kv_up_dgrad", 2 * s * ukv * kvr / t, d * kvr * ukv / t,
                       d * s * ukv / t, d * s * kvr, d, [rows(s, kvr, ukv / t)]),
                vector("kv_norm_bwd", 3 * d * s * kvr, d * s * kvr)]
    # the up products' data gradients are partial sums over the tensor ranks: reduced
    # (reduce-scattered back to a rank's tokens with sequence parallelism) beside the
    # up products' weight gradients, as Megatron-LM launches its async all-reduce
    name = "reduce_scatter" if x["sp"] else "all_reduce"
    kernels.append(build["collective"]("latent_reduce", name, d * s * (qr + kvr + dr),
                                       hides_behind="kv_up_wgrad"))
    if not qr:
        kernels += [matrix("q_proj_dgrad", 2 * s * wq * h / t, d * h * wq / t, d * s * wq / t,
                           d * s * h, d, [rows(s, h, wq / t)]),
                    build["collective"](name, name, d * s * h, hides_behind="q_proj_wgrad")]
    else:
        kernels.append(matrix("q_down_dgrad", 2 * sn * qr * h, d * h * qr, d * sn * qr,
                              d * sn * h, d, [rows(sn, h, qr)]))
    kernels.append(matrix("kv_down_dgrad", 2 * sn * (kvr + dr) * h, d * h * (kvr + dr),
                          d * sn * (kvr + dr), d * sn * h, d, [rows(sn, h, kvr + dr)]))
    return kernels


def latent_weight_grad(x, build):
    """The weight gradients of MLA's projections (the output projection is the layer's)."""
    h, s, sn, d, t, qr, kvr, dr, ukv, wq = _dims(x)
    wgrad = build["wgrad"]
    kernels = [wgrad(x, "kv_up_wgrad", kvr, ukv, kvr, ukv / t, split=True)]
    if qr:
        kernels += [wgrad(x, "q_up_wgrad", qr, wq, qr, wq / t, split=True),
                    wgrad(x, "q_down_wgrad", h, qr, h, qr, split=False)]
    else:
        kernels.append(wgrad(x, "q_proj_wgrad", h, wq, h, wq / t, split=True))
    kernels.append(wgrad(x, "kv_down_wgrad", h, kvr + dr, h, kvr + dr, split=False))
    return kernels


def latent_token_activation(model):
    """``(gathered, split)`` activation bytes per token of MLA's projections, beyond the
    first norm's output (module docstring): the latents and the rotary key, held by every
    tensor rank; the queries, keys, values and the output projection's input, split."""
    d = model.dtype_bytes
    wq, wk, wv, wo = latent_widths(model)
    qr, kvr, dr = model.q_lora_rank or 0, model.kv_lora_rank, model.qk_rope_head_dim
    return d * (2 * qr + 2 * kvr + dr), d * (wq + wk + wv) + d * wo


def latent_weight_grad_kept(model, kept):
    """``(whole, gathered, split)`` bytes per token MLA's weight gradients need: the down
    products' input (the norm's output) and output gradients, the up products' inputs
    and output gradients, the output projection's input; ``kept`` bytes per element of
    the products' inputs."""
    d = model.dtype_bytes
    wq, _, wv, _ = latent_widths(model)
    qr, kvr, dr = model.q_lora_rank or 0, model.kv_lora_rank, model.qk_rope_head_dim
    ukv = model.heads * (model.qk_nope_head_dim + model.v_head_dim)
    whole = kept * model.hidden
    gathered = d * (qr + kvr + dr) + kept * (qr + kvr)
    split = d * (wq + ukv) + kept * wv
    return whole, gathered, split
