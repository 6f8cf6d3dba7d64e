"""``tabsched profile TRACE...``: GPU time per operation from a profiler trace's kernels."""

import csv
import io

import click

from tabsched.cli.format import echo_json, translate_errors
from tabsched.cli.options import SectionedCommand


def _milliseconds(seconds):
    return f"{seconds * 1e3:.3f}"


def _measurements_csv(profile, what):
    """``op,duration`` rows (seconds), one per occurrence: what ``Replay.from_csv`` reads."""
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["op", "duration"])
    for label, values in profile.measurements(what).items():
        for value in values:
            writer.writerow([label, repr(float(value))])
    return buffer.getvalue()


@click.command("profile", cls=SectionedCommand)
@click.argument("traces", metavar="TRACE...", nargs=-1, required=True,
                type=click.Path(exists=False))
@click.option("--measure", type=click.Choice(["compute", "communication", "span"]),
              default="compute", show_default=True,
              help="What -o writes per occurrence: the compute kernels' summed time, the "
                   "communication kernels', or first kernel start to last kernel end.")
@click.option("--out", "-o", metavar="FILE.csv",
              help="Write one op,duration row per occurrence (seconds), the file `tabsched "
                   "eval TABLE --replay FILE.csv` replays (atomically).")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@translate_errors
def profile_command(traces, measure, out, as_json):
    """Time each range of a GPU profiler trace by the CUDA kernels it launched.

    TRACE is a PyTorch profiler (Kineto) trace of a GPU run, .json or .json.gz, or a
    directory of them (one per rank): torchtitan's PP: actions, Megatron-LM's or any
    framework's record_function ranges. Each kernel belongs to the innermost range around
    its launch; NCCL's and other collective kernels are counted apart from compute.
    """
    from tabsched.files import atomic_write, check_output_path
    from tabsched.formats.kineto_kernels import read_kernel_trace
    if out is not None:
        check_output_path(out, suffixes=(".csv",), what="measurements file", inputs=traces)
    profile = read_kernel_trace(*traces)
    if out is not None:
        atomic_write(out, _measurements_csv(profile, measure))
    if as_json:
        echo_json(profile.to_dict())
    else:
        _print(profile)
    if out is not None:
        click.echo(f"wrote {out}", err=True)


def _print(profile):
    rows = profile.summary()
    width = max([len("range")] + [len(row["label"]) for row in rows])
    click.echo(f"{'range':<{width}}  count  compute ms  spread ms  comm ms  span ms  kernels")
    for row in rows:
        click.echo(f"{row['label']:<{width}}  {row['count']:>5}  "
                   f"{_milliseconds(row['compute_s']):>10}  "
                   f"{_milliseconds(row['compute_std_s']):>9}  "
                   f"{_milliseconds(row['communication_s']):>7}  "
                   f"{_milliseconds(row['span_s']):>7}  {row['kernels']:>7}")
    for stream in profile.streams:
        kind = "communication" if stream.is_communication else "compute"
        click.echo(f"stream {stream.stream} ({stream.source}): {stream.kernels} kernels, "
                   f"busy {_milliseconds(stream.busy)} ms, {kind}")
    click.echo(f"window {_milliseconds(profile.window)} ms; unmatched kernels "
               f"{profile.unmatched} ({_milliseconds(profile.unmatched_seconds)} ms)")
    for note in profile.notes:
        click.echo(f"note: {note}")
