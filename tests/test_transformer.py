"""TransformerModel: FLOPs, bytes and activations checked against hand computations."""

import numpy as np
import pytest

from tabsched import (InvalidParameterError, TransformerModel, UnknownNameError, load_model,
                      model_presets)
from tabsched.execution import Parallelism
from tabsched.table import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD

# A small GPT layer: h=64, a=4, s=16, V=100, bf16; b=2 samples, so T=32 tokens.
SMALL = dict(layers=2, hidden=64, heads=4, sequence=16, vocab=100)


def small(**changes):
    return TransformerModel(**{**SMALL, **changes})


def test_parameters_by_hand():
    model = small()
    assert model.layer_parameters == 12 * 64 * 64 == 49152
    assert model.embedding_parameters == model.output_parameters == 6400
    assert model.parameters == 2 * 49152 + 2 * 6400
    assert model.stage_parameters(1, True, False) == 49152 + 6400
    gqa = small(kv_heads=2, ffn=96, gated_ffn=True)
    # Q and O 64x64, K and V 64x32 (2 heads of 16), three 64x96 MLP matrices
    assert gqa.layer_parameters == 2 * 4096 + 2 * 64 * 32 + 3 * 64 * 96 == 30720


def test_flops_by_hand():
    model = small()
    flops, _ = model.layer_work(2)
    matmul = 2 * 32 * 49152                       # 2 * T * P = 24 * T * h^2 = 3,145,728
    scores = 4 * 2 * 16 * 16 * 64                 # 4 * b * s^2 * h = 131,072
    assert flops[FORWARD, 0] == matmul + scores == 3_276_800
    assert flops[INPUT_GRAD, 0] == matmul + 2 * scores == 3_407_872
    assert flops[WEIGHT_GRAD, 0] == matmul
    assert flops[BACKWARD, 0] == flops[INPUT_GRAD, 0] + flops[WEIGHT_GRAD, 0]
    selective, _ = small(recompute="selective").layer_work(2)
    assert selective[INPUT_GRAD, 0] == matmul + 3 * scores
    full, _ = small(recompute="full").layer_work(2)
    assert full[INPUT_GRAD, 0] == matmul + 2 * scores + (matmul + scores)
    assert full[WEIGHT_GRAD, 0] == matmul
    head, _ = model.output_work(2)
    assert head[[FORWARD, INPUT_GRAD, WEIGHT_GRAD], 0].tolist() == [2 * 32 * 64 * 100] * 3
    assert head[BACKWARD, 0] == 2 * 2 * 32 * 64 * 100
    embedding, _ = model.embedding_work(2)
    assert not embedding.any()


def test_activations_match_korthikanti():
    s, b, h, a = 16, 2, 64, 4
    model = small()
    assert model.layer_activation(b) == s * b * h * (34 + 5 * a * s // h) == 79872
    assert model.layer_activation(b, "selective") == 34 * s * b * h == 69632
    assert model.layer_activation(b, "full") == 2 * s * b * h == 4096
    assert model.output_activation(b) == 4 * s * b * h * (1 + 100 / h) == 20992
    assert model.embedding_activation(b) == s * b * h
    assert model.transfer_bytes(b) == 2 * b * s * h
    # exact integers for ints, arrays for arrays
    assert isinstance(model.layer_activation(b), int)
    assert model.layer_activation(np.array([1.0, 2.0])).tolist() == [39936.0, 79872.0]


def test_activations_per_tensor_for_gqa_swiglu_without_dropout():
    model = small(kv_heads=2, ffn=96, gated_ffn=True, dropout=False)
    d, h, hk, f, T = 2, 64, 32, 96, 32
    attention = d * (3 * h + 2 * hk)     # QKV input, Q, K, V, output-projection input
    mlp = d * h + 3 * d * f               # MLP input; gate, up and their product
    norms = 2 * d * h
    per_token = attention + mlp + norms
    assert model.layer_activation(2, "selective") == T * per_token
    assert model.layer_activation(2) == T * per_token + d * 4 * 16 * 16 * 2
    assert model.embedding_activation(2) == 0


def test_bytes_moved_are_every_kernels_reads_and_writes():
    """The forward's bytes (b=2): weights read once (d*P = 98,304) plus 93,184 per sample,
    summed by hand over the kernels in tests/test_kernels.py."""
    model = small()
    _, nbytes = model.layer_work(2)
    assert nbytes[FORWARD, 0] == 2 * 49152 + 2 * 93184 == 284672
    assert nbytes[BACKWARD, 0] == nbytes[INPUT_GRAD, 0] + nbytes[WEIGHT_GRAD, 0]
    kept = 32 * 16 * 2 * 64               # W's matmul inputs and output gradients: 32sbh
    assert model.weight_grad_kept(2) == kept


def test_flops_equal_narayanan_closed_form():
    """Narayanan et al. 2021 (appendix): an iteration of B samples costs
    96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) FLOPs with full recomputation and
    72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) without; per tensor rank, t times less."""
    B, s, l, h, V = 8, 64, 6, 128, 1000
    for recompute, factor, vocab in (("full", 96, 16), ("none", 72, 12), ("selective", None, None)):
        model = TransformerModel(layers=l, hidden=h, heads=8, sequence=s, vocab=V,
                                 recompute=recompute)
        for t in (1, 4):
            parallel = Parallelism(tensor_parallel=t)
            layer, _ = model.layer_work(B, parallel)
            head, _ = model.output_work(B, parallel)
            total = t * (l * (layer[FORWARD, 0] + layer[BACKWARD, 0])
                         + head[FORWARD, 0] + head[BACKWARD, 0])
            if factor is None:   # selective: no-recompute plus the attention core again
                expected = 72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)) \
                    + l * 4 * B * s * s * h
            else:
                expected = factor * B * s * l * h * h * (1 + s / (6 * h) + V / (vocab * l * h))
            assert total == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_activations_match_korthikanti_with_tensor_parallelism(sequence_parallel):
    """Korthikanti et al. 2022, Table 2, per layer and tensor rank (d = 2, dropout, f = 4h)."""
    s, b, h, a, t = 32, 2, 64, 8, 4
    model = TransformerModel(layers=2, hidden=h, heads=a, sequence=s, vocab=100)
    parallel = Parallelism(tensor_parallel=t, sequence_parallel=sequence_parallel)
    sbh = s * b * h
    if sequence_parallel:
        expected = {"none": sbh * (34 + 5 * a * s / h) / t, "selective": 34 * sbh / t,
                    "full": 2 * sbh / t}
    else:
        expected = {"none": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
                    "selective": sbh * (10 + 24 / t), "full": 2 * sbh}
    for recompute, value in expected.items():
        assert model.layer_activation(b, recompute, parallel=parallel) == pytest.approx(value)
    # flash attention keeps no score tensors: "none" is "selective"
    flash = parallel.replace(attention="flash")
    assert model.layer_activation(b, "none", parallel=flash) == pytest.approx(
        expected["selective"])
    # section 4.3: the output layer's 4sbh/t*(1 + V/h) with sequence parallelism
    output = model.output_activation(b, parallel)
    assert output == pytest.approx(4 * sbh / t * (1 + 100 / h) if sequence_parallel
                                   else 4 * sbh + 4 * s * b * 100 / t)


def test_full_recompute_working_memory_is_one_layer_again():
    """While a fully recomputed layer runs its backward, its whole activation exists again,
    plus one layer's activation-gradient buffer (2*d*s*b*h and the score gradients)."""
    model = small(recompute="full")
    b, s, h, a, d = 2, 16, 64, 4, 2
    buffer = 2 * d * s * b * h + max(2 * d * a * s * s * b, d * s * b * 2 * 256)
    again = model.layer_activation(b, "none") - model.layer_activation(b, "full")
    assert model.layer_transient(b) == pytest.approx(buffer + again)
    assert small().layer_transient(b) == pytest.approx(buffer)
    selective = small(recompute="selective")
    assert selective.layer_transient(b) == pytest.approx(buffer + model._score_bytes(b))


def test_optimizer_bytes_and_sharding():
    model = small(dtype="fp16")
    assert model.bytes_per_param == 16.0          # 2 weights + 2 gradients + 12 Adam state
    assert model.optimizer_state_bytes(4) == 2 + 2 + 12 / 4
    assert small(grad_bytes=4).bytes_per_param == 18.0
    assert small(bytes_per_param=20).optimizer_state_bytes(2) == 2 + 2 + 16 / 2
    assert model.optimizer_step_bytes == 2 * 2 + 2 + 24 + 24


def test_input_grad_release():
    # I frees everything W does not need: 1 - 32sbh / stored
    assert small().input_grad_release == pytest.approx(1 - 32 / 39)
    assert small(recompute="selective").input_grad_release == pytest.approx(1 - 32 / 34)
    assert small(recompute="full").input_grad_release == 0.0


def test_work_scales_with_samples_where_it_should():
    model = small()
    flops, nbytes = model.layer_work([1, 2])
    np.testing.assert_allclose(flops[:, 1], 2 * flops[:, 0])
    weights = 2 * 49152
    np.testing.assert_allclose(nbytes[FORWARD, 1] - weights, 2 * (nbytes[FORWARD, 0] - weights))


def test_presets_have_the_published_sizes():
    models = model_presets()
    assert set(models) >= {"paper-128l", "gpt3-175b", "llama3-8b", "llama3-70b"}
    assert models["llama3-8b"].parameters == pytest.approx(8.03e9, rel=2e-3)
    assert models["llama3-70b"].parameters == pytest.approx(70.6e9, rel=2e-3)
    assert models["gpt3-175b"].parameters == pytest.approx(175e9, rel=5e-3)
    paper = models["paper-128l"]
    assert (paper.layers, paper.hidden, paper.heads, paper.sequence, paper.dtype_bytes) == \
        (128, 4096, 32, 4096, 2)
    assert paper.layer_activation(1, "none") == 4096 * 4096 * (34 + 5 * 32)
    # Narayanan et al. 2021, Table 1 (the embedding counted once): 529.6B and 1008.0B;
    # Korthikanti et al. 2022, Table 3: 22B
    for name, published, rel in (("megatron-22b", 22e9, 5e-3), ("turing-530b", 529.6e9, 1e-3),
                                 ("megatron-1t", 1008.0e9, 1e-3)):
        model = models[name]
        assert (model.sequence, model.vocab, model.dtype) == (2048, 51200, "fp16")
        assert model.parameters - model.output_parameters == pytest.approx(published, rel=rel)
    assert not models["llama3-8b"].tied_embeddings and models["llama3-8b"].norm == "rmsnorm"


@pytest.mark.parametrize("changes,message", [
    (dict(hidden=0), r"hidden must be a positive integer, not 0"),
    (dict(layers=2.5), r"layers must be a positive integer, not 2\.5"),
    (dict(heads=5), r"hidden 64 is not divisible by heads 5"),
    (dict(kv_heads=3), r"heads 4 is not divisible by kv_heads 3"),
    (dict(recompute="partial"), r"recompute 'partial' is not one of none, selective, full"),
    (dict(dtype="int4"), r"dtype 'int4' is not one of fp8, bf16"),
    (dict(dtype=3), r"dtype must be one of .* not 3"),
    (dict(bytes_per_param=-1), r"bytes_per_param must be >= 0, not -1"),
    (dict(gated_ffn="yes"), r"gated_ffn must be true or false, not 'yes'"),
    (dict(microbatch_size=0), r"microbatch_size must be a positive integer, not 0"),
    (dict(norm="batchnorm"), r"norm 'batchnorm' is not one of layernorm, rmsnorm"),
    (dict(grad_bytes=3), r"grad_bytes must be 1, 2, 4 or 8, not 3"),
    (dict(optimizer_bytes=-1), r"optimizer_bytes must be >= 0, not -1"),
    (dict(tied_embeddings="no"), r"tied_embeddings must be true or false, not 'no'"),
])
def test_model_errors(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        small(**changes)


def write(tmp_path, text, name="model.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_user_toml_with_the_same_keys(tmp_path):
    path = write(tmp_path, 'layers = 4\nhidden = 64\nheads = 4\nsequence = 16\nvocab = 100\n'
                           'dtype = "fp32"\nrecompute = "full"\n')
    model = load_model(path)
    assert (model.layers, model.dtype_bytes, model.recompute, model.name) == (4, 4, "full", path)


@pytest.mark.parametrize("text,message", [
    ('layers = 4\nheads = 4\nsequence = 16\nvocab = 100\n', r"model\.toml: missing key 'hidden'"),
    ('layers = 4\nhiden = 64\nhidden = 64\nheads = 4\nsequence = 16\nvocab = 100\n',
     r"model\.toml: unknown key 'hiden' \(did you mean 'hidden'\?\)"),
    ('layers = 4\nhidden = 64\nheads = 4\nsequence = 16\nvocab = -100\n',
     r"model\.toml: vocab must be a positive integer, not -100"),
    ('layers = 4\nhidden = \n', r"model\.toml: not valid TOML: "),
    ('kind = "system"\n', r"model\.toml: kind is 'system', but a model was expected"),
])
def test_user_toml_errors_name_the_file_and_key(tmp_path, text, message):
    with pytest.raises(InvalidParameterError, match=message):
        load_model(write(tmp_path, text))


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(UnknownNameError, match=r"unknown model preset 'llama-3-8b' \(did you "
                                               r"mean 'llama3-8b'\?\); valid models: "
                                               r"deepseek-v3-14l, deepseek-v3, gpt3-175b, "
                                               r"llama3-405b, llama3-70b, llama3-8b, "
                                               r"megatron-1t, megatron-22b, mixtral-8x7b, "
                                               r"paper-128l, qwen3-30b-a3b, turing-530b"):
        load_model("llama-3-8b")
    with pytest.raises(OSError):
        load_model("no/such/model.toml")


# ------------------------------------------------- untrusted values (issue 13)
def test_work_is_finite_at_the_edges_of_the_sane_ranges():
    """The largest model the ranges allow (with the largest microbatch) still counts its
    FLOPs and bytes in float64 with hundreds of orders of magnitude to spare."""
    from tabsched.costs import transformer
    largest = TransformerModel(transformer.MAX_LAYERS, transformer.MAX_HIDDEN,
                               transformer.MAX_HIDDEN, transformer.MAX_SEQUENCE,
                               transformer.MAX_VOCAB, ffn=transformer.MAX_FFN,
                               microbatch_size=transformer.MAX_MICROBATCH_SIZE,
                               optimizer_bytes=transformer.MAX_OPTIMIZER_BYTES)
    for work in (largest.layer_work, largest.embedding_work, largest.output_work):
        flops, nbytes = work(transformer.MAX_MICROBATCH_SIZE)
        assert np.all(np.isfinite(flops)) and np.all(np.isfinite(nbytes))
        assert flops.max() < 1e40 and nbytes.max() < 1e40


@pytest.mark.parametrize("changes,message", [
    (dict(layers=100_001), r"layers must be an integer from 1 to 100000, not 100001"),
    (dict(hidden=np.int64(2**21), heads=4), r"hidden must be an integer from 1 to 1048576"),
    (dict(sequence=10**5000), r"sequence must be an integer from 1 to 134217728, not <an "
                              r"integer of 5001 digits>"),
    (dict(vocab=np.float64(100.0)), r"vocab must be a positive integer, not 100\.0"),
    (dict(dtype=True), r"dtype must be one of fp8, bf16, fp16, fp32, fp64 or 1, 2, 4, 8 bytes, "
                       r"not True"),
    (dict(grad_bytes=4.0), r"grad_bytes must be 1, 2, 4 or 8, not 4\.0"),
    (dict(optimizer_bytes="12"), r"optimizer_bytes must be a number, not '12'"),
    (dict(bytes_per_param=float("nan")), r"bytes_per_param must be a number, not nan"),
    (dict(norm=["rmsnorm"]), r"norm \['rmsnorm'\] is not one of layernorm, rmsnorm"),
    (dict(name="a\nb"), r"name must be one line of printable text, not 'a\\nb'"),
])
def test_values_outside_the_sane_ranges_name_the_key(changes, message):
    with pytest.raises(InvalidParameterError, match=message):
        small(**changes)
