"""Option groups the commands share: their flags, help sections and completions.

What the options' values become (a table, an execution, the costs, the variation)
is :mod:`tabsched.cli.build`'s; a command declares its options with the decorators
here and hands their values there.
"""

import functools

import click

from tabsched.execution import (ATTENTION_IMPLEMENTATIONS, CONTENTION_MODES, CP_COMM_TYPES,
                                FP8_RECIPES)
from tabsched.schedules import families


#: Help sections: which heading each option is listed under in ``--help`` (by the
#: option's parameter name; options not listed go under "Other options").
HELP_SECTIONS = {
    "Schedule": ("devices", "microbatches", "chunks", "waves", "variant", "pipelines",
                 "group_size", "stage_layers", "stage_layers_ratio", "layers", "extra_params",
                 "torch_legacy", "p2p"),
    "Costs without a model (slots)": ("forward", "backward", "input_grad", "weight_grad",
                                      "comm", "contention"),
    "Model, system and parallelism": ("model", "system", "execution", "microbatch_size",
                                      "recompute", "global_batch", "tensor_parallel",
                                      "sequence_parallel", "context_parallel", "cp_comm",
                                      "expert_parallel", "max_connections", "data_parallel", "attention", "fp8",
                                      "optimizer_sharding",
                                      "zero_stage", "reshard_after_forward", "prefetch",
                                      "overlap_grad_reduce", "grad_bucket_size",
                                      "align_grad_reduce", "blocking_sends"),
    "Memory and the iteration's tail": ("memory_budget", "strict", "grad_sync", "optimizer",
                                        "post_validation"),
    "Run-time variation (Monte Carlo)": ("cv", "transfer_cv", "stragglers", "slow_links",
                                         "replay", "replay_partial", "samples", "seed"),
    "Search": ("objective", "split_factor", "max_rounds"),
    "Space (plan)": ("gpus", "families", "tensor_degrees", "pipeline_degrees",
                     "microbatch_sizes", "recompute_modes", "max_chunks", "zero",
                     "sequence_parallel_choice", "uneven", "cross_node", "slice_counts",
                     "slice_leads", "tie_band", "exhaustive"),
    "Running": ("jobs", "dask", "quiet"),
    "Output": ("level", "as_json", "out", "out_path", "output", "show_log", "width", "target",
               "drop_metadata", "no_transfers", "labels", "time_range", "metric", "logx",
               "logy", "capacity", "top", "explain", "save_executions", "html_path"),
}


_SECTION_OF = {name: section for section, names in HELP_SECTIONS.items() for name in names}

#: What each positional argument is, listed first in ``--help`` under "Arguments"
#: (by metavar; click gives arguments no help of their own).
ARGUMENT_HELP = {
    "SCHEDULE": "A family name (`tabsched list`) built with the schedule options, or a "
                "table file: .csv (PyTorch's compute_only or compute_comms tokens) or "
                ".json (tabsched's table with its metadata).",
    "FAMILY...": "Families to compare, each optionally with parameters: 1f1b, "
                 "interleaved-1f1b:chunks=2, zb-h1 (`tabsched list`).",
    "MODEL": "A model preset (`tabsched presets`) or a model TOML file.",
    "SYSTEM": "A system preset (`tabsched presets`) or a system TOML file.",
    "NAME": "A name: a study for `study`, a family for `list`.",
    "SWEEP.csv": "A CSV written by `tabsched sweep -o`.",
    "OUTPUT": "The file to write; its extension picks the format (.csv, .json), '-' stdout.",
    "FILE.csv": "A GEMM timing CSV (m, n, k, seconds per row).",
    "FILE...": "nccl-tests output files (all_reduce_perf and friends).",
    "TRACE...": "PyTorch profiler (Kineto) traces of a GPU run, .json or .json.gz, or "
                "directories of them (one file per rank).",
}

#: Examples at the end of each command's ``--help`` (by command path without
#: ``tabsched``): real presets, small enough to run in a second or two. Each runs in
#: tests/test_cli_conventions.py.
EXAMPLES = {
    "eval": ["tabsched eval 1f1b -p 4 -m 8",
             "tabsched eval zbv -p 4 -m 8 --model llama3-8b --system dgx-h100",
             "tabsched eval 1f1b -p 8 -m 32 --model paper-128l --system dgx-a100 --cv 0.1 "
             "--json",
             "tabsched eval zb-h1 -p 4 -m 8 --model llama3-8b --system dgx-h100 --html run.html"],
    "compare": ["tabsched compare gpipe 1f1b zb-h1 -p 4 -m 8 --html compare.html",
                "tabsched compare 1f1b interleaved-1f1b:chunks=2 -p 8 -m 16 "
                "--model llama3-70b --system dgx-h100 -t 8"],
    "sweep": ["tabsched sweep gpipe 1f1b -p 4,8 -m 8,16 -o sweep.csv",
              "tabsched sweep 1f1b zbv -p 4,8 -m 16 --systems dgx-h100,dgx-a100 -j 2"],
    "study": ["tabsched study tabular-paper -o study/ -j 2"],
    "costs": ["tabsched costs llama3-8b dgx-h100 -t 2",
              "tabsched costs gpt3-175b dgx-a100 -t 8 --sequence-parallel"],
    "execution": ["tabsched execution --model gpt3-175b --system dgx-a100 -t 8 -d 8"],
    "megatron": ["tabsched megatron interleaved-1f1b -p 4 -m 8 -v 2 --layers 32"],
    "plan": ["tabsched plan llama3-8b dgx-h100 --gpus 8 --global-batch 32 --top 5",
             "tabsched plan gpt3-175b dgx-a100 --gpus 64 --global-batch 64 -t 8 "
             "--families 1f1b --explain"],
    "adapt": ["tabsched adapt zb-h1 -p 4 -m 8 --memory-budget 6",
              "tabsched adapt 1f1b -p 8 -m 32 --model paper-128l --system slow_nw_mid_cp "
              "--memory-budget capacity --cv 0.1 -o adapted.json"],
    "plot gantt": ["tabsched plot gantt zbv -p 4 -m 8 -o zbv.png",
                   "tabsched plot gantt 1f1b -p 4 -m 8 --model paper-128l --system dgx-h100 "
                   "-o 1f1b.pdf"],
    "plot memory": ["tabsched plot memory 1f1b -p 4 -m 8 --model paper-128l "
                    "--system dgx-h100 -o memory.png"],
    "plot sweep": ["tabsched plot sweep sweep.csv -p 8 -o sweep.png"],
    "trace": ["tabsched trace dualpipev -p 4 -m 8 --model paper-128l --system dgx-h100 "
              "-o trace.json"],
    "presets": ["tabsched presets", "tabsched presets --json"],
    "list": ["tabsched list", "tabsched list zbv"],
    "show": ["tabsched show 1f1b -p 4 -m 8", "tabsched show 1f1b -p 4 -m 8 --format csv"],
    "convert": ["tabsched convert 1f1b -p 4 -m 8 1f1b.csv",
                "tabsched convert 1f1b.csv 1f1b_comms.csv --to torch-comms"],
}


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options under headings (``HELP_SECTIONS``).

    A command with options in one section only keeps click's plain "Options" list.
    """

    def format_options(self, ctx, formatter):
        arguments = [(param.make_metavar(ctx) if _takes_ctx(param) else param.make_metavar(),
                      "") for param in self.get_params(ctx)
                     if isinstance(param, click.Argument)]
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl([(metavar, ARGUMENT_HELP.get(metavar.rstrip("]").lstrip("["),
                                                                ""))
                                    for metavar, _ in arguments])
        sections = {}
        for param in self.get_params(ctx):
            record = None if isinstance(param, click.Argument) else param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(_SECTION_OF.get(param.name, "Other options"),
                                    []).append(record)
        order = list(HELP_SECTIONS) + ["Other options"]
        if len(sections) <= 2:   # one section and --help: headings would only add noise
            with formatter.section("Options"):
                formatter.write_dl([record for section in sorted(sections, key=order.index)
                                    for record in sections[section]])
            return
        for section in sorted(sections, key=order.index):
            with formatter.section(section):
                formatter.write_dl(sections[section])

    def format_epilog(self, ctx, formatter):
        super().format_epilog(ctx, formatter)
        examples = EXAMPLES.get(ctx.command_path.partition(" ")[2])
        if examples:
            with formatter.section("Examples"):
                for example in examples:   # as typed: never wrapped
                    formatter.write(" " * formatter.current_indent + example + "\n")


def _takes_ctx(param):
    """click 8.2 passes the context to ``make_metavar``; 8.0 and 8.1 do not."""
    import inspect
    return "ctx" in inspect.signature(param.make_metavar).parameters


def complete_schedule(ctx, param, incomplete):
    """Shell completion of SCHEDULE: family names, then table files."""
    from click.shell_completion import CompletionItem
    names = sorted({name for family in families() for name in (family.name, *family.aliases)})
    items = [CompletionItem(name) for name in names if name.startswith(incomplete)]
    return items + [CompletionItem(incomplete, type="file")]


def complete_preset(kind):
    """Shell completion of --model / --system: preset names, then TOML files."""
    def complete(ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        from tabsched.costs._presets import preset_index
        last = incomplete.rpartition(",")[0]   # sweep takes comma lists
        prefix = f"{last}," if last else ""
        typed = incomplete[len(prefix):]
        items = [CompletionItem(prefix + name) for name in sorted(preset_index()[kind])
                 if name.startswith(typed)]
        return items + [CompletionItem(incomplete, type="file")]
    return complete


def complete_family(ctx, param, incomplete):
    """Shell completion of FAMILY... (compare, sweep): family names."""
    from click.shell_completion import CompletionItem
    return [CompletionItem(family.name) for family in families()
            if family.name.startswith(incomplete)]


RECOMPUTE_HELP = ("Activation recomputation: none, selective (the attention core) or full "
                  "(every layer; default: the model's).")


CONTENTION_HELP = ("none: transfers never wait; link: one FIFO per directed device pair; nic: "
                   "transfers between nodes also share each node's ports. Default: the "
                   "system's.")


def complete_study(ctx, param, incomplete):
    """Shell completion of a study's NAME."""
    from click.shell_completion import CompletionItem

    from tabsched.study import STUDIES
    return [CompletionItem(name) for name in STUDIES if name.startswith(incomplete)]


#: Family parameters with an option of their own; any other goes through --param.
NAMED_PARAMETERS = ("devices", "microbatches", "chunks", "waves", "variant", "pipelines",
                    "group_size")


#: Parameters every family accepts: how the model's layers split over the stages.
LAYER_PARAMETERS = ("stage_layers", "stage_layers_ratio", "layers")


#: Names the command line sets itself, which ``--param`` cannot: what sets each.
SET_BY_THE_COMMAND = {
    "costs": "the options describe the costs (--model and --system, or the slot lengths)",
    "schedule": "the SCHEDULE argument names the family or the table file",
    "p2p": "use --p2p", "torch_legacy": "use --torch-legacy",
}


def schedule_options(command):
    """Options that pick a table: a family's parameters (a FILE ignores them).

    The command receives them as one dict, ``schedule_params``; ``--param
    NAME=VALUE`` passes any other parameter a family takes.
    """
    options = [
        click.option("--devices", "-p", type=int, help="Pipeline depth (number of devices)."),
        click.option("--microbatches", "-m", type=int, help="Microbatches per iteration."),
        click.option("--chunks", "-v", type=int,
                     help="Model chunks per device (multi-chunk families)."),
        click.option("--waves", type=int, help="Waves W (hanayo)."),
        click.option("--variant", help="Family variant (chimera: direct or doubling)."),
        click.option("--pipelines", type=int, help="Number of pipelines, 2f (chimera)."),
        click.option("--group-size", type=int,
                     help="Microbatch group size per virtual stage (interleaved-1f1b)."),
        click.option("--stage-layers", help="Layers of every stage, e.g. 4,4,8,8 (any family)."),
        click.option("--stage-layers-ratio",
                     help="Layer weights of consecutive stage groups, e.g. 1:2 (any family)."),
        click.option("--layers", type=int,
                     help="Total layers, split over the stages (with the ratio if given)."),
        click.option("--param", "extra_params", multiple=True, metavar="NAME=VALUE",
                     help="Any other family parameter, e.g. --param pairs=serial "
                          "(see `tabsched list`)."),
    ]
    names = NAMED_PARAMETERS + LAYER_PARAMETERS

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        params = {name: kwargs.pop(name) for name in names}
        for text in kwargs.pop("extra_params"):
            name, value = parse_param(text)
            if name == "memory_budget":     # the README's other spelling of --memory-budget
                if "memory_budget" not in kwargs:
                    raise click.ClickException(f"--param {text}: this command takes no "
                                               f"memory budget")
                if kwargs["memory_budget"] is not None:
                    raise click.ClickException(f"--param {text}: the memory budget is given "
                                               f"twice (--memory-budget)")
                kwargs["memory_budget"] = str(value)
                continue
            if name in SET_BY_THE_COMMAND:
                raise click.ClickException(f"--param {text}: {name} is not a family parameter "
                                           f"here: {SET_BY_THE_COMMAND[name]}")
            if params.get(name) is not None:
                raise click.ClickException(f"--param {text}: {name} is given twice")
            params[name] = value
        return command(*args, schedule_params=params, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def parse_param(text):
    """``("name", value)`` of ``--param NAME=VALUE``; integer values become ints."""
    name, equals, value = text.partition("=")
    name = name.strip().replace("-", "_")
    if not equals or not name or not value.strip():
        raise click.ClickException(f"--param {text!r}: expected NAME=VALUE, e.g. pairs=serial")
    value = value.strip()
    try:
        return name, int(value)
    except ValueError:
        return name, value


def _flag(name):
    return ("--" + name.replace("_", "-") if name in NAMED_PARAMETERS + LAYER_PARAMETERS
            else f"--param {name}=...")


def torch_options(command):
    """Options for reading PyTorch's CSV files."""
    from tabsched.execution import P2P_MODES
    options = [
        click.option("--torch-legacy", is_flag=True,
                     help="Read a .csv in PyTorch's legacy tokens (B = input-grad, BW = full "
                          "backward)."),
        click.option("--p2p", metavar="MODE", default=None,
                     shell_complete=lambda *_: list(("ordered",) + P2P_MODES),
                     help="How pipeline sends run: free (overlap compute), blocking (hold the "
                          "sender), megatron-batched (Megatron-LM's batch per step, waited), "
                          "megatron-overlap (--overlap-p2p-communication), pytorch "
                          "(torch.distributed.pipelining). compute_comms files: ordered "
                          "(default) = the SEND/RECV between two devices run in the order each "
                          "lists them; free = each SEND/RECV pair on its own."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def cost_options(command):
    options = [
        click.option("--f", "forward", type=float, help="Forward length (default 1)."),
        click.option("--b", "backward", type=float,
                     help="Full backward length (default 2: an input-grad plus a weight-grad)."),
        click.option("--i", "input_grad", type=float, help="Input-grad length (default 1)."),
        click.option("--w", "weight_grad", type=float, help="Weight-grad length (default 1)."),
        click.option("--comm", type=float,
                     help="Time of every transfer; turns the table into a simulation."),
        click.option("--contention", type=click.Choice(CONTENTION_MODES),
                     help="none: transfers never wait; link: one FIFO per directed device "
                          "pair; nic: transfers between nodes also share each node's ports "
                          "(needs --system). Default: the system's, else none."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


LEVELS = ("formula", "table", "simulation")


#: Parallelism options: (option name, its flags, the keyword of ModelCosts).
PARALLEL_FLAGS = {"tensor_parallel": "--tensor-parallel/-t",
                  "sequence_parallel": "--sequence-parallel",
                  "context_parallel": "--context-parallel", "cp_comm": "--cp-comm",
                  "expert_parallel": "--expert-parallel",
                  "max_connections": "--max-connections",
                  "data_parallel": "--data-parallel/-d", "attention": "--attention",
                  "fp8": "--fp8",
                  "optimizer_sharding": "--optimizer-sharding",
                  "zero_stage": "--zero",
                  "reshard_after_forward": "--reshard-after-forward/--no-reshard-after-forward",
                  "prefetch": "--prefetch",
                  "overlap_grad_reduce": "--overlap-grad-reduce",
                  "grad_bucket_size": "--grad-bucket-size",
                  "align_grad_reduce": "--align-grad-reduce/--no-align-grad-reduce"}


PARALLEL_OPTIONS = tuple(PARALLEL_FLAGS) + ("blocking_sends",)


#: The flag that sets each field of an execution (``--optimizer-sharding`` is
#: ``zero_stage = 1``, ``--optimizer`` is ``optimizer_step = true``).
EXECUTION_FLAGS = {**{name: flag for name, flag in PARALLEL_FLAGS.items()
                      if name not in ("optimizer_sharding", "zero_stage")},
                   "zero_stage": "--optimizer-sharding", "blocking_sends": "--blocking-sends",
                   "p2p": "--p2p",
                   "microbatch_size": "--microbatch-size", "recompute": "--recompute",
                   "contention": "--contention", "grad_sync": "--grad-sync",
                   "optimizer_step": "--optimizer", "post_validation": "--post-validation"}


EXECUTION_HELP = ("How the model runs across devices: a TOML or JSON file of an execution "
                  "(parallel degrees, microbatch size, global batch, recompute, zero_stage, "
                  "attention, contention, devices_per_node, sends, grad sync, optimizer "
                  "step); the other options override its fields.")


def execution_option(command):
    """``--execution FILE``: the execution every other run option changes."""
    return click.option("--execution", metavar="FILE", help=EXECUTION_HELP)(command)


def parallel_options(command=None, *, lists=False):
    """Tensor, sequence and data parallelism, attention, sends: options of model costs.

    ``lists=True`` (``sweep``): ``-t`` and ``-d`` take lists, one configuration each.
    """
    if command is None:
        return functools.partial(parallel_options, lists=lists)
    each = dict(multiple=True, metavar="N,...") if lists else dict(type=int)
    also = (" A list (4,8 or -t 4 -t 8) sweeps them." if lists else "")
    options = [
        click.option("--tensor-parallel", "-t", **each,
                     help="Tensor ranks per pipeline stage (Megatron-LM; inside a node)."
                          + also),
        click.option("--sequence-parallel", is_flag=True, default=None,
                     help="Sequence parallelism (needs -t > 1)."),
        click.option("--context-parallel", type=int, metavar="CP",
                     help="Context ranks per stage: the sequence split CP ways with causal "
                          "load balancing (needs --attention flash)."),
        click.option("--cp-comm", type=click.Choice(CP_COMM_TYPES), metavar="TYPE",
                     help="--context-parallel: p2p (ring attention, key-value blocks passed "
                          "beside the attention; default), allgather (Llama 3's) or a2a "
                          "(DeepSpeed-Ulysses' all-to-alls to a head split)."),
        click.option("--expert-parallel", type=int, metavar="EP",
                     help="Ranks each MoE layer's routed experts are split over (formed "
                          "inside the data-parallel ranks: EP must divide -d); their tokens "
                          "are dispatched and combined by all-to-alls."),
        click.option("--max-connections", type=int, metavar="N",
                     help="CUDA_DEVICE_MAX_CONNECTIONS (1 to 32; CUDA's default 8): at 1 "
                          "kernels are dispatched in launch order (one hardware queue), "
                          "which slows an overlapped cell's two streams."),
        click.option("--data-parallel", "-d", **each,
                     help="Replicas of the pipeline; their gradient all-reduce ends the "
                          "iteration." + also.replace("-t", "-d")),
        click.option("--attention", type=click.Choice(ATTENTION_IMPLEMENTATIONS),
                     help="eager: the s x s scores in memory; flash: fused (default eager)."),
        click.option("--fp8", type=click.Choice(FP8_RECIPES), metavar="RECIPE",
                     help="The layers' linear products in FP8 as Transformer Engine runs "
                          "them, scaled delayed (TE's default), tensorwise (current amax) or "
                          "blockwise (DeepSeek-V3's tiles); needs a system with an FP8 rate."),
        click.option("--optimizer-sharding", is_flag=True, default=None,
                     help="ZeRO-1: optimizer state divided over the -d replicas."),
        click.option("--zero", "zero_stage", type=click.IntRange(0, 3),
                     help="ZeRO stage over the -d replicas: 1 optimizer state, 2 also "
                          "gradients (reduce-scattered after a stage's last backward), 3 also "
                          "parameters (FSDP: all-gathered before use, freed after)."),
        click.option("--reshard-after-forward/--no-reshard-after-forward", default=None,
                     help="--zero 3: free a stage's parameters after its forwards and gather "
                          "them again for its backwards (FSDP2's default; --no-... is FSDP1's "
                          "SHARD_GRAD_OP)."),
        click.option("--prefetch", type=int, metavar="N",
                     help="--zero 3: a stage's all-gather may start N operations before its "
                          "use (default 1, FSDP's one-ahead prefetch; 0: exposed)."),
        click.option("--overlap-grad-reduce", is_flag=True, default=None,
                     help="The data-parallel reduction runs in buckets launched as each "
                          "stage's last backward fills them, beside it and the remaining "
                          "backwards (Megatron-LM's --overlap-grad-reduce, PyTorch DDP)."),
        click.option("--grad-bucket-size", type=int, metavar="N",
                     help="--overlap-grad-reduce: parameters per gradient bucket (default "
                          "Megatron-Core's max(40M, 1M x d); PyTorch DDP's 25 MiB is "
                          "6553600 with 4-byte gradients; a size past a stage's parameters "
                          "is one bucket, reduced after the backward)."),
        click.option("--align-grad-reduce/--no-align-grad-reduce", default=None,
                     help="--overlap-grad-reduce: only the first pipeline rank overlaps its "
                          "buckets with its last backward, the others reduce after theirs, in "
                          "the bubble (Megatron-Core's default); --no-...: every stage "
                          "overlaps (PyTorch DDP)."),
        click.option("--blocking-sends", is_flag=True, default=None,
                     help="Deprecated: --p2p blocking (a transfer keeps its sender busy until "
                          "it ends)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


#: ``--post-validation``: the steady period without the global synchronization.
POST_VALIDATION = click.option(
    "--post-validation", is_flag=True, default=None,
    help="Zero Bubble's optimizer post-validation: the step does not wait for the global "
         "gradient norm, so the next iteration's warm-up may overlap this one's cool-down "
         "(changes the steady period, not the makespan).")


def model_options(command):
    """Options for model-based costs (seconds and bytes), the memory budget and the tail."""
    options = [
        click.option("--model", metavar="NAME|FILE", shell_complete=complete_preset("model"),
                     help="Transformer preset (see `tabsched presets`) or TOML file; needs "
                          "--system."),
        click.option("--system", metavar="NAME|FILE", shell_complete=complete_preset("system"),
                     help="System preset or TOML file; needs --model."),
        click.option("--execution", metavar="FILE", help=EXECUTION_HELP),
        click.option("--microbatch-size", type=int,
                     help="Samples per full microbatch (default: the model's)."),
        click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                     help=RECOMPUTE_HELP),
        click.option("--memory-budget", metavar="SIZE",
                     help="Memory per device, e.g. 80GB (or 'capacity': the system's); "
                          "devices over it are reported."),
        click.option("--strict", is_flag=True,
                     help="Exit 3 if a device goes over --memory-budget."),
        click.option("--grad-sync", metavar="WHICH",
                     help="Gradient sync at the end: 'replicas', 'all' or stages (0,3,5)."),
        click.option("--optimizer", is_flag=True, help="An optimizer step per device at the end."),
        POST_VALIDATION,
    ]
    command = parallel_options(command)
    for option in reversed(options):
        command = option(command)
    return command


def evaluation_options(command):
    """Everything that picks a table and its costs: what eval, plot and trace share.

    The command receives ``schedule_params`` and one dict ``evaluation`` with the
    cost, model, memory, tail and PyTorch-reader options.
    """
    names = ("forward", "backward", "input_grad", "weight_grad", "comm", "contention", "model",
             "system", "execution", "microbatch_size", "recompute", "memory_budget", "strict",
             "grad_sync", "optimizer", "post_validation", "torch_legacy", "p2p") + PARALLEL_OPTIONS

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        evaluation = {name: kwargs.pop(name) for name in names}
        return command(*args, evaluation=evaluation, **kwargs)

    for decorate in (torch_options, model_options, cost_options, schedule_options):
        wrapper = decorate(wrapper)
    return wrapper


def variation_options(default_samples):
    """Options of run-time variation and Monte Carlo, passed as one dict, ``variation_params``."""
    options = [
        click.option("--cv", type=float,
                     help="Coefficient of variation of every operation's duration "
                          "(lognormal noise, mean 1)."),
        click.option("--transfer-cv", type=float,
                     help="Coefficient of variation of every transfer's duration."),
        click.option("--straggler", "stragglers", multiple=True, metavar="DEVICE:FACTOR",
                     help="A device computing FACTOR times slower, e.g. 3:1.5 (repeatable)."),
        click.option("--slow-link", "slow_links", multiple=True, metavar="A-B:FACTOR",
                     help="The link between devices A and B with its bandwidth divided by "
                          "FACTOR (latency unchanged), e.g. 3-4:3 (repeatable)."),
        click.option("--replay", metavar="FILE",
                     help="Measured durations: CSV rows op,duration (e.g. 3F12,31ms), or a "
                          "PyTorch profiler trace of a pipeline run (.json, .json.gz, or a "
                          "directory of them, one per rank). Every label must name an "
                          "operation or transfer of the table."),
        click.option("--replay-partial", is_flag=True,
                     help="Accept --replay labels that match nothing in the table, and a "
                          "replay that measures some devices only (the others keep modelled "
                          "times); a note lists both."),
        click.option("--samples", type=int, default=default_samples,
                     help="Monte Carlo samples" + (f" (default {default_samples})."
                                                   if default_samples else
                                                   " (default 1000 with a variation option).")),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Seed of the random draws; the same seed gives the same numbers."),
    ]
    names = ("cv", "transfer_cv", "stragglers", "slow_links", "replay", "replay_partial",
             "samples", "seed")

    def decorator(command):
        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            params = {name: kwargs.pop(name) for name in names}
            return command(*args, variation_params=params, **kwargs)
        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper
    return decorator


#: ``--slice-partition``, beside ``--sequence-slices`` on eval, adapt and plan; the command
#: receives ``slice_partition`` (checked by ``tabsched.cli.eval.check_partition``).
slice_partition_option = click.option(
    "--slice-partition", "slice_partition", metavar="even|compute", default="even",
    show_default=True,
    help="--sequence-slices: equal tokens per slice, or Seq1F1B's computation-wise "
         "partition (equal FLOPs: earlier slices longer, bounds in 128-token tiles).")


def html_option(what):
    """``--html FILE``: also write the command's report as one self-contained HTML page
    (:func:`tabsched.report.html_report`); the command receives ``html_path``."""
    return click.option(
        "--html", "html_path", metavar="FILE.html",
        help=f"Also write {what} as one HTML file (.html or .htm) that opens in a browser "
             f"with nothing else: an interactive Gantt chart (zoom, pan, hover for each "
             f"operation's times and what it waited for) and the memory per device.")
