"""Human output and error translation shared by the commands.

Machine output (``--json``) goes to stdout; progress and errors to stderr. Every
error is one line, ``Error: <what and where>``, and exit status 1.
"""

import functools
import json
import sys

import click

from tabsched.costs.units import format_quantity
from tabsched.exceptions import TabschedError

#: Exit status of every command (documented in ``tabsched --help`` and the README).
EXIT_OK = 0
EXIT_FAILURE = 1        # bad input or a failure: one ``Error:`` line on stderr
EXIT_USAGE = 2          # the command line itself (click's usage errors, with a -h hint)
EXIT_OVER_BUDGET = 3    # --strict, and a device over --memory-budget (or nothing fits it)
EXIT_STATUS_HELP = ("Exit status: 0 success; 1 bad input or a failure (one 'Error:' line on "
                    "stderr); 2 a usage error (unknown option, missing argument); 3 --strict "
                    "and a device over --memory-budget.")


class OverBudget(click.ClickException):
    """``--strict``: a device went over the memory budget (exit status 3)."""

    exit_code = EXIT_OVER_BUDGET


def translate_errors(command):
    """Turn library errors into one-line ClickExceptions (exit 1)."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except TabschedError as error:
            raise click.ClickException(str(error)) from None
        except BrokenPipeError:
            raise  # the reader went away (e.g. `| head`); main() exits quietly
        except MemoryError:
            raise click.ClickException(_memory_advice(kwargs)) from None
        except OSError as error:
            where = f"{error.filename}: " if error.filename else ""
            raise click.ClickException(f"{where}{error.strerror or error}") from None
    return wrapper


def _memory_advice(options):
    """The out-of-memory message, naming what this command can make smaller."""
    samples = (options.get("variation_params") or {}).get("samples")
    if samples:
        return (f"out of memory: {samples} Monte Carlo samples do not fit this machine; try "
                f"fewer --samples")
    return ("out of memory: the table or sweep is too large for this machine; try fewer "
            "devices or microbatches")


def replay_notes(variation):
    """Notes for a partial replay (labels that matched nothing), from a described variation."""
    parts = variation if isinstance(variation, list) else [variation] if variation else []
    return [f"replay: {part['note']} ({', '.join(part['unmatched_labels'])}"
            f"{', ...' if part['unmatched'] > len(part['unmatched_labels']) else ''})"
            for part in parts if isinstance(part, dict) and part.get("unmatched")]


def echo_json(data):
    click.echo(json.dumps(data, indent=1, default=_json_default))


def _json_default(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def format_number(value):
    """A number in human output: positional, at most 6 significant digits."""
    from tabsched.costs.units import format_number as positional
    return positional(value)


def format_time(value, unit, *, with_unit=True):
    """A time in human units for seconds, else the number and its unit."""
    if unit == "s":
        return format_quantity(value, "s")
    return f"{format_number(value)} {unit}" if with_unit else format_number(value)


def format_memory(value, unit):
    return format_quantity(value, "B") if unit == "bytes" else f"{format_number(value)} {unit}"


def format_columns(rows):
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[k]) for k, cell in enumerate(row)).rstrip()
                     for row in rows)


def steady_line(result):
    """``1.23 s (4.5% below the makespan; post-validation)``: the steady period beside
    the makespan, and whether the global synchronization was removed."""
    period, makespan = result.steady_period, result.makespan
    text = format_time(period, result.time_unit)
    how = "post-validation" if result.execution is not None and \
        result.execution.post_validation else "global sync before the step"
    if makespan > 0 and abs(period - makespan) > 1e-9 * makespan:
        side = "below" if period < makespan else "above"
        return f"{text} ({abs(1 - period / makespan):.1%} {side} the makespan; {how})"
    return f"{text} (= the makespan: iterations do not overlap; {how})"


def summary(result):
    """A short human summary of a Result."""
    table = result.table
    name = table.family or "table"
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    costs = " ".join(f"{key}={format_number(value) if isinstance(value, float) else value}"
                     for key, value in result.costs.items() if key != "model")
    lines = [f"{name} {params}".rstrip() + f": {table.num_devices} devices, "
             f"{table.num_stages} stages, {table.num_microbatches} microbatches, "
             f"{len(table)} ops",
             f"level         {result.level} ({result.costs.get('model')} {costs}; "
             f"contention {result.contention})"]
    unit = result.time_unit
    lines.append(f"makespan      {format_time(result.makespan, unit)}")
    lines.append(f"steady period {steady_line(result)}")
    if result.throughput is not None:
        lines.append(f"throughput    {throughput_line(result.throughput)}")
    bubble = f"bubble ratio  {result.bubble_ratio:.2%}"
    formula = result.formula
    if formula and formula.get("bubble_ratio") is not None:
        bubble += f"   (formula level: {formula['bubble_ratio']:.2%})"
    elif formula and formula.get("bubble_ratio_lower_bound") is not None:
        bubble += (f"   (formula level: no closed form; at least "
                   f"{formula['bubble_ratio_lower_bound']:.2%})")
    elif formula:
        bubble += "   (formula level: no closed form)"
    lines.append(bubble)
    if formula:
        lines.append(f"formula       {_exactness(formula)}")
        lines.append(f"              {formula.get('source')}")
        bounds = formula.get("peak_activation_bounds")
        if bounds is not None:
            lines.append(f"formula peak  {bounds[0]} .. {bounds[1]} per device "
                         f"({formula.get('activation_unit')})")
    counts = result.critical_counts()
    ops = counts.get("op", 0)
    lines.append(f"critical path {ops} ops, {sum(counts.values()) - ops} transfers")
    header = ["device", f"busy ({unit})", "idle", "warm-up", "inside", "cool-down",
              f"peak memory ({result.memory_unit})"]
    body = [[f"d{d.device}", format_number(d.busy), format_number(d.idle), format_number(d.warmup),
             format_number(d.inside), format_number(d.cooldown), format_number(d.peak_memory)]
            for d in result.devices]
    if unit == "s" or result.memory_unit == "bytes":
        header, body = _human_device_rows(result)
        lines.extend(_memory_lines(result))
    formula_peaks = (formula or {}).get("peak_activation")
    if (formula_peaks is not None and len(formula_peaks) == len(body)
            and result.memory_unit != "bytes"):
        header.append("formula peak")
        for row, peak in zip(body, formula_peaks):
            row.append(format_number(peak))
    widths = [max(len(row[k]) for row in [header] + body) for k in range(len(header))]
    for row in [header] + body:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    lines.extend(f"note: {note}" for note in result.notes)
    return "\n".join(lines)


def _exactness(formula):
    """When the formula level is exact, and whether these costs meet it."""
    if formula.get("bubble_ratio") is None and formula.get("peak_activation") is None:
        return "no closed form published"
    exact_when = formula.get("exact_when")
    if exact_when is None:
        return "never exact (see the note)"
    verdict = {True: ": met by these costs", False: ": not met by these costs"}
    return f"exact when {exact_when}{verdict.get(formula.get('exact'), '')}"


def formula_summary(table, numbers):
    """The formula level alone, for ``eval --level formula``."""
    params = " ".join(f"{key}={value}" for key, value in table.params.items())
    lines = [f"{table.family} {params}".rstrip() + ": formula level",
             f"source        {numbers.get('source')}"]
    bubble = numbers.get("bubble_ratio")
    lines.append("bubble ratio  " + (f"{bubble:.2%}" if bubble is not None
                                     else "none (no closed form)"))
    if numbers.get("bubble_time") is not None:
        lines.append(f"bubble time   {format_number(numbers['bubble_time'])} per device")
    if numbers.get("bubble_ratio_lower_bound") is not None:
        lines.append(f"lower bound   {numbers['bubble_ratio_lower_bound']:.2%} bubble ("
                     f"{format_number(numbers['bubble_time_lower_bound'])} idle on the first "
                     f"device)" + ("" if numbers.get("lower_bound_holds", True)
                                   else "; not guaranteed: unequal stages or transfers"))
    lines.append(f"exactness     {_exactness(numbers)}")
    unit = numbers.get("activation_unit")
    if numbers.get("peak_activation") is not None:
        peaks = " ".join(format_number(peak) for peak in numbers["peak_activation"])
        lines.append(f"peak memory   {peaks} ({unit}; per device)")
    elif numbers.get("peak_activation_bounds") is not None:
        low, high = numbers["peak_activation_bounds"]
        lines.append(f"peak memory   {low} .. {high} per device ({unit})")
    else:
        lines.append("peak memory   none (no closed form)")
    if numbers.get("note"):
        lines.append(f"note          {numbers['note']}")
    return "\n".join(lines)


def _human_device_rows(result):
    """The per-device table with times in s/ms/us and memory in B/GB when the costs say so."""
    unit, memory_unit = result.time_unit, result.memory_unit
    header = ["device", "busy", "idle", "warm-up", "inside", "cool-down", "peak activations",
              "persistent", "peak total"]
    body = [[f"d{d.device}"]
            + [format_time(value, unit, with_unit=False)
               for value in (d.busy, d.idle, d.warmup, d.inside, d.cooldown)]
            + [format_memory(value, memory_unit)
               for value in (d.peak_memory, d.persistent_memory, d.peak_total_memory)]
            for d in result.devices]
    return header, body


def _memory_lines(result):
    """The memory peak, and the budget with its violations, in one or two lines."""
    memory_unit = result.memory_unit
    devices = result.devices
    if not devices:
        return []
    top = max(devices, key=lambda d: d.peak_total_memory)
    lines = [f"peak memory   {format_memory(top.peak_total_memory, memory_unit)} on d{top.device} "
             f"({format_memory(top.persistent_memory, memory_unit)} persistent + "
             f"{format_memory(top.peak_memory, memory_unit)} activations"
             f"{_sharded_note(result)})"]
    if result.memory_budget is not None:     # the budget rules
        lines.append(_limit_line("memory budget", result.memory_budget, result.violations,
                                 result))
    elif result.memory_capacity is not None:
        lines.append(_limit_line("device memory", result.memory_capacity,
                                 result.capacity_violations, result,
                                 f" ({result.costs.get('system')})"))
    return lines


def _sharded_note(result):
    """What the peak beside the persistent memory also holds under ZeRO-2/3."""
    zero = result.execution.zero_stage if result.execution is not None else 0
    if zero >= 3:
        return " and gathered parameters and gradients"
    return " and unsharded gradients" if zero == 2 else ""


def _limit_line(label, limit, violations, result, whose=""):
    """``memory budget 80 GB: every device fits``, or how many devices go over and the
    worst of them."""
    memory_unit = result.memory_unit
    shown = f"{label} {format_memory(limit, memory_unit)}{whose}"
    if not violations:
        return f"{shown}: every device fits"
    worst = max(violations, key=lambda v: v.over)
    return (f"{shown}: {len(violations)} of {len(result.devices)} devices over (worst "
            f"d{worst.device} by {format_memory(worst.over, memory_unit)} at "
            f"{format_time(worst.time, result.time_unit)})")


def throughput_line(run):
    """One line of a :class:`~tabsched.throughput.Throughput`: tokens/s over every GPU and
    per GPU, model and hardware FLOP/s per GPU, MFU and HFU."""
    return (f"{format_tokens(run.tokens_per_s)} tokens/s, "
            f"{format_tokens(run.tokens_per_s_per_gpu)} per "
            f"GPU ({run.gpus} GPUs); per GPU {format_quantity(run.model_flops_per_gpu, 'FLOP/s')}"
            f" model, {format_quantity(run.hardware_flops_per_gpu, 'FLOP/s')} hardware; "
            f"MFU {run.mfu:.1%}, HFU {run.hfu:.1%}")


def format_tokens(value):
    """``16.1 k``, ``129``: a count of tokens with an SI prefix."""
    return format_quantity(value, "").rstrip()


def monte_carlo_summary(runs):
    """Monte Carlo figures and the run-time bubble per device, for humans."""
    unit = runs.time_unit
    mean = runs.mean
    share = runs.runtime_bubble / mean if mean else 0.0
    lines = [f"monte carlo   {runs.samples} samples (seed {runs.seed}): mean "
             f"{format_time(mean, unit)}, p50 {format_time(runs.p50, unit)}, "
             f"p95 {format_time(runs.p95, unit)}, "
             f"max {format_time(runs.max, unit)}",
             f"run-time bubble {format_time(runs.runtime_bubble, unit)} ({share:.2%} of the mean "
             f"makespan) over {format_time(runs.nominal_makespan, unit)} at mean durations"]
    models = runs.variation if isinstance(runs.variation, list) else [runs.variation]
    lines.extend(f"note          {note}" for model in models if isinstance(model, dict)
                 for note in model.get("notes", ()))
    header = ["device", "mean busy", "mean idle", "idle at mean durations", "run-time bubble"]
    def clean(value):   # a difference of equal sums is float residue, not a bubble
        return 0.0 if abs(value) <= 1e-12 * max(1.0, abs(mean)) else value
    body = [[f"d{d.device}"] + [format_time(clean(value), unit, with_unit=False) for value in
                                (d.mean_busy, d.mean_idle, d.nominal_idle, d.runtime_bubble)]
            for d in runs.devices]
    widths = [max(len(row[k]) for row in [header] + body) for k in range(len(header))]
    for row in [header] + body:
        lines.append("  ".join(cell.rjust(widths[k]) if k else cell.ljust(widths[k])
                               for k, cell in enumerate(row)).rstrip())
    lines.extend(f"note: {note}" for note in replay_notes(runs.variation))
    return "\n".join(lines)


def progress_reporter(label, *, quiet=False, unit="tables"):
    """Progress on stderr as a bar with an ETA (click's progress bar), or nothing.

    The bar shows on a terminal only: with stderr redirected or ``quiet`` it stays
    silent, so logs and pipes get the result alone. Returns ``report(done, total,
    configurations)``, the callback :func:`tabsched.sweeps.run_sweep` and the search take.
    """
    if quiet or not sys.stderr.isatty():
        return None
    state = {}

    def report(done, total, configurations):
        bar = state.get("bar")
        if bar is None:
            bar = state["bar"] = click.progressbar(
                length=total, label=label, file=sys.stderr, show_eta=True, show_pos=True,
                item_show_func=lambda item: item)
            bar.__enter__()
            state["done"] = 0
        what = "configurations" if unit == "tables" else unit
        bar.update(done - state["done"],
                   f"{configurations} {what if configurations != 1 else what[:-1]}")
        state["done"] = done
        if done >= total:
            bar.__exit__(None, None, None)
            state.pop("bar")
    return report


def check_html_path(path, *, inputs=(), outputs=None):
    """Refuse, before any work, an ``--html`` path that cannot be written, one of the
    command's ``inputs`` or another of its ``outputs`` (``{flag: path}``); the message
    names ``--html`` and the path."""
    import os

    from tabsched.exceptions import OutputError
    from tabsched.files import check_output_path
    from tabsched.report import HTML_SUFFIXES
    if os.path.isdir(path) and not os.path.islink(path):
        raise OutputError(f"--html {path}: is a folder; give the HTML report's file name")
    try:
        check_output_path(path, suffixes=HTML_SUFFIXES, what="HTML report",
                          inputs=[source for source in inputs if isinstance(source, str)])
    except OutputError as error:
        raise OutputError(f"--html {error}") from None
    for flag, other in (outputs or {}).items():
        if other and os.path.abspath(other) == os.path.abspath(path):
            raise OutputError(f"--html {path}: is also the {flag} file; write the HTML "
                              f"report elsewhere")


def write_html_report(obj, path, **options):
    """Write ``obj``'s HTML report to ``path`` (atomically) and say so on stderr."""
    from tabsched.exceptions import OutputError
    from tabsched.report import html_report
    try:
        html_report(obj, path, **options)
    except OutputError as error:
        raise OutputError(f"--html {error}") from None
    click.echo(f"wrote the HTML report to {path}", err=True)
