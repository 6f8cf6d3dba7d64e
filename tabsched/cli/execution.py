"""``tabsched execution``: the execution the run options describe, checked, printed or saved."""

import click

from tabsched.cli.build import build_model_costs, execution_from_options
from tabsched.cli.format import echo_json, translate_errors
from tabsched.cli.options import (POST_VALIDATION, SectionedCommand, complete_preset,
                                  execution_option, parallel_options)
from tabsched.execution import CONTENTION_MODES


@click.command("execution", cls=SectionedCommand)
@click.option("--model", metavar="NAME|FILE", shell_complete=complete_preset("model"),
              help="Check the execution against this transformer and fill in its defaults "
                   "(needs --system).")
@click.option("--system", metavar="NAME|FILE", shell_complete=complete_preset("system"),
              help="Check the execution against this system and fill in its defaults.")
@execution_option
@click.option("--microbatch-size", type=int, help="Samples per microbatch.")
@click.option("--global-batch", type=int,
              help="Samples per iteration over all data-parallel replicas.")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
              help="Activation recomputation.")
@click.option("--contention", type=click.Choice(CONTENTION_MODES),
              help="How transfers share the network.")
@click.option("--devices-per-node", type=int, help="GPUs per node (default: the system's).")
@click.option("--grad-sync", metavar="WHICH",
              help="Gradient sync at the end: 'replicas', 'all' or stages (0,3,5).")
@click.option("--optimizer", is_flag=True, help="An optimizer step per device at the end.")
@POST_VALIDATION
@parallel_options
@click.option("--out", "-o", metavar="FILE",
              help="Write the execution here (.toml, or .json) instead of printing it.")
@click.option("--json", "as_json", is_flag=True, help="Print it as one JSON object.")
@translate_errors
def execution_command(model, system, out, as_json, global_batch, devices_per_node, **options):
    """Print (or save) the execution the options describe: the file to give --execution.

    Every option sets one field of the execution (--execution FILE is the base they
    change). With --model and --system it is checked against them (every degree must
    divide what it splits and the groups must tile the nodes), its defaults are filled
    in from them, and a comment says where each parallel group sits.
    """
    from tabsched.files import atomic_write, check_output_path
    if out:
        check_output_path(out, inputs=(options.get("execution"),))
    execution, sources = execution_from_options(options, replicas_checked=False)
    changes = {key: value for key, value in (("global_batch", global_batch),
                                             ("devices_per_node", devices_per_node))
               if value is not None}
    if changes:
        execution = execution.replace(**changes)
        sources.update({key: "--" + key.replace("_", "-") for key in changes})
    notes = []
    if model is not None or system is not None:
        costs = build_model_costs(model, system, execution, sources)
        execution = costs.execution
        groups = ", ".join(f"{name} {span['size']} ({_where(span)})"
                           for name, span in costs.placement.describe().items())
        ranks = costs.placement.pipeline_ranks_per_node
        notes.append(f"{costs.model.name} on {costs.system.name}: "
                     + (f"groups {groups}; " if groups else "")
                     + f"{ranks} pipeline rank{'s' if ranks != 1 else ''} per node")
    toml = "".join(f"# {note}\n" for note in notes) + execution.to_toml()
    if out:
        atomic_write(out, execution.to_json() if out.lower().endswith(".json") else toml)
        click.echo(f"wrote {out}", err=True)
    elif as_json:
        echo_json(execution.to_dict())
    else:
        click.echo(toml, nl=False)


def _where(span):
    """``inside a node``, ``across 4 nodes, 2 per node``."""
    if span["tier"] == "node":
        return "inside a node"
    return f"across {span['nodes']} nodes, {span['per_node']} per node"
