"""``tabsched presets``: the model and system presets with their key numbers."""


import click

from tabsched.cli.format import echo_json, format_columns, translate_errors
from tabsched.cli.options import SectionedCommand
from tabsched.costs.units import format_count, format_quantity
from tabsched.exceptions import UnknownNameError


def _efficiency(system):
    """The matrix efficiency: a number, or a table's range."""
    value = system.compute_efficiency
    if isinstance(value, tuple):
        return f"{value[0][1]:g}..{value[-1][1]:g}"
    return f"{value:g}"


@click.command("presets", cls=SectionedCommand)
@click.option("--show", "name", help="Print the TOML of one preset (copy it to make your own).")
@click.option("--json", "as_json", is_flag=True, help="Print the presets as JSON (SI units).")
@translate_errors
def presets_command(name, as_json):
    """List the model and system presets with their key numbers."""
    from tabsched.costs._presets import preset_index
    from tabsched.costs.system import system_presets
    from tabsched.costs.transformer import model_presets
    index = preset_index()
    if name is not None:
        for kind in ("model", "system"):
            if name in index[kind]:
                click.echo(index[kind][name], nl=False)
                return
        names = [preset for kind in ("model", "system") for preset in index[kind]]
        raise UnknownNameError(f"unknown preset {name!r}; valid presets: {', '.join(names)}")
    models, systems = model_presets(), system_presets()
    if as_json:
        echo_json({"models": [model.summary() for model in models.values()],
                   "systems": [system.summary() for system in systems.values()]})
        return
    rows = [["model", "layers", "hidden", "heads/kv", "ffn", "sequence", "vocab", "params",
             "recompute", "description"]]
    for model in models.values():
        rows.append([model.name, str(model.layers), str(model.hidden),
                     f"{model.heads}/{model.kv_heads}", str(model.ffn), str(model.sequence),
                     str(model.vocab), format_count(model.parameters), model.recompute,
                     model.description])
    click.echo(format_columns(rows))
    click.echo("")
    rows = [["system", "compute", "memory bw", "capacity", "per node", "intra-node",
             "inter-node", "contention"]]
    for system in systems.values():
        capacity = system.memory_capacity
        rows.append([
            system.name,
            f"{format_quantity(system.peak_flops, 'FLOP/s')} x {_efficiency(system)}",
            format_quantity(system.memory_bandwidth, "B/s"),
            "-" if capacity is None else format_quantity(capacity, "B"),
            str(system.devices_per_node),
            f"{format_quantity(system.intra_node_bandwidth, 'B/s')}, "
            f"{format_quantity(system.intra_node_latency, 's')}",
            f"{format_quantity(system.inter_node_bandwidth, 'B/s')}, "
            f"{format_quantity(system.inter_node_latency, 's')}",
            system.contention])
    click.echo(format_columns(rows))
