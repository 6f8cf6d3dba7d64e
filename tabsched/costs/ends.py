"""The kernels of the input embedding and of the output layer, its loss and the
multi-token-prediction modules, as :mod:`tabsched.costs.kernels` lists a layer's (its
notation, its builders).

Embedding (first stage), vocabulary-parallel
    ``embedding_lookup`` (reads ``d*s*h/t`` rows of its shard, writes
    ``d*s*h``), the tensor ``all_reduce`` (``reduce_scatter``),
    ``embedding_dropout``; ``I``: ``embedding_dropout_bwd`` (with sequence
    parallelism, the ``all_gather`` of the gradient); ``W``:
    ``embedding_wgrad`` (scatters ``d*s*h`` into the gradient rows).
    Position embeddings (``s*h`` parameters) are left out.
Output (last stage), vocabulary-parallel
    ``final_norm``, (``all_gather``), ``logits`` (``2*s*h*V/t``, writes the
    ``d*s*V/t`` logits), then the loss as Megatron-LM computes it
    (``megatron/model/gpt_model.py``, ``post_language_model_processing``:
    ``vocab_parallel_cross_entropy(output.float(), labels)`` unless
    ``--fp16-lm-cross-entropy``; ``megatron/mpu/cross_entropy.py``,
    ``_VocabParallelCrossEntropy``), one pass over the ``e = s*V/t`` logits of
    a rank per step: ``logits_to_fp32`` (reads ``d*e``, writes ``4*e``; no
    copy for an fp32 model), ``logits_max`` (reads ``4*e``), the all-reduce
    of each token's maximum, ``logits_shift`` (subtracts it in place: reads
    and writes ``4*e``), the all-reduce of the target logit, ``logits_exp``
    (in place), ``exp_sum`` (reads ``4*e``), the all-reduce of the sums,
    ``softmax_normalize`` (in place; the fp32 probabilities are kept for the
    backward); the three all-reduces carry ``4*s`` bytes each. Backwards:
    ``cross_entropy_bwd`` (scales the probabilities in place: reads and
    writes ``4*e``), ``logits_grad_to_half`` (reads ``4*e``, writes ``d*e``;
    none for fp32), ``logits_dgrad``, the ``all_reduce``
    (``reduce_scatter``), ``final_norm_bwd``; ``W``: ``logits_wgrad``.
Multi-token prediction (``mtp_layers``, DeepSeek-V3): after the output, each module's
norms, its projection of two hidden states to one, one layer and the output again
(:func:`_with_mtp`).
"""

from tabsched.costs.kernels import (MATRIX, VECTOR, Kernel, _backward_combine, _collective,
                                    _combine, _input_gather, _matrix, _prefixed, _rows, _shape,
                                    _vector, _weights, _wgrad, layer_kernels, norm_backward)

__all__ = ["embedding_kernels", "output_kernels"]


def embedding_kernels(model, parallel=None):
    """Kernel lists of the input embedding (first stage), as ``layer_kernels``."""
    x, parallel = _shape(model, parallel)
    h, s, d, g, t, sn, m = x["h"], x["s"], x["d"], x["g"], x["t"], x["sn"], x["m"]
    combine = _combine(x)
    forward = [_vector("embedding_lookup", d * s * h / t, d * s * h), combine]
    backward = []
    if m:
        forward.append(_vector("embedding_dropout", d * sn * h, d * sn * h + m * sn * h))
        backward.append(_vector("embedding_dropout_bwd", d * sn * h + m * sn * h, d * sn * h))
    if x["sp"]:
        backward.append(_collective("all_gather", "all_gather", d * s * h))
    weight = [Kernel("embedding_wgrad", VECTOR, read=(0.0, d * s * h + g * s * h / t),
                     written=(0.0, g * s * h / t))]
    return {"F": forward, "I": backward, "W": weight, "R": []}


def _cross_entropy(x):
    """Megatron-LM's vocabulary-parallel cross entropy on fp32 logits (module docstring)."""
    s, d, t, V = x["s"], x["d"], x["t"], x["V"]
    logits = s * V / t                                    # elements of one rank, per sample
    kernels = [_vector("logits_to_fp32", d * logits, 4 * logits)] if d != 4 else []
    return kernels + [
        _vector("logits_max", 4 * logits, 0.0),
        _collective("cross_entropy_max", "all_reduce", 4 * s),
        _vector("logits_shift", 4 * logits, 4 * logits),
        _collective("cross_entropy_target", "all_reduce", 4 * s),
        _vector("logits_exp", 4 * logits, 4 * logits),
        _vector("exp_sum", 4 * logits, 0.0),
        _collective("cross_entropy_sum", "all_reduce", 4 * s),
        _vector("softmax_normalize", 4 * logits, 4 * logits)]


def output_kernels(model, parallel=None):
    """Kernel lists of the final norm, output layer and loss (last stage), as ``layer_kernels``."""
    x, parallel = _shape(model, parallel)
    h, s, d, g, t, sn, V = x["h"], x["s"], x["d"], x["g"], x["t"], x["sn"], x["V"]
    norm = "rmsnorm" if model.norm == "rmsnorm" else "layernorm"
    gather = [_collective("all_gather", "all_gather", d * s * h)] if x["sp"] else []
    forward = [_vector(f"final_{norm}", d * sn * h, d * sn * h), *gather,
               _matrix("logits", 2 * s * h * V / t, d * V * h / t, d * s * h, d * s * V / t, d,
                       [_rows(s, V / t, h)]),
               *_cross_entropy(x)]
    backward = [_vector("cross_entropy_bwd", 4 * s * V / t, 4 * s * V / t),
                *([_vector("logits_grad_to_half", 4 * s * V / t, d * s * V / t)]
                  if d != 4 else []),
                *_input_gather(x, "logits_dgrad"),
                _matrix("logits_dgrad", 2 * s * V * h / t, d * V * h / t, d * s * V / t,
                        d * s * h, d, [_rows(s, h, V / t)]),
                _backward_combine(x, "logits_wgrad"),
                *norm_backward(x, f"final_{norm}", residual=False)]
    params = V * h / t
    weight = [Kernel("logits_wgrad", MATRIX, (0.0, 2 * s * params),
                     (g * params, d * s * (h + V / t)), (g * params, 0.0), outputs=(params, 0.0),
                     gemms=(_weights(h, V / t, s),))]
    head = {"F": forward, "I": backward, "W": weight, "R": []}
    if not model.mtp_layers:
        return head
    return _with_mtp(model, parallel, x, norm, head)


def _with_mtp(model, parallel, x, norm, head):
    """The output part with DeepSeek-V3's multi-token-prediction modules after it
    (DeepSeek-AI 2024, DeepSeek-V3 technical report, section 2.2): module ``i`` norms the
    previous depth's hidden state and the embedding of the token ``i + 1`` ahead, projects
    their concatenation (``2h -> h``, tensor-parallel, reduced after), runs one layer
    (a MoE layer in a MoE model) and the shared output layer and loss again. Its kernels
    are the layer's and the output's, named ``mtp{i}_...``."""
    h, s, d, t, sn = x["h"], x["s"], x["d"], x["t"], x["sn"]
    gather = [_collective("all_gather", "all_gather", d * s * 2 * h)] if x["sp"] else []
    layer = layer_kernels(model, parallel)
    lists = {phase: list(kernels) for phase, kernels in head.items()}
    for depth in range(model.mtp_layers):
        inputs = [_vector("embedding_lookup", d * s * h / t, d * s * h), _combine(x),
                  _vector(f"{norm}_inputs", 2 * d * sn * h, 2 * d * sn * h), *gather,
                  _matrix("proj", 2 * s * 2 * h * h / t, d * 2 * h * h / t, d * s * 2 * h,
                          d * s * h, d, [_rows(s, h, 2 * h / t)]), _combine(x)]
        inputs_bwd = [*gather,
                      _matrix("proj_dgrad", 2 * s * 2 * h * h / t, d * 2 * h * h / t,
                              d * s * h, d * s * 2 * h, d, [_rows(s, 2 * h, h / t)]),
                      _backward_combine(x, "proj_wgrad"),
                      # the two norms' backwards (two passes each, no residual)
                      _vector(f"{norm}_inputs_bwd", 8 * d * sn * h, 2 * d * sn * h)]
        proj_wgrad = _wgrad(x, "proj_wgrad", 2 * h, h, 2 * h, h / t)
        module = {"F": inputs + layer["F"] + head["F"],
                  "I": head["I"] + layer["I"] + inputs_bwd,
                  "W": head["W"] + layer["W"] + [proj_wgrad]}
        for phase, kernels in module.items():
            lists[phase] += [_prefixed(kernel, f"mtp{depth}_") for kernel in kernels]
    return lists
