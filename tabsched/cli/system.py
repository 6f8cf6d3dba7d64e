"""``tabsched system import KIND FILE``: a user's microbenchmarks into a system TOML.

A group, so that each kind of microbenchmark output is one subcommand of
``import`` (``gemm``, ``nccl-tests``) and other system commands can sit beside
``import``.
"""

import click

from tabsched.cli.format import translate_errors


@click.group("system")
def system_group():
    """Describe a system from measurements: system import gemm|nccl-tests FILE."""


@system_group.group("import")
def import_group():
    """Turn microbenchmark output into a system TOML (gemm: a GEMM sweep CSV; nccl-tests:
    all_reduce_perf, all_gather_perf, reduce_scatter_perf output)."""


@import_group.command("gemm")
@click.argument("csv_file", metavar="FILE.csv", type=click.Path(dir_okay=False))
@click.option("--source", required=True,
              help="Where the measurements come from (GPU, software, date): the table's "
                   "required source.")
@click.option("--system", "base", metavar="NAME|FILE.toml",
              help="The base system (a preset or a TOML file): the output is it with the "
                   "table added, and no row may beat its peak_flops. Without it, the table "
                   "alone is printed.")
@click.option("--dtype", help="Take the rows of this dtype (a CSV with a dtype column may "
                              "hold several; a system's table holds one).")
@click.option("--fp8", is_flag=True,
              help="The sweep is of FP8 products: the system's fp8_gemm_efficiency table, "
                   "no row faster than its fp8_peak_flops.")
@click.option("--out", "-o", metavar="FILE.toml",
              help="Write the TOML here (atomically: an existing file is replaced only once "
                   "the new one is complete) instead of printing it.")
@translate_errors
def import_gemm_command(csv_file, source, base, dtype, fp8, out):
    """A GEMM sweep (CSV with a header m,n,k,seconds and optionally dtype) as a system's
    gemm_efficiency table: one row per measured product C[m,n] = A[m,k] @ B[k,n], its
    time in seconds (e.g. the median of the runs)."""
    from tabsched.costs.system_import import gemm_system_toml
    from tabsched.files import atomic_write, check_output_path
    if out is not None:
        check_output_path(out, suffixes=(".toml",), what="system file",
                          inputs=(csv_file, base))
    toml = gemm_system_toml(csv_file, source, base, dtype, fp8)
    if out is None:
        click.echo(toml, nl=False)
        return
    atomic_write(out, toml)
    click.echo(f"wrote {out}", err=True)


@import_group.command("nccl-tests")
@click.argument("files", metavar="FILE...", nargs=-1, required=True,
                type=click.Path(dir_okay=False))
@click.option("--system", "base", metavar="NAME|FILE.toml",
              help="The base system (a preset or a TOML file): the output is it with the "
                   "tables added. Without it, the tables alone are printed.")
@click.option("--tier", type=click.Choice(["node", "network"]),
              help="The tier the runs measured (default: node when every rank runs on one "
                   "host, else network; a tier the hosts contradict is refused).")
@click.option("--collective", type=click.Choice(["all_reduce", "all_gather",
                                                 "reduce_scatter"]),
              help="The collective, for files that do not say it (older nccl-tests, "
                   "renamed files).")
@click.option("--source", help="Where the measurements come from (cluster, NCCL version, "
                               "date); default: the files' names and nccl-tests version.")
@click.option("--out", "-o", metavar="FILE.toml",
              help="Write the TOML here (atomically: an existing file is replaced only once "
                   "the new one is complete) instead of printing it.")
@translate_errors
def import_nccl_command(files, base, tier, collective, source, out):
    """nccl-tests' text output (one run per file) as a system's collective_bandwidth
    tables: the out-of-place bus bandwidth of every size, by collective, tier and number of
    ranks."""
    from tabsched.costs.system_import import nccl_system_toml
    from tabsched.files import atomic_write, check_output_path
    if out is not None:
        check_output_path(out, suffixes=(".toml",), what="system file")
    toml = nccl_system_toml(files, source, base, tier, collective)
    if out is None:
        click.echo(toml, nl=False)
        return
    atomic_write(out, toml)
    click.echo(f"wrote {out}", err=True)
