"""Kernel lists of a tiny layer by hand: FLOPs, bytes read and written, class, collectives."""

import pytest

from tabsched.costs.ends import embedding_kernels, output_kernels
from tabsched.costs.kernels import COLLECTIVE, MATRIX, VECTOR, KernelTable, layer_kernels
from tabsched.execution import Parallelism
from tabsched.costs.transformer import TransformerModel

# h=64, a=4 (dh 16), s=16, V=100, bf16 (d=2), dropout (1-byte masks), f=4h=256, g=2.
SMALL = dict(layers=2, hidden=64, heads=4, sequence=16, vocab=100)

# One sample's forward, t=1: (name, class, FLOPs, weights read once, read, written)
FORWARD = [
    ("layernorm1", VECTOR, 0, 0, 2 * 16 * 64, 2 * 16 * 64),
    ("qkv", MATRIX, 2 * 16 * 64 * 192, 2 * 64 * 192, 2 * 16 * 64, 2 * 16 * 192),
    ("scores", MATRIX, 2 * 16 * 16 * 64, 0, 2 * 16 * 128, 2 * 4 * 16 * 16),
    ("softmax", VECTOR, 0, 0, 2048, 2048),
    ("attention_dropout", VECTOR, 0, 0, 2048, 2048 + 4 * 16 * 16),
    ("attention_over_values", MATRIX, 2 * 16 * 16 * 64, 0, 2048 + 2 * 16 * 64, 2 * 16 * 64),
    ("out_proj", MATRIX, 2 * 16 * 64 * 64, 2 * 64 * 64, 2048, 2048),
    ("all_reduce", COLLECTIVE, 0, 0, 0, 0),
    ("bias_dropout_add", VECTOR, 0, 0, 2 * 2048, 2048 + 16 * 64),
    ("layernorm2", VECTOR, 0, 0, 2048, 2048),
    ("mlp_up", MATRIX, 2 * 16 * 64 * 256, 2 * 64 * 256, 2048, 2 * 16 * 256),
    ("activation", VECTOR, 0, 0, 8192, 8192),
    ("mlp_down", MATRIX, 2 * 16 * 256 * 64, 2 * 256 * 64, 8192, 2048),
    ("all_reduce", COLLECTIVE, 0, 0, 0, 0),
    ("bias_dropout_add", VECTOR, 0, 0, 2 * 2048, 2048 + 16 * 64),
]


def small(**changes):
    return TransformerModel(**{**SMALL, **changes})


def test_forward_kernels_by_hand():
    kernels = layer_kernels(small())["F"]
    assert len(kernels) == len(FORWARD)
    for kernel, (name, cls, flops, weights, read, written) in zip(kernels, FORWARD):
        assert (kernel.name, kernel.cls) == (name, cls)
        assert kernel.flops == (0.0, flops), name
        assert kernel.read == (weights, read), name
        assert kernel.written == (0.0, written), name
    collectives = [kernel for kernel in kernels if kernel.cls == COLLECTIVE]
    assert [kernel.message for kernel in collectives] == [(0.0, 2 * 16 * 64)] * 2
    # the per-sample bytes the hand sums in tests/test_transformer.py use
    assert sum(read + written for *_, read, written in FORWARD) == 93184


def test_input_and_weight_grad_mirror_the_forward():
    lists = layer_kernels(small())
    backward = {kernel.name: kernel for kernel in lists["I"]}
    # each data gradient costs its forward's FLOPs and reads the weights once
    for name in ("qkv", "out_proj", "mlp_up", "mlp_down"):
        forward = next(kernel for kernel in lists["F"] if kernel.name == name)
        assert backward[f"{name}_dgrad"].flops == forward.flops
        assert backward[f"{name}_dgrad"].read[0] == forward.read[0]
    # attention backward: dP, dV (4s^2h) and dQ, dK (4s^2h)
    assert backward["attention_over_values_bwd"].flops == (0.0, 4 * 16 * 16 * 64)
    assert backward["scores_bwd"].flops == (0.0, 4 * 16 * 16 * 64)
    assert backward["softmax_bwd"].read == (0.0, 2 * 2048)
    # weight gradients: 2*s*P FLOPs, read the input and the output gradient, accumulate g*P
    weight = {kernel.name: kernel for kernel in lists["W"]}
    qkv = weight["qkv_wgrad"]
    assert qkv.flops == (0.0, 2 * 16 * 64 * 192)
    assert qkv.read == (2 * 64 * 192, 2 * 16 * (64 + 192))
    assert qkv.written == (2 * 64 * 192, 0.0)
    assert qkv.outputs == (64 * 192, 0.0)
    # without tensor parallelism the backward collectives carry nothing to hide
    assert [kernel.hides_behind for kernel in lists["I"] if kernel.cls == COLLECTIVE] == \
        ["mlp_up_wgrad", "qkv_wgrad"]



@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_bias_gradients_reduce_each_products_output_gradient_over_the_tokens(
        sequence_parallel):
    """Megatron-LM's four biases per layer: QKV's and the MLP's first product's over all
    of the rank's tokens (their outputs are split over the tensor ranks), the row-parallel
    products' over the tokens the bias-dropout-add sees (``s/t`` with sequence
    parallelism). Without biases, none."""
    t = 4
    parallel = Parallelism(tensor_parallel=t, sequence_parallel=sequence_parallel)
    weight = {kernel.name: kernel for kernel in layer_kernels(small(), parallel)["W"]}
    sn = 16 / t if sequence_parallel else 16
    assert weight["qkv_bias_grad"].read == (0.0, 2 * 16 * 192 / t)
    assert weight["mlp_up_bias_grad"].read == (0.0, 2 * 16 * 256 / t)
    assert weight["out_proj_bias_grad"].read == (0.0, 2 * sn * 64)
    assert weight["mlp_down_bias_grad"].read == (0.0, 2 * sn * 64)
    assert all(weight[name].cls == VECTOR and weight[name].flops == (0.0, 0.0)
               for name in weight if name.endswith("_bias_grad"))
    unbiased = layer_kernels(small(bias=False), parallel)["W"]
    assert [kernel.name for kernel in unbiased] == \
        [name for name in weight if not name.endswith("_bias_grad")]


def test_norm_backward_makes_two_passes_then_adds_the_residuals_gradient():
    """Per norm of a layer: the scale's gradient pass reads dy and x, the input's pass
    reads them again and writes dx, the residual's add reads two gradients and writes one
    (``layer_norm_cuda_kernel.cu``); the final norm has no residual to add."""
    backward = {kernel.name: kernel for kernel in layer_kernels(small())["I"]}
    for norm in ("layernorm1", "layernorm2"):
        parts = [backward[f"{norm}{part}"]
                 for part in ("_bwd_weight", "_bwd", "_residual_grad")]
        assert sum(kernel.read[1] for kernel in parts) == 6 * 2048
        assert sum(kernel.written[1] for kernel in parts) == 2 * 2048
    final = [kernel.name for kernel in output_kernels(small())["I"]
             if kernel.name.startswith("final_")]
    assert final == ["final_layernorm_bwd_weight", "final_layernorm_bwd"]

@pytest.mark.parametrize("recompute,names", [
    ("none", []),
    ("selective", ["recompute_scores", "recompute_softmax", "recompute_attention_dropout",
                   "recompute_attention_over_values"]),
    ("full", [f"recompute_{name}" for name, *_ in FORWARD]),
])
def test_recompute_forward(recompute, names):
    assert [kernel.name for kernel in layer_kernels(small(recompute=recompute))["R"]] == names


def test_tensor_and_sequence_parallelism_split_the_work():
    serial = KernelTable(layer_kernels(small())["F"]).work([1.0])
    t4 = Parallelism(tensor_parallel=4)
    split = KernelTable(layer_kernels(small(), t4)["F"]).work([1.0])
    assert split["flops"].sum() == pytest.approx(serial["flops"].sum() / 4)
    sp = layer_kernels(small(), t4.replace(sequence_parallel=True))
    names = [kernel.name for kernel in sp["F"]]
    assert names.count("all_gather") == 2 and names.count("reduce_scatter") == 2
    norm = next(kernel for kernel in sp["F"] if kernel.name == "layernorm1")
    assert norm.read == (0.0, 2 * 16 * 64 / 4)          # the norm sees s/t tokens
    backward = [(kernel.name, kernel.hides_behind) for kernel in sp["I"]
                if kernel.cls == COLLECTIVE]
    assert backward == [("all_gather", None), ("all_gather_input", "mlp_up_dgrad"),
                        ("reduce_scatter", "mlp_up_wgrad"), ("all_gather", None),
                        ("all_gather_input", "qkv_dgrad"), ("reduce_scatter", "qkv_wgrad")]


def test_flash_attention_fuses_the_core_without_s_squared_traffic():
    flash = Parallelism(attention="flash")
    kernels = {kernel.name: kernel for kernel in layer_kernels(small(), flash)["F"]}
    core = kernels["flash_attention"]
    assert core.flops == (0.0, 4 * 16 * 16 * 64)              # FLOPs as eager
    assert core.read == (0.0, 2 * 16 * 192) and core.written == (0.0, 2 * 16 * 64)
    assert "softmax" not in kernels and "scores" not in kernels
    assert layer_kernels(small(recompute="selective"), flash)["R"] == []


def test_embedding_and_output_kernels():
    model = small()
    embedding = embedding_kernels(model)
    assert [kernel.name for kernel in embedding["F"]] == ["embedding_lookup", "all_reduce",
                                                           "embedding_dropout"]
    output = output_kernels(model)
    logits = next(kernel for kernel in output["F"] if kernel.name == "logits")
    assert logits.flops == (0.0, 2 * 16 * 64 * 100)
    assert logits.read == (2 * 100 * 64, 2 * 16 * 64)
    # Megatron-LM's loss: an fp32 copy of the logits, then one pass per step (max, shift,
    # exp, sum, normalize), three small all-reduces; the backward scales the probabilities
    # in place and casts the gradient back to the model's dtype
    names = [kernel.name for kernel in output["F"]]
    assert names[names.index("logits") + 1:] == [
        "logits_to_fp32", "logits_max", "cross_entropy_max", "logits_shift",
        "cross_entropy_target", "logits_exp", "exp_sum", "cross_entropy_sum",
        "softmax_normalize"]
    passes = {kernel.name: (kernel.read[1], kernel.written[1]) for kernel in output["F"]}
    logits = 16 * 100                                         # s*V/t elements, per sample
    assert passes["logits_to_fp32"] == (2 * logits, 4 * logits)
    assert passes["logits_shift"] == passes["softmax_normalize"] == (4 * logits, 4 * logits)
    assert passes["logits_max"] == passes["exp_sum"] == (4 * logits, 0.0)
    loss = names[names.index("logits") + 1:]
    assert sum(sum(passes[name]) for name in loss) == 38 * logits   # collectives: messages
    backward = {kernel.name: (kernel.read[1], kernel.written[1]) for kernel in output["I"]}
    assert backward["cross_entropy_bwd"] == (4 * logits, 4 * logits)
    assert backward["logits_grad_to_half"] == (4 * logits, 2 * logits)
    fp32 = [kernel.name for phase in ("F", "I")
            for kernel in output_kernels(small(dtype="fp32"))[phase]]
    assert "logits_to_fp32" not in fp32 and "logits_grad_to_half" not in fp32
    assert output["W"][0].flops == (0.0, 2 * 16 * 64 * 100)
    llama = small(norm="rmsnorm")
    assert output_kernels(llama)["F"][0].name == "final_rmsnorm"
