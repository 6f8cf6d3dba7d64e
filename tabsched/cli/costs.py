"""``tabsched costs MODEL SYSTEM``: why an operation costs what it costs, kernel by kernel."""

import click
import numpy as np

from tabsched.cli.build import build_model_costs, execution_from_options
from tabsched.cli.format import echo_json, format_columns, translate_errors
from tabsched.cli.options import SectionedCommand, execution_option, parallel_options
from tabsched.costs.units import format_quantity

KINDS = ("F", "B", "I", "W")
PHASE_NAMES = {"F": "forward", "R": "recompute forward (run before I)", "I": "input-grad",
               "W": "weight-grad"}


@click.command("costs", cls=SectionedCommand)
@click.argument("model", metavar="MODEL")
@click.argument("system", metavar="SYSTEM")
@click.option("--part", type=click.Choice(["layer", "dense_layer", "embedding", "output"]),
              default="layer", show_default=True,
              help="One transformer layer (a MoE model's: a MoE layer; dense_layer: one of its "
                   "first dense layers), the embedding (first stage) or the final norm, output "
                   "layer and loss (last stage, with the MTP modules).")
@click.option("--microbatch-size", type=int,
              help="Samples in the microbatch (default: the model's).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
              help="Activation recomputation (default: the model's).")
@execution_option
@parallel_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@translate_errors
def costs_command(model, system, part, microbatch_size, recompute, as_json, **parallel):
    """Every kernel of one layer of MODEL on SYSTEM: FLOPs, bytes, bound, efficiency, time.

    MODEL and SYSTEM are preset names or TOML files. The kernels are listed in
    the order each operation runs them: forward (F), the recompute forward (R)
    that the input-grad runs first, input-grad (I), weight-grad (W); B = R + I
    + W. Times are one tensor rank's. A collective marked "beside X" runs while
    kernel X does (Megatron-LM launches it asynchronously) and costs the
    operation only what it runs longer than X.
    """
    execution, sources = execution_from_options(dict(parallel, microbatch_size=microbatch_size,
                                                     recompute=recompute))
    costs = build_model_costs(model, system, execution, sources)
    if part == "dense_layer" and not costs.model.dense_layers:
        raise click.ClickException(f"--part dense_layer: model {costs.model.name} has no "
                                   f"dense layers (dense_layers, of a mixture-of-experts "
                                   f"model)")
    samples = costs.model.microbatch_size
    rows = costs.kernel_report(part, samples)
    totals = costs.part_times(np.array([float(samples)]))[part][:, 0]
    totals = {kind: float(totals[k]) for k, kind in enumerate(KINDS)}
    if as_json:
        echo_json({"model": costs.model.name, "system": costs.system.name, "part": part,
                   "samples": samples, "costs": costs.describe(), "kernels": rows,
                   "totals": totals, "execution": costs.execution.to_dict()})
        return
    settings = costs.describe()
    cp = costs.execution.context_parallel
    click.echo(f"{costs.model.name} on {costs.system.name}: one {part}, microbatch of "
               f"{samples} sample{'s' if samples != 1 else ''} x {costs.model.sequence} "
               f"tokens, one of {settings['tensor_parallel']} tensor ranks"
               + (f" and {cp} context ranks ({costs.model.sequence // cp} tokens each, "
                  f"{costs.execution.context_exchange} exchange)" if cp > 1 else "")
               + f"; recompute {settings['recompute']}, {settings['attention']} attention"
               + (", sequence parallel" if settings.get("sequence_parallel") else "")
               + (f", FP8 ({costs.execution.fp8})" if costs.execution.fp8 else ""))
    table = [["phase", "kernel", "class", "FLOPs", "read", "written", "bound", "efficiency",
              "time", ""]]
    for row in rows:
        table.append([
            row["phase"], row["name"], row["class"],
            format_quantity(row["flops"], "FLOP") if row["flops"] else "-",
            format_quantity(row["bytes_read"], "B"),
            format_quantity(row["bytes_written"], "B") if row["class"] != "collective" else "-",
            row["bound"], f"{row['efficiency']:.3g}", format_quantity(row["seconds"], "s"),
            f"beside {row['beside']}" if row["beside"] else ""])
    click.echo(format_columns(table))
    click.echo("phases: " + "; ".join(f"{phase} {name}" for phase, name in PHASE_NAMES.items()))
    click.echo("a collective's 'read' is its message; its efficiency is the link's share of "
               "line rate")
    click.echo("operations: " + ", ".join(f"{kind} {format_quantity(value, 's')}"
                                          for kind, value in totals.items()))
