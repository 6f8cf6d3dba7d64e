"""``tabsched megatron``: the Megatron-LM launch arguments that run a table."""

import click

from tabsched.cli.build import load_with_torch
from tabsched.cli.format import echo_json, translate_errors
from tabsched.cli.options import (SectionedCommand, complete_schedule, schedule_options,
                                  torch_options)


@click.command("megatron", cls=SectionedCommand)
@click.argument("schedule", shell_complete=complete_schedule)
@schedule_options
@click.option("--microbatch-size", type=int, default=1, show_default=True,
              help="Samples per microbatch (Megatron-LM's --micro-batch-size).")
@click.option("--data-parallel-size", "data_parallel", type=int, default=1, show_default=True,
              help="Pipelines in data parallel; only the global batch depends on it.")
@click.option("--num-layers", type=int,
              help="The model's layers, when the table does not say (no stage layers).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@torch_options
@translate_errors
def megatron_command(schedule, schedule_params, microbatch_size, data_parallel, num_layers,
                     as_json, torch_legacy, p2p):
    """Print the Megatron-LM arguments that run SCHEDULE, or why Megatron-LM cannot.

    Megatron-LM runs 1F1B and interleaved 1F1B; a table is exported when its order is
    one of them operation for operation (pipeline size, virtual stages, layers per stage,
    microbatch group size). Exit 1 with the reason otherwise.
    """
    from tabsched.megatron import megatron_arguments
    table, _ = load_with_torch(schedule, torch_legacy, p2p, **schedule_params)
    launch = megatron_arguments(table, micro_batch_size=microbatch_size,
                                data_parallel=data_parallel, num_layers=num_layers)
    if as_json:
        echo_json(launch.to_dict())
        return
    click.echo(" \\\n".join(flag if value is None else f"{flag} {value}"
                           for flag, value in launch.arguments))
    click.echo(f"# runs {launch.schedule}", err=True)
    for note in launch.notes:
        click.echo(f"# note: {note}", err=True)
