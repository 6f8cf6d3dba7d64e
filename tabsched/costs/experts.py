"""Mixture-of-experts layers: routed experts, shared experts, the router, expert parallelism.

A model with ``experts > 0`` replaces the MLP of every layer after its first
``dense_layers`` (DeepSeek-V3's ``first_k_dense_replace``) by a mixture of experts
(Shazeer et al. 2017; Lepikhin et al. 2021, GShard; Fedus et al. 2022, Switch):
a router (a ``h x E`` product and a top-``k`` choice per token) sends each token to
``top_k`` of ``experts`` routed experts, each an MLP of width ``expert_ffn`` (gated
when the model's MLP is), and ``shared_experts`` experts of the same width see every
token (DeepSeek-MoE, Dai et al. 2024). The layer's output is the routing-weighted sum
of its ``top_k`` experts' outputs, plus the shared experts'.

How it runs, as Megatron-Core's ``MoELayer`` with the all-to-all token dispatcher
(``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``):
the *e* ranks of the expert group (``Execution.expert_parallel``, formed inside the
data-parallel dimension: :mod:`tabsched.costs.placement`) hold ``E / e`` experts each;
a rank *permutes* its tokens' ``k`` copies into expert order, an all-to-all over the
expert group *dispatches* them to the ranks holding their experts, the local experts
run as grouped products (one product per local expert, ``batch = E / e`` in the GEMM
table's terms, at the per-expert token count), an all-to-all *combines* the outputs
back and *unpermute* sums each token's copies with their routing weights. Under
tensor parallelism (which needs sequence parallelism with experts, as Megatron-Core
requires) each expert is split over the tensor ranks as the dense MLP is (expert
tensor parallelism equal to the tensor degree, Megatron-Core's default): the tokens
received are all-gathered over the tensor group before the experts and
reduce-scattered after.

Notation (per tensor rank and sample): ``sn`` the rank's tokens (``s / t`` with
sequence parallelism), ``c = sn * k`` the copies it routes, ``R = L * c`` the copies
the busiest rank of the expert group receives (``L`` the load factor below),
``G = t * R`` the rows each tensor rank's experts run, ``E_l = E / e`` local experts,
``fe`` the expert width, ``kg = 2`` matrices in an expert's first product when gated,
else 1.

Load. Dropless routing (``capacity_factor`` None) lets the most loaded expert take
``routing_imbalance`` times the mean: the rank holding it sets the time of the
all-to-alls and of the grouped products, so every expert-side count is scaled by
``L = routing_imbalance`` (1.0: perfectly balanced, the default; a user with a
measured imbalance sets it). With a capacity factor (GShard), each expert takes at
most ``capacity_factor`` times the mean, the rest dropped, and Megatron pads each
expert's input to that capacity (``--moe-pad-expert-input-to-capacity``):
``L = capacity_factor``.

Kernels of the MoE part of a layer (replacing ``norm2`` .. ``bias_dropout_add`` of the
dense MLP; :mod:`tabsched.costs.kernels` has the rest)
    Forward: ``norm2``; ``router`` (``2*sn*h*E`` FLOPs, fp32 logits written);
    ``router_topk`` (the scores, the top-k choice and the auxiliary load-balancing
    loss's pass over the scores: reads ``8*sn*E``, writes ``4*sn*E + 12*c``);
    ``permute`` (reads and writes ``d*c*h``); ``moe_dispatch`` (all-to-all over the
    expert group of ``d*R*h``, when ``e > 1``); ``moe_gather`` (all-gather over the
    tensor group of ``d*G*h``, when ``t > 1``); ``sort_chunks`` (with ``E_l > 1``:
    the rows received, ordered by source rank, copied into local-expert order with
    their fp32 routing weights, reads and writes ``d*G*h + 4*G``; the dispatcher's
    "permutation 2", ``sort_chunks_by_idxs`` in ``dispatch_postprocess``);
    ``experts_up`` (``2*G*h*kg*fe/t``),
    ``experts_activation``, ``experts_down`` (``2*G*fe*h/t``), each expert's weights
    read once; ``unsort_chunks`` (the inverse copy, ``combine_preprocess``, reads and
    writes ``d*G*h``); ``moe_scatter`` (reduce-scatter, ``t > 1``); ``moe_combine``
    (all-to-all, ``e > 1``); ``unpermute`` (reads ``d*c*h`` and the weights, writes
    ``d*sn*h``); the shared experts as a dense MLP of width ``shared_experts * fe``
    (with its own all-gather and reduce-scatter under sequence parallelism);
    ``bias_dropout_add`` (reading the shared experts' output too).
    Input-grad: the same backwards (``moe_combine_bwd``, ``moe_scatter_bwd`` (an
    all-gather), ``unsort_chunks_bwd``, ``experts_down_dgrad``, ``experts_activation_bwd``,
    ``experts_up_dgrad``, ``sort_chunks_bwd``, ``moe_gather_bwd`` (a reduce-scatter),
    ``moe_dispatch_bwd``,
    ``permute_bwd``, ``router_topk_bwd``, ``router_dgrad``); weight-grad: each
    expert's and the router's weight gradients.
    Left out: the router's tiny gradient all-reduce over the tensor ranks (the router is
    replicated there), the token counts' small all-gather of the dispatcher, the index
    bookkeeping of the permutation (O(c) integers), and the host synchronisation the
    dispatcher makes before each all-to-all to read the split sizes (one device-to-host
    copy per forward: the GPU idles for the launch that follows it, microseconds).

Parameters per MoE layer: the router ``h*E`` (replicated over the tensor ranks), the
routed experts ``E * kg' * h * fe`` (``kg' = 3`` gated, else 2; split over the tensor
ranks and over the expert group), the shared experts ``shared * kg' * h * fe`` (split
over the tensor ranks only). The routed experts' gradients are reduced over the
*expert-data-parallel* group, the ``d * cp / e`` ranks holding the same experts
(Megatron-Core's ``expert_data_parallel_group``); everything else over the
data-parallel group as in a dense model.

Activation bytes per token of a rank's ``s`` tokens, beyond the attention's (what the
backward needs; Megatron-Core's MoE layer saves the same tensors): kept whole
(divided by ``t`` with sequence parallelism) the MLP input ``d*h`` (as a dense
layer), the router's fp32 probabilities ``4*E`` and the experts' outputs before the
weighted sum ``d*k*h``; held in full by every tensor rank, the experts' gathered
input ``d*L*k*h``; split over the tensor ranks the experts' intermediates
``(kg + 1)*d*fe*L*k`` (gate, up and their product when gated) and the shared
experts' ``(kg + 1)*d*shared*fe``.
"""

from __future__ import annotations

from tabsched.exceptions import InvalidParameterError

__all__ = ["check_experts", "moe_parameter_parts", "moe_forward", "moe_input_grad",
           "moe_weight_grad", "moe_token_activation", "moe_weight_grad_kept",
           "moe_transient_width", "EXPERT_FIELDS"]

#: The model's mixture-of-experts fields, with their defaults (a dense model).
EXPERT_FIELDS = {"experts": 0, "top_k": None, "expert_ffn": None, "shared_experts": 0,
                 "dense_layers": 0, "capacity_factor": None, "routing_imbalance": 1.0,
                 "mtp_layers": 0}

#: Sane ranges: DeepSeek-V3 has 256 routed experts and top-8; 2**20 experts and top-1024
#: are past every published model. A load factor above 64 (one expert taking 64x its share)
#: is a typo. MTP depth: DeepSeek-V3 uses 1; 64 is past any.
MAX_EXPERTS = 2**20
MAX_TOP_K = 1024
MAX_LOAD = 64.0
MAX_MTP = 64


def check_experts(model, set_):
    """Validate and normalise ``model``'s mixture-of-experts fields (one line each,
    naming the key); ``set_(key, value)`` stores a normalised value."""
    from tabsched.costs import _presets
    for key, high in (("experts", MAX_EXPERTS), ("shared_experts", MAX_EXPERTS),
                      ("mtp_layers", MAX_MTP), ("dense_layers", model.layers)):
        set_(key, _presets.integer(key, getattr(model, key), 0, high))
    set_("routing_imbalance", _presets.number("routing_imbalance", model.routing_imbalance,
                                              1.0, MAX_LOAD))
    if not model.experts:
        for key in ("top_k", "expert_ffn", "capacity_factor"):
            if getattr(model, key) is not None:
                raise InvalidParameterError(f"{key} is set but experts is 0 (a dense "
                                            f"model): set experts, or leave {key} out")
        for key in ("shared_experts", "dense_layers"):
            if getattr(model, key):
                raise InvalidParameterError(f"{key} {getattr(model, key)} needs experts > 0")
        if model.routing_imbalance != 1.0:
            raise InvalidParameterError("routing_imbalance is set but experts is 0 (a dense "
                                        "model)")
        return
    if model.top_k is None:
        raise InvalidParameterError(f"experts {model.experts} needs top_k (how many experts "
                                    f"each token is routed to)")
    set_("top_k", _presets.integer("top_k", model.top_k, 1, MAX_TOP_K))
    if model.top_k > model.experts:
        raise InvalidParameterError(f"top_k {model.top_k} is larger than experts "
                                    f"{model.experts}")
    set_("expert_ffn", model.ffn if model.expert_ffn is None else
         _presets.integer("expert_ffn", model.expert_ffn, 1, 2**24))
    if model.capacity_factor is not None:
        set_("capacity_factor", _presets.number("capacity_factor", model.capacity_factor,
                                                0.0, MAX_LOAD, positive=True))
        if model.routing_imbalance != 1.0:
            raise InvalidParameterError("give capacity_factor (tokens over capacity dropped) "
                                        "or routing_imbalance (dropless), not both")


def moe_parameter_parts(model):
    """``(routed, shared, router)`` parameters of one MoE layer (0s for a dense model)."""
    if not model.experts:
        return 0, 0, 0
    matrices = 3 if model.gated_ffn else 2
    per_expert = matrices * model.hidden * model.expert_ffn
    return (model.experts * per_expert, model.shared_experts * per_expert,
            model.hidden * model.experts)


def load_factor(model):
    """``L``: the busiest expert's tokens over the mean (module docstring)."""
    return model.capacity_factor if model.capacity_factor is not None \
        else model.routing_imbalance


def _counts(x):
    """Per sample: ``c``, ``R``, ``G`` and the local experts (module docstring)."""
    c = x["sn"] * x["topk"]
    received = x["load"] * c
    return c, received, x["t"] * received, x["E"] / x["e"]


def _grouped(local, rows_per_expert, n, k):
    """``local`` products per microbatch, one per local expert, ``rows_per_expert`` rows
    per sample each (the per-expert token count)."""
    return ((0.0, rows_per_expert), (n, 0.0), (k, 0.0), (local, 0.0))


def _grouped_wgrad(local, m, n, rows_per_expert):
    """Each local expert's weight gradient ``m x n``, contracted over its tokens."""
    return ((m, 0.0), (n, 0.0), (0.0, rows_per_expert), (local, 0.0))


def moe_forward(x, norm_name, build):
    """Forward kernels of the MoE part of a layer; ``build`` holds the kernel builders of
    :mod:`tabsched.costs.kernels` (``matrix``, ``vector``, ``collective``, ``rows``,
    ``mlp``: the dense MLP's forward of a width)."""
    h, d, t, sn = x["h"], x["d"], x["t"], x["sn"]
    E, fe, kg = x["E"], x["fe"], x["k"]
    c, R, G, local = _counts(x)
    matrix, vector, collective = build["matrix"], build["vector"], build["collective"]
    kernels = [vector(f"{norm_name}2", d * sn * h, d * sn * h),
               matrix("router", 2 * sn * h * E, d * h * E, d * sn * h, 4 * sn * E, 4.0,
                      [build["rows"](sn, E, h)]),
               vector("router_topk", 8 * sn * E, 4 * sn * E + 12 * c),
               vector("permute", d * c * h, d * c * h)]
    if x["e"] > 1:
        kernels.append(collective("moe_dispatch", "all_to_all", d * R * h, group="expert"))
    if t > 1:
        kernels.append(collective("moe_gather", "all_gather", d * G * h))
    if local > 1:
        kernels.append(vector("sort_chunks", d * G * h + 4 * G, d * G * h + 4 * G))
    kernels += [matrix("experts_up", 2 * G * h * kg * fe / t, d * local * h * kg * fe / t,
                       d * G * h, d * G * kg * fe / t, d,
                       [_grouped(local, G / local, kg * fe / t, h)]),
                vector("experts_activation", d * G * kg * fe / t, d * G * fe / t),
                matrix("experts_down", 2 * G * fe * h / t, d * local * fe * h / t,
                       d * G * fe / t, d * G * h, d, [_grouped(local, G / local, h, fe / t)])]
    if local > 1:
        kernels.append(vector("unsort_chunks", d * G * h, d * G * h))
    if t > 1:
        kernels.append(collective("moe_scatter", "reduce_scatter", d * G * h))
    if x["e"] > 1:
        kernels.append(collective("moe_combine", "all_to_all", d * R * h, group="expert"))
    kernels.append(vector("unpermute", d * c * h + 4 * c, d * sn * h))
    shared = x["shared"] * fe
    if shared:
        kernels += build["mlp"](x, shared, "shared")
    m = x["m"]
    kernels.append(vector("bias_dropout_add" if m else "residual_add",
                          (3 if shared else 2) * d * sn * h, d * sn * h + m * sn * h))
    return kernels


def moe_input_grad(x, norm_name, build):
    """Input-grad kernels of the MoE part of a layer, in the order the backward runs."""
    h, d, t, sn, m = x["h"], x["d"], x["t"], x["sn"], x["m"]
    E, fe, kg = x["E"], x["fe"], x["k"]
    c, R, G, local = _counts(x)
    matrix, vector, collective = build["matrix"], build["vector"], build["collective"]
    kernels = [vector("bias_dropout_add_bwd" if m else "residual_add_bwd",
                      d * sn * h + m * sn * h, d * sn * h)]
    shared = x["shared"] * fe
    if shared:
        kernels += build["mlp_bwd"](x, shared, "shared")
    kernels.append(vector("unpermute_bwd", d * sn * h + d * c * h + 4 * c,
                          d * c * h + 4 * c))
    if x["e"] > 1:
        kernels.append(collective("moe_combine_bwd", "all_to_all", d * R * h, group="expert"))
    if t > 1:
        kernels.append(collective("moe_scatter_bwd", "all_gather", d * G * h))
    if local > 1:
        kernels.append(vector("unsort_chunks_bwd", d * G * h, d * G * h))
    kernels += [matrix("experts_down_dgrad", 2 * G * fe * h / t, d * local * fe * h / t,
                       d * G * h, d * G * fe / t, d, [_grouped(local, G / local, fe / t, h)]),
                vector("experts_activation_bwd", d * G * fe / t + d * G * kg * fe / t,
                       d * G * kg * fe / t),
                matrix("experts_up_dgrad", 2 * G * kg * fe * h / t,
                       d * local * h * kg * fe / t, d * G * kg * fe / t, d * G * h, d,
                       [_grouped(local, G / local, h, kg * fe / t)])]
    if local > 1:
        kernels.append(vector("sort_chunks_bwd", d * G * h, d * G * h))
    if t > 1:
        kernels.append(collective("moe_gather_bwd", "reduce_scatter", d * G * h))
    if x["e"] > 1:
        kernels.append(collective("moe_dispatch_bwd", "all_to_all", d * R * h,
                                  group="expert"))
    kernels += [vector("permute_bwd", d * c * h, d * sn * h),
                vector("router_topk_bwd", 8 * sn * E, 4 * sn * E),
                matrix("router_dgrad", 2 * sn * E * h, d * h * E, 4 * sn * E, d * sn * h, d,
                       [build["rows"](sn, h, E)]),
                *build["norm_backward"](x, f"{norm_name}2")]
    return kernels


def moe_weight_grad(x, build):
    """Weight-grad kernels of the MoE part of a layer (each accumulates its gradient)."""
    h, d, g, t, sn = x["h"], x["d"], x["g"], x["t"], x["sn"]
    E, fe, kg = x["E"], x["fe"], x["k"]
    _, _, G, local = _counts(x)
    kernel = build["kernel"]

    def grouped(name, rows, cols, inputs, grads):
        params = local * rows * cols / t
        return kernel(name, "matrix", (0.0, 2 * G * rows * cols / t),
                      (g * params, d * G * (inputs + grads)), (g * params, 0.0),
                      outputs=(params, 0.0),
                      gemms=(_grouped_wgrad(local, inputs, grads, G / local),))
    kernels = [grouped("experts_down_wgrad", fe, h, fe / t, h),
               grouped("experts_up_wgrad", h, kg * fe, h, kg * fe / t),
               kernel("router_wgrad", "matrix", (0.0, 2 * sn * h * E),
                      (g * h * E, d * sn * h + 4 * sn * E), (g * h * E, 0.0),
                      outputs=(h * E, 0.0), gemms=(((h, 0.0), (E, 0.0), (0.0, sn),
                                                    (1.0, 0.0)),))]
    shared = x["shared"] * fe
    if shared:
        kernels += build["mlp_wgrad"](x, shared, "shared")
    return kernels


def moe_token_activation(model, fp8_kept):
    """``(whole, split, gathered)`` activation bytes per token of a MoE layer's MLP part
    (module docstring), ``fp8_kept`` bytes per element of the inputs kept for a weight
    gradient where FP8 keeps them (the MLP input)."""
    d, h, E, k = model.dtype_bytes, model.hidden, model.experts, model.top_k
    fe, load = model.expert_ffn, load_factor(model)
    matrices = 3 if model.gated_ffn else 2
    whole = fp8_kept * h + 4 * E + d * k * h
    gathered = d * load * k * h
    split = matrices * d * fe * load * k + matrices * d * model.shared_experts * fe
    return whole, split, gathered


def moe_weight_grad_kept(model, kept):
    """``(whole, split, gathered)`` bytes per token a MoE layer's MLP part keeps for its
    weight gradients: the router's input and its logits' gradient, the experts' gathered
    input and their output gradient, the down products' inputs and the up products'
    output gradients; ``kept`` bytes per element of the inputs (1 under FP8)."""
    d, h, E, k = model.dtype_bytes, model.hidden, model.experts, model.top_k
    fe, load = model.expert_ffn, load_factor(model)
    up = 2 if model.gated_ffn else 1
    shared = model.shared_experts * fe
    whole = kept * h + d * h + 4 * E
    gathered = d * load * k * h * 2
    split = d * load * k * (fe + up * fe) + (kept * shared + d * up * shared)
    return whole, split, gathered


def moe_transient_width(model):
    """Elements per token of the largest pair of intermediate gradients a MoE layer's
    backward holds (over the tensor ranks): the experts' ``(1 + kg) * fe`` per routed
    copy, or the shared experts'."""
    up = 2 if model.gated_ffn else 1
    return max(load_factor(model) * model.top_k, model.shared_experts) * (1 + up) \
        * model.expert_ffn
