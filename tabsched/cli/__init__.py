"""The ``tabsched`` command line: parse, call the library, print.

Machine output (``--json``) goes to stdout; progress and errors to stderr. Every
error in the input is one line, ``Error: <what and where>``, and exit status 1; a
usage error (an unknown option, a missing argument) is click's usage message with
its ``-h`` hint and exit status 2; ``--strict`` with a device over the memory budget
exits 3 (:data:`~tabsched.cli.format.EXIT_OVER_BUDGET`).

One module per command or close group of commands; a new command is a new
module added to ``COMMANDS``. Option groups the commands share live in
:mod:`~tabsched.cli.options`, human output and error translation in
:mod:`~tabsched.cli.format`.
"""

import sys

import click

from tabsched.cli.adapt import adapt_command
from tabsched.cli.compare import compare_command, study_command, sweep_command
from tabsched.cli.costs import costs_command
from tabsched.cli.eval import eval_command
from tabsched.cli.format import EXIT_FAILURE, EXIT_OK, EXIT_STATUS_HELP, EXIT_USAGE
from tabsched.cli.megatron import megatron_command
from tabsched.cli.plot import plot_group, trace_command
from tabsched.cli.presets import presets_command
from tabsched.cli.tables import convert_command, list_command, show_command

__all__ = ["cli", "main"]

COMMANDS = (list_command, show_command, eval_command, adapt_command, presets_command,
            costs_command, convert_command, compare_command, sweep_command, study_command,
            plot_group, trace_command, megatron_command)


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"{EXIT_STATUS_HELP} Shell completion: eval \"$(_TABSCHED_COMPLETE="
                    f"bash_source tabsched)\" (zsh_source, fish_source for other shells).")
@click.version_option(package_name="tabsched")
def cli():
    """Compare and improve pipeline-parallel schedules without GPUs.

    A SCHEDULE is a family name (see `tabsched list`) or a .csv/.json table file.
    """


for _command in COMMANDS:
    cli.add_command(_command)


def main(argv=None):
    """Entry point: exit 0, or 1 with one ``Error:`` line, 2 on usage errors, 3 over budget."""
    try:
        cli.main(args=argv, prog_name="tabsched", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Error: aborted", err=True)
        sys.exit(EXIT_FAILURE)
    except click.exceptions.NoArgsIsHelpError as error:
        click.echo(error.ctx.get_help() if error.ctx else str(error))
        sys.exit(EXIT_OK)
    except click.UsageError as error:
        error.show()   # the usage line, "Try 'tabsched ... -h' for help." and the error
        sys.exit(EXIT_USAGE)
    except click.ClickException as error:
        click.echo(f"Error: {error.format_message()}", err=True)
        sys.exit(error.exit_code)
    except BrokenPipeError:
        sys.exit(EXIT_FAILURE)
    sys.exit(EXIT_OK)
