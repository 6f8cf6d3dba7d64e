"""``tabsched whatif``: another schedule's iteration time, predicted from one trace."""

import click

from tabsched.cli.format import echo_json, translate_errors


@click.command("whatif")
@click.argument("trace", metavar="TRACE")
@click.option("--schedule", "-s", "family", required=True, metavar="FAMILY",
              help="The family to predict (`tabsched list`).")
@click.option("--devices", "-p", type=int, help="Its pipeline depth (default: the trace's).")
@click.option("--microbatches", "-m", type=int,
              help="Its microbatch count (default: the trace's; same microbatch size).")
@click.option("--chunks", "-v", type=int, help="Its chunks per device, for families with them.")
@click.option("--layers", type=int,
              help="Layers of the model (default: a uniform cost density over the stages).")
@click.option("--stage-layers", metavar="N,N,...",
              help="Layers of each traced stage, e.g. 3,5 (default: an even split).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")
@translate_errors
def whatif_command(trace, family, devices, microbatches, chunks, layers, stage_layers, as_json):
    """Predict FAMILY's iteration time from the costs fitted to one TRACE.

    TRACE is a PyTorch profiler trace of a pipeline run, or a directory of them (one per
    rank): the `PP:` actions PyTorch's pipelining runtime writes. The costs are fitted per
    stage and kind (F, B, I, W) with their spread, the point-to-point time from the
    receives that waited; another depth re-partitions the layers (per-layer cost = stage
    cost / layers per stage). The prediction is evaluated once per profiled iteration's
    costs: the mean and the range are printed, with the fitted costs and what the trace
    could not give.
    """
    from tabsched.whatif import whatif
    per_stage = None
    if stage_layers is not None:
        try:
            per_stage = [int(part) for part in stage_layers.split(",")]
        except ValueError:
            raise click.ClickException(f"--stage-layers {stage_layers!r}: give integers "
                                       f"separated by commas, e.g. 4,4") from None
    for name, value in (("--devices", devices), ("--microbatches", microbatches),
                        ("--chunks", chunks), ("--layers", layers)):
        if value is not None and value < 1:
            raise click.ClickException(f"{name} must be >= 1, not {value}")
    result = whatif(trace, family, devices=devices, microbatches=microbatches, chunks=chunks,
                    layers=layers, stage_layers=per_stage)
    if as_json:
        echo_json(result.to_dict())
        return
    click.echo(summary(result))


def _ms(seconds):
    return f"{seconds * 1e3:.2f} ms"


def summary(result):
    """The prediction, the traced step, the fitted costs and what could not be matched."""
    traced, fit, table = result.traced, result.fit, result.table
    measured = traced.iterations
    mean = sum(measured) / len(measured)
    lines = [f"trace         {len(traced.files)} files, {traced.table.num_devices} ranks, "
             f"{traced.table.num_stages} stages, {traced.table.num_microbatches} microbatches, "
             f"{len(measured)} iterations ({traced.timeline} timeline)",
             f"measured      {_ms(mean)} per iteration (min {_ms(min(measured))}, max "
             f"{_ms(max(measured))})",
             f"replayed      {_ms(result.replayed)} (the traced table at the fitted costs; "
             f"{result.replayed / mean - 1:+.1%} against the measured mean)",
             f"predicted     {_ms(result.predicted)} for {table.family} "
             f"{' '.join(f'{k}={v}' for k, v in table.params.items())} "
             f"(range {_ms(result.spread[0])} - {_ms(result.spread[1])} over the "
             f"{len(result.samples)} iterations' costs)",
             "fitted costs  per stage (mean, op-to-op cv, operations):"]
    for kind, values in fit.stage_costs.items():
        cells = ", ".join(f"s{stage} {_ms(value)} cv {fit.cv[kind][stage]:.2f} "
                          f"n={fit.counts[kind][stage]}" for stage, value in enumerate(values))
        lines.append(f"  {kind}  {cells}")
    low, high = fit.transfer_spread
    lines.append(f"  p2p {fit.transfer * 1e6:.0f} us per transfer (median of "
                 f"{len(traced.transfers)}, range {low * 1e6:.0f} - {high * 1e6:.0f} us)")
    lines.append(f"  layers per traced stage {','.join(map(str, fit.stage_layers))}")
    lines.append("not matched   " + ("\n              ".join(fit.unmatched) or "none"))
    return "\n".join(lines)
