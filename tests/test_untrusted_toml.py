"""System and model TOML files are untrusted (issue 13, item 4): a test per class of bad input.

Each class is checked through the CLI (exit 1, exactly one ``Error:`` line, no
traceback, no warning) and through the API (the exception type and its
message): nesting, wrong types, overrides of devices the run does not have,
numbers outside their sane range, unknown keys, oversized files, and the last
line of defence, a result that would report ``inf`` or ``nan``. The fuzzing of
the same readers runs in ``tests/_fuzz_readers_worker.py``.
"""

import re

import numpy as np
import pytest

from tabsched import (InvalidParameterError, ModelCosts, StageCosts, System, TransformerModel,
                      UnitCosts, evaluate, generate, load_model, load_system)
from tabsched.compare import compare
from tabsched.costs import _presets
from tabsched.evaluate import evaluate_many

SYSTEM = ('peak_flops = "1PFLOP/s"\nmemory_bandwidth = "3TB/s"\ndevices_per_node = 4\n'
          'intra_node_bandwidth = "100GB/s"\nintra_node_latency = "1us"\n'
          'inter_node_bandwidth = "10GB/s"\ninter_node_latency = "5us"\n')
MODEL = 'layers = 8\nhidden = 64\nheads = 4\nsequence = 16\nvocab = 100\n'
#: 8 devices of 4 per node: two nodes.
RUN = ["eval", "1f1b", "-p", "8", "-m", "8"]




def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def refused(cli_error, tmp_path, kind, content, message):
    """``content`` as a system (or model) file: the same one-line error from the API and CLI."""
    path = write(tmp_path, f"{kind}.toml", content)
    loader = load_system if kind == "system" else load_model
    with pytest.raises(InvalidParameterError, match=message) as error:
        loader(str(path))
    assert "\n" not in str(error.value) and len(str(error.value)) < 400   # as the CLI line
    argv = ["--system", path, "--model", "paper-128l"] if kind == "system" else \
        ["--model", path, "--system", "mid_nw_mid_cp"]
    assert re.search(message, cli_error(*RUN, *argv))


def test_good_files_load(tmp_path):
    system = load_system(str(write(tmp_path, "system.toml", SYSTEM)))
    model = load_model(str(write(tmp_path, "model.toml", MODEL)))
    assert (system.devices_per_node, model.layers) == (4, 8)


# ------------------------------------------------------------------ nesting
NESTING = [
    ("a = " + "[" * 5000 + "]" * 5000 + "\n",
     r"system\.toml: not a system file: arrays or inline tables nested more than 16 deep"),
    ("a = " + "{b = " * 5000 + "1" + "}" * 5000 + "\n",
     r"arrays or inline tables nested more than 16 deep"),
    ("a" + ".a" * 100_000 + " = 1\n", r"a key or table name of more than 16 dotted parts"),
    ("[" + "a." * 100_000 + "a]\nb = 1\n", r"a key or table name of more than 16 dotted parts"),
    ("[[" + "a." * 50 + "a]]\nb = 1\n", r"a key or table name of more than 16 dotted parts"),
    # a multi-line string may end in up to two quotes of its own: the scan must not read
    # the last one as the start of a string that hides what follows
    ("a = ['''x'''', " + "[" * 5000 + "]" * 5000 + "]\n",
     r"arrays or inline tables nested more than 16 deep"),
    ('a = ["""x"""", ' + "{b = " * 5000 + "1" + "}" * 5000 + "]\n",
     r"arrays or inline tables nested more than 16 deep"),
]


@pytest.mark.parametrize("content,message", NESTING)
def test_nesting_is_measured_before_the_parser_recurses(cli_error, tmp_path, content, message):
    refused(cli_error, tmp_path, "system", SYSTEM + content, message)
    refused(cli_error, tmp_path, "model", MODEL + content, message.replace("system", "model"))


def test_brackets_and_dots_inside_strings_and_comments_are_not_nesting(tmp_path):
    deep = "[" * 40 + "." * 40 + "{" * 40
    content = (SYSTEM + f'description = "{deep}"\nname = \'{deep}\'\n# {deep}\n'
               f'compute_efficiency = [["1GFLOP", 0.5], ["10GFLOP", 0.6], ["100GFLOP", 0.7],\n'
               + "".join(f'  [{10 ** k}.5, 0.8],\n' for k in range(12, 30)) + "]\n")
    system = load_system(str(write(tmp_path, "system.toml", content)))
    assert system.description == deep and len(system.compute_efficiency) == 21
    assert _presets.nesting_problem('a = """' + deep + '"""\nb = \'\'\'' + deep + "'''") == ""


# ------------------------------------------------------------------ wrong types
WRONG_TYPES = [
    ("link_overrides = 5", r"link_overrides must be an array of tables \(\[\[link_overrides\]\] "
                           r"entries, each with devices and a bandwidth and/or latency\), not 5"),
    ('link_overrides = "slow"', r"link_overrides must be an array of tables .* not 'slow'"),
    ("link_overrides = {devices = [0, 1], bandwidth = 1e9}",
     r"link_overrides must be an array of tables .* not \{'devices': \[0, 1\]"),
    ('link_overrides = ["a", "b"]',
     r"link_overrides\[0\] must be a table with devices and a bandwidth and/or latency, not 'a'"),
    ("node_overrides = [[1, 2]]", r"node_overrides\[0\] must be a table with node .* not \[1, 2\]"),
    ("[[link_overrides]]\ndevices = {a = 0, b = 1}\nbandwidth = 1e9",
     r"link_overrides\[0\]\.devices must be two devices, not \{'a': 0, 'b': 1\}"),
    ('[[link_overrides]]\ndevices = ["0", "1"]\nbandwidth = 1e9',
     r"link_overrides\[0\]\.devices must be a positive integer|link_overrides\[0\]\.devices "
     r"must be an integer >= 0, not '0'"),
    ('[[node_overrides]]\nnode = 1.0\nlatency = "1ms"',
     r"node_overrides\[0\]\.node must be an integer >= 0, not 1\.0"),
    ("[[node_overrides]]\nnode = 1\nbandwidth = true",
     r"node_overrides\[0\]\.bandwidth must be a number or a quantity such as '450GB/s', not True"),
    ("[[link_overrides]]\ndevices = [0, 1]\nlatency = [1]",
     r"link_overrides\[0\]\.latency must be a number or a quantity such as '1\.2ms', not \[1\]"),
    ("compute_efficiency = [{a = 1, b = 2}]",
     r"compute_efficiency\[0\] must be a pair \[work, efficiency\], not \{'a': 1, 'b': 2\}"),
    ("compute_efficiency = true", r"compute_efficiency must be a number, not True"),
    ('inter_node_efficiency = "high"', r"inter_node_efficiency must be a number, not 'high'"),
    ("blocking_sends = 1", r"blocking_sends must be true or false, not 1"),
    ("contention = 5", r"contention 5 is not one of none, link, nic"),
    ("description = 5", r"description must be text, not 5"),
    ('name = "two\\nlines"', r"name must be one line of printable text, not 'two\\nlines'"),
    ('kind = ["system"]', r"kind is \['system'\], but a system was expected"),
]
REPLACED = [
    ("peak_flops", "{a = 1}", r"peak_flops must be a number or a quantity such as "
                              r"'1PFLOP/s', not \{'a': 1\}"),
    ("memory_bandwidth", "true", r"memory_bandwidth must be a number or a quantity such as "
                                 r"'450GB/s', not True"),
    ("intra_node_latency", "1979-05-27", r"intra_node_latency must be a number or a quantity "
                                         r"such as '1\.2ms', not datetime\.date\(1979, 5, 27\)"),
    ("devices_per_node", "8.0", r"devices_per_node must be a positive integer, not 8\.0"),
    ("devices_per_node", "true", r"devices_per_node must be a positive integer, not True"),
    ("devices_per_node", '"8"', r"devices_per_node must be a positive integer, not '8'"),
]
MODEL_WRONG_TYPES = [
    ("layers", "8.0", r"layers must be a positive integer, not 8\.0"),
    ("hidden", '"64"', r"hidden must be a positive integer, not '64'"),
    ("heads", "true", r"heads must be a positive integer, not True"),
    ("vocab", "[100]", r"vocab must be a positive integer, not \[100\]"),
    ("dropout", "1", r"dropout must be true or false, not 1"),
    ("dtype", "2.0", r"dtype must be one of fp8, bf16, fp16, fp32, fp64 or 1, 2, 4, 8 bytes, "
                     r"not 2\.0"),
    ("dtype", "{bytes = 2}", r"dtype must be one of .* not \{'bytes': 2\}"),
    ("grad_bytes", "4.0", r"grad_bytes must be 1, 2, 4 or 8, not 4\.0"),
    ("optimizer_bytes", '"12"', r"optimizer_bytes must be a number, not '12'"),
    ("bytes_per_param", "false", r"bytes_per_param must be a number, not False"),
    ("recompute", '["full"]', r"recompute \['full'\] is not one of none, selective, full"),
    ("norm", "{}", r"norm \{\} is not one of layernorm, rmsnorm"),
    ("microbatch_size", "[1]", r"microbatch_size must be a positive integer, not \[1\]"),
]


@pytest.mark.parametrize("content,message", WRONG_TYPES)
def test_wrong_types_name_the_key(cli_error, tmp_path, content, message):
    refused(cli_error, tmp_path, "system", SYSTEM + content + "\n", r"/system\.toml: " + message)


@pytest.mark.parametrize("key,value,message", REPLACED)
def test_wrong_types_of_required_keys_name_the_key(cli_error, tmp_path, key, value, message):
    content = re.sub(rf"^{key} = .*$", f"{key} = {value}", SYSTEM, flags=re.M)
    refused(cli_error, tmp_path, "system", content, r"/system\.toml: " + message)


@pytest.mark.parametrize("key,value,message", MODEL_WRONG_TYPES)
def test_wrong_types_in_a_model_name_the_key(cli_error, tmp_path, key, value, message):
    lines = [line for line in MODEL.splitlines() if not line.startswith(f"{key} =")]
    refused(cli_error, tmp_path, "model", "\n".join(lines + [f"{key} = {value}"]) + "\n",
            r"/model\.toml: " + message)


def test_the_api_checks_the_same_types():
    fields = dict(peak_flops=1e15, memory_bandwidth=1e12, devices_per_node=4,
                  intra_node_bandwidth=1e11, intra_node_latency=0, inter_node_bandwidth=1e10,
                  inter_node_latency=0)
    with pytest.raises(InvalidParameterError, match=r"link_overrides must be an array of "
                                                    r"tables .* not 5"):
        System(**fields, link_overrides=5)
    with pytest.raises(InvalidParameterError, match=r"peak_flops must be a number or a quantity "
                                                    r"such as '1PFLOP/s', not \[1\]"):
        System(**{**fields, "peak_flops": [1]})
    assert System(**{**fields, "peak_flops": np.float32(1e15)}).peak_flops == pytest.approx(1e15)
    with pytest.raises(InvalidParameterError, match=r"optimizer_bytes must be a number, "
                                                    r"not '12'"):
        TransformerModel(2, 64, 4, 16, 100, optimizer_bytes="12")


# ------------------------------------------------------------------ overrides and the run
OVERRIDES_BEYOND_THE_RUN = [
    ('[[link_overrides]]\ndevices = [2, 9]\nbandwidth = "1GB/s"', RUN,
     r"system \S*system\.toml: link_overrides\[0\]\.devices names device 9, but the run has 8 "
     r"devices \(0\.\.7\)"),
    ('[[link_overrides]]\ndevices = [0, 1]\nlatency = "1ms"\n'
     '[[link_overrides]]\ndevices = [8, 3]\nlatency = "1ms"', RUN,
     r"link_overrides\[1\]\.devices names device 8, but the run has 8 devices"),
    ('[[node_overrides]]\nnode = 2\nbandwidth = "1GB/s"', RUN,
     r"system \S*system\.toml: node_overrides\[0\]\.node names node 2, but the run's 8 devices "
     r"fill 2 nodes of 4 \(0\.\.1\)"),
    ('[[link_overrides]]\ndevices = [0, 1]\nbandwidth = "1GB/s"',
     ["eval", "gpipe", "-p", "1", "-m", "2"],
     r"link_overrides\[0\]\.devices names device 1, but the run has 1 devices \(0\.\.0\)"),
    # tensor parallelism 4: each pipeline rank takes a whole node of 4 GPUs
    ('[[node_overrides]]\nnode = 2\nlatency = "1ms"',
     ["eval", "1f1b", "-p", "2", "-m", "4", "--tensor-parallel", "4"],
     r"node_overrides\[0\]\.node names node 2, but the run's 2 devices fill 2 nodes of 1"),
]


@pytest.mark.parametrize("content,argv,message", OVERRIDES_BEYOND_THE_RUN)
def test_overrides_of_devices_the_run_lacks_are_errors(cli_error, tmp_path, content, argv,
                                                       message):
    path = write(tmp_path, "system.toml", SYSTEM + content + "\n")
    system = load_system(str(path))     # the run is not known yet: the file itself is fine
    assert re.search(message, cli_error(*argv, "--model", "paper-128l", "--system", path))
    devices = int(argv[argv.index("-p") + 1])
    tensor = int(argv[argv.index("--tensor-parallel") + 1]) if "--tensor-parallel" in argv else 1
    costs = ModelCosts("paper-128l", system, tensor_parallel=tensor)
    table = generate(argv[1], devices=devices, microbatches=int(argv[argv.index("-m") + 1]))
    with pytest.raises(InvalidParameterError, match=message):
        evaluate(table, costs)


def test_overrides_inside_the_run_still_apply(cli, tmp_path):
    content = (SYSTEM + '[[link_overrides]]\ndevices = [3, 4]\nbandwidth = "10MB/s"\n'
               '[[node_overrides]]\nnode = 1\nlatency = "1ms"\n')
    system = load_system(str(write(tmp_path, "system.toml", content)))
    assert system.check_devices(8) is system
    slow = evaluate(generate("1f1b", devices=8, microbatches=8), ModelCosts(MODEL_OF_8, system))
    plain = evaluate(generate("1f1b", devices=8, microbatches=8),
                     ModelCosts(MODEL_OF_8, system.replace(link_overrides=(),
                                                           node_overrides=())))
    assert slow.makespan > plain.makespan
    code, out, err = cli(*RUN, "--model", "paper-128l", "--system",
                         tmp_path / "system.toml")
    assert code == 0 and err == ""


MODEL_OF_8 = TransformerModel(8, 64, 4, 16, 100)


# ------------------------------------------------------------------ sane ranges
OUT_OF_RANGE = [
    ("inter_node_bandwidth", "1e-300", r"inter_node_bandwidth must be between 1 kB/s and "
                                       r"1 PB/s, not 1e-300 \(a bare number is in B/s\)"),
    ("memory_bandwidth", "1e-300", r"memory_bandwidth must be between 1 kB/s and 1 PB/s, "
                                   r"not 1e-300"),
    ("memory_bandwidth", '"1B/s"', r"memory_bandwidth must be between 1 kB/s and 1 PB/s, "
                                   r"not '1B/s'"),
    ("intra_node_bandwidth", '"2PB/s"', r"intra_node_bandwidth must be between 1 kB/s and "
                                        r"1 PB/s, not '2PB/s'"),
    ("intra_node_bandwidth", "-1e9", r"intra_node_bandwidth must be > 0, not -1000000000\.0"),
    ("inter_node_bandwidth", "inf", r"inter_node_bandwidth must be between 1 kB/s and 1 PB/s, "
                                    r"not inf"),
    ("inter_node_bandwidth", "nan", r"inter_node_bandwidth must be a number, not nan"),
    ("inter_node_bandwidth", "9" * 4000, r"inter_node_bandwidth must be between 1 kB/s and "
                                         r"1 PB/s, not <an integer of 4000 digits>"),
    ("inter_node_bandwidth", '"1e400GB/s"', r"inter_node_bandwidth: '1e400GB/s' is not a "
                                            r"finite number"),
    ("inter_node_bandwidth", '"' + "9" * 100 + 'GB/s"',
     r"inter_node_bandwidth: '9999.*\.\.\. \(104 characters\) is not a quantity"),
    ("peak_flops", "1", r"peak_flops must be between 1 MFLOP/s and 1 EFLOP/s, not 1 "
                        r"\(a bare number is in FLOP/s\)"),
    ("peak_flops", '"2EFLOP/s"', r"peak_flops must be between 1 MFLOP/s and 1 EFLOP/s"),
    ("inter_node_latency", '"2h"', r"inter_node_latency must be between 0 s and 3600 s, "
                                   r"not '2h'"),
    ("intra_node_latency", '"-1us"', r"intra_node_latency must be >= 0, not '-1us'"),
    ("devices_per_node", "1000000", r"devices_per_node must be an integer from 1 to 65536, "
                                    r"not 1000000"),
    ("devices_per_node", "9" * 5000, r"not valid TOML: a number has more digits than any "
                                     r"quantity needs"),
]
ADDED = [
    ("launch_latency", '"2s"', r"launch_latency must be between 0 s and 1 s, not '2s'"),
    ("compute_efficiency", "1e-9", r"compute_efficiency must be at least 1e-06 \(a smaller part "
                                   r"of the peak means the peak is wrong\), not 1e-09"),
    ("memory_efficiency", "[[1, 1e-300]]", r"memory_efficiency\[0\] efficiency must be at "
                                           r"least 1e-06"),
    ("compute_efficiency", '[["1e40FLOP", 0.5]]', r"compute_efficiency\[0\] work must be between "
                                                  r"1 FLOP and 1e\+30 FLOP, not '1e40FLOP'"),
    ("compute_efficiency", "[[0, 0.5]]", r"compute_efficiency\[0\] work must be > 0, not 0"),
    ("inter_node_efficiency", "1.5", r"inter_node_efficiency must be in \(0, 1\], not 1\.5"),
    ("matrix_wave", "1e300", r"matrix_wave must be between 0 and 1e\+09, not 1e\+300"),
    ("half_efficiency_tokens", "-1", r"half_efficiency_tokens must be >= 0, not -1"),
    ("half_efficiency_tokens", "1e300", r"half_efficiency_tokens must be between 0 and 1e\+09"),
    ("memory_capacity", "1", r"memory_capacity must be between 1 kB and 1 PB, not 1 "
                             r"\(a bare number is in B\)"),
    ("link_overrides", '[{devices = [0, 1], bandwidth = 1e-300}]',
     r"link_overrides\[0\]\.bandwidth must be between 1 kB/s and 1 PB/s, not 1e-300"),
    ("node_overrides", '[{node = 0, latency = "5 hours"}]',
     r"node_overrides\[0\]\.latency must be between 0 s and 3600 s, not '5 hours'"),
    ("link_overrides", '[{devices = [0, 4294967296], latency = "1ms"}]',
     r"link_overrides\[0\]\.devices must be an integer from 0 to 2147483647, not 4294967296"),
]
MODEL_OUT_OF_RANGE = [
    ("layers", "1000000", r"layers must be an integer from 1 to 100000, not 1000000"),
    ("hidden", str(2**21), r"hidden must be an integer from 1 to 1048576, not 2097152"),
    ("sequence", "1000000000000", r"sequence must be an integer from 1 to 134217728"),
    ("vocab", "-100", r"vocab must be a positive integer, not -100"),
    ("vocab", "9" * 4000, r"vocab must be an integer from 1 to 16777216, not <an integer of "
                          r"4000 digits>"),
    ("ffn", str(2**25), r"ffn must be an integer from 1 to 16777216"),
    ("microbatch_size", str(10**15), r"microbatch_size must be an integer from 1 to 16777216, "
                                     r"not 1000000000000000"),
    ("optimizer_bytes", "1e300", r"optimizer_bytes must be between 0 and 256, not 1e\+300"),
    ("bytes_per_param", "inf", r"bytes_per_param must be between 0 and 1024, not inf"),
    ("bytes_per_param", "-1", r"bytes_per_param must be >= 0, not -1"),
]


@pytest.mark.parametrize("key,value,message", OUT_OF_RANGE)
def test_numbers_outside_their_sane_range_name_the_key(cli_error, tmp_path, key, value, message):
    content = re.sub(rf"^{key} = .*$", f"{key} = {value}", SYSTEM, flags=re.M)
    refused(cli_error, tmp_path, "system", content, r"/system\.toml: " + message)


@pytest.mark.parametrize("key,value,message", ADDED)
def test_optional_numbers_outside_their_sane_range_name_the_key(cli_error, tmp_path, key, value,
                                                                message):
    refused(cli_error, tmp_path, "system", SYSTEM + f"{key} = {value}\n",
            r"/system\.toml: " + message)


@pytest.mark.parametrize("key,value,message", MODEL_OUT_OF_RANGE)
def test_model_sizes_outside_their_sane_range_name_the_key(cli_error, tmp_path, key, value,
                                                           message):
    lines = [line for line in MODEL.splitlines() if not line.startswith(f"{key} =")]
    refused(cli_error, tmp_path, "model", "\n".join(lines + [f"{key} = {value}"]) + "\n",
            r"/model\.toml: " + message)


def test_every_preset_read_as_a_user_file_passes_every_check(tmp_path):
    """Users copy presets (`tabsched presets --show`): each loads through the untrusted path
    (size, nesting, types, ranges) and equals the preset."""
    index = _presets.preset_index()
    for kind, loader in (("system", load_system), ("model", load_model)):
        assert index[kind]
        for name, text in index[kind].items():
            path = write(tmp_path, f"{name}.toml", text)
            assert loader(str(path)) == loader(name).replace(name=str(path)), name


def test_a_slow_but_sane_system_gives_finite_numbers(cli, tmp_path):
    """The slowest system the ranges allow still gives a finite makespan: no inf, no nan."""
    content = ('peak_flops = "1MFLOP/s"\nmemory_bandwidth = "1kB/s"\ndevices_per_node = 1\n'
               'intra_node_bandwidth = "1kB/s"\nintra_node_latency = "1h"\n'
               'inter_node_bandwidth = "1kB/s"\ninter_node_latency = "1h"\n'
               'launch_latency = "1s"\ncompute_efficiency = 1e-6\nmemory_efficiency = 1e-6\n'
               'inter_node_efficiency = 1e-6\nhalf_efficiency_tokens = 1e9\n'
               'matrix_wave = 1e9\n')
    path = write(tmp_path, "system.toml", content)
    model = write(tmp_path, "model.toml", 'layers = 100000\nhidden = 1024\nheads = 8\n'
                                          'sequence = 4096\nvocab = 16777216\n')
    table = generate("1f1b", devices=4, microbatches=4)
    result = evaluate(table, ModelCosts(str(model), str(path)))
    assert np.isfinite(result.makespan) and np.isfinite(result.bubble_ratio)
    assert result.makespan > 1e20
    code, out, err = cli("eval", "1f1b", "-p", "4", "-m", "4", "--model", model,
                         "--system", path)
    assert code == 0 and err == "" and not re.search(r"\b(inf|nan)\b", out)


# ------------------------------------------------------------------ unknown keys, size, bytes
def test_unknown_keys_are_one_line_with_a_suggestion(cli_error, tmp_path):
    refused(cli_error, tmp_path, "system", SYSTEM + "inter_node_latncy = 1\n",
            r"/system\.toml: unknown key 'inter_node_latncy' \(did you mean "
            r"'inter_node_latency'\?\)$")
    refused(cli_error, tmp_path, "system", SYSTEM + "[[link_overrides]]\ndevices = [0, 1]\n"
                                              "bandwith = 1e9\n",
            r"link_overrides\[0\]: unknown key 'bandwith' \(did you mean 'bandwidth'\?\) "
            r"\(expected devices, bandwidth, latency\)")
    refused(cli_error, tmp_path, "model", MODEL + "x" * 100_000 + " = 1\n",
            r"/model\.toml: unknown key 'x{58}\.\.\. \(100000 characters\)$")
    refused(cli_error, tmp_path, "model", MODEL + '"\\n\\u2028" = 1\n',
            r"/model\.toml: unknown key '\\n\\u2028'$")


def test_a_file_over_one_mib_is_refused_before_parsing(cli_error, tmp_path):
    padding = "# " + "x" * 100 + "\n"
    large = SYSTEM + padding * (2**20 // len(padding) + 1)
    refused(cli_error, tmp_path, "system", large,
            r"/system\.toml: larger than 1 MiB; a system file holds a few KB of keys$")
    fits = SYSTEM + padding * ((2**20 - len(SYSTEM)) // len(padding))
    assert load_system(str(write(tmp_path, "system.toml", fits))).devices_per_node == 4


def test_bytes_that_are_not_utf8_and_a_byte_order_mark(cli_error, tmp_path):
    refused(cli_error, tmp_path, "model", MODEL.encode() + b"description = '\xff'\n",
            rf"/model\.toml: byte {len(MODEL) + 15} is not UTF-8 text; not a model file$")
    refused(cli_error, tmp_path, "model", "layers = \n", r"/model\.toml: not valid TOML: ")
    path = write(tmp_path, "model.toml", b"\xef\xbb\xbf" + MODEL.encode())
    assert load_model(str(path)).layers == 8


# ------------------------------------------------------------------ no inf, no nan
HUGE = StageCosts(1e308, 1e308)   # finite durations whose sum overflows


def test_a_makespan_that_overflows_is_one_error_naming_the_cost_inputs(cli_error):
    table = generate("gpipe", devices=2, microbatches=2)
    message = (r"^the simulated makespan is inf s: the durations are too large to add up "
               r"\(the longest, 0F0, takes 1e\+308 s\); check the cost inputs \(StageCosts ")
    with pytest.raises(InvalidParameterError, match=message):
        evaluate(table, HUGE)
    with pytest.raises(InvalidParameterError, match=message):
        evaluate_many(table, [StageCosts(1.0), HUGE])
    rows = compare(["gpipe", "1f1b"], 2, 2, costs=HUGE)
    assert all(re.search(message, row.error) for row in rows)
    for command in ("eval", "compare"):
        text = cli_error(command, "gpipe", *(["1f1b"] if command == "compare" else []),
                         "-p", "2", "-m", "2", "--f", "1e308")
        assert text.startswith("the simulated makespan is inf slots") and "UnitCosts F=1e+308" \
            in text


class _NotANumber(UnitCosts):
    """A cost model with a bug: one transfer of nan seconds."""

    def transfer_costs(self, table, transfers):
        durations = np.ones(len(transfers))
        durations[0] = np.nan
        return durations, np.zeros(len(transfers))


def test_a_duration_that_is_not_finite_is_refused_before_the_kernel_runs():
    table = generate("1f1b", devices=2, microbatches=2)
    with pytest.raises(InvalidParameterError, match=r"^the costs give 0F0 d0->d1 a duration of "
                                                    r"nan slots; check the cost inputs "
                                                    r"\(UnitCosts F=1\.0"):
        evaluate(table, _NotANumber())
    with pytest.raises(InvalidParameterError, match=r"0F0 d0->d1 a duration of nan"):
        evaluate_many(table, [UnitCosts(), _NotANumber()])
    with pytest.raises(InvalidParameterError, match=r"0F0 d0->d1 a duration of nan"):
        evaluate_many(table, [_NotANumber(), _NotANumber()])     # one class: one stack

    class Negative(UnitCosts):
        def op_durations(self, table):
            return -super().op_durations(table)
    with pytest.raises(InvalidParameterError, match=r"the costs give 0F0 a duration of -1"):
        evaluate_many(table, [Negative(), Negative()])


def test_a_sweep_skips_the_configuration_with_the_same_line(cli, tmp_path):
    out = tmp_path / "sweep.csv"
    code, _, err = cli("sweep", "gpipe", "-p", "2", "-m", "2", "--f", "1e308",
                       "--systems", "mid_nw_mid_cp", "-o", out)
    assert code == 0 and "Warning" not in err
    text = out.read_text()
    assert "inf" not in text.replace("the simulated makespan is inf", "")
    assert "skipped" in text and "the simulated makespan is inf slots" in text


def test_a_sweep_skips_only_the_system_whose_override_the_run_lacks(cli, tmp_path):
    path = write(tmp_path, "far.toml", SYSTEM + '[[link_overrides]]\ndevices = [2, 9]\n'
                                                'bandwidth = "1GB/s"\n')
    out = tmp_path / "sweep.csv"
    code, _, err = cli("sweep", "gpipe", "-p", "8", "-m", "8", "--systems",
                       f"{path},mid_nw_mid_cp", "-o", out)
    assert code == 0, err
    from tabsched.sweeps import read_sweep_csv
    rows = {row["system"]: row for row in read_sweep_csv(out)}
    far, grid = rows[str(path)], rows["mid_nw_mid_cp"]
    assert far["status"] == "skipped" and re.search(
        r"link_overrides\[0\]\.devices names device 9, but the run has 8 devices", far["reason"])
    assert grid["status"] == "ok" and np.isfinite(grid["simulation_makespan_s"])


def test_monte_carlo_makespans_that_overflow_are_one_error(cli_error):
    from tabsched.adapt import Straggler, monte_carlo
    table = generate("1f1b", devices=4, microbatches=8)
    message = (r"^the Monte Carlo durations or makespans are too large to add up \(largest inf "
               r"s\); check the cost inputs and the variation \(\{'model': 'straggler'")
    with pytest.raises(InvalidParameterError, match=message):   # durations overflow
        monte_carlo(table, StageCosts(1.0), Straggler(1, 1e308), samples=4)
    with pytest.raises(InvalidParameterError, match=message):   # only their sums do
        monte_carlo(table, StageCosts(1.0, 1.0), Straggler(1, 1e308), samples=4)
    text = cli_error("eval", "1f1b", "-p", "4", "-m", "8", "--straggler", "1:1e308",
                     "--samples", "4")
    assert text.startswith("the Monte Carlo durations or makespans are too large to add up")
