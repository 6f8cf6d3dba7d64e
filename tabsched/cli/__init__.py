"""The ``tabsched`` command line: parse, call the library, print.

Machine output (``--json``) goes to stdout; progress and errors to stderr. Every
error in the input is one line, ``Error: <what and where>``, and exit status 1; a
usage error (an unknown option, a missing argument) is click's usage message with
its ``-h`` hint and exit status 2; ``--strict`` with a device over the memory budget
exits 3 (:data:`~tabsched.cli.format.EXIT_OVER_BUDGET`).

One module per command or close group of commands; a new command is a new
module added to ``COMMANDS``, imported only when its command runs. Option groups
the commands share live in :mod:`~tabsched.cli.options`, human output and error
translation in :mod:`~tabsched.cli.format`.
"""

import importlib
import sys
from collections.abc import MutableMapping

import click

from tabsched.cli.format import EXIT_FAILURE, EXIT_OK, EXIT_STATUS_HELP, EXIT_USAGE

__all__ = ["cli", "main"]

#: command name -> (module of tabsched.cli, attribute): the commands of the group.
COMMANDS = {
    "list": ("tables", "list_command"), "show": ("tables", "show_command"),
    "eval": ("eval", "eval_command"), "adapt": ("adapt", "adapt_command"),
    "presets": ("presets", "presets_command"), "costs": ("costs", "costs_command"),
    "convert": ("tables", "convert_command"), "compare": ("compare", "compare_command"),
    "sweep": ("compare", "sweep_command"), "study": ("compare", "study_command"),
    "plot": ("plot", "plot_group"), "trace": ("plot", "trace_command"),
    "megatron": ("megatron", "megatron_command"),
    "execution": ("execution", "execution_command"),
    "plan": ("plan", "plan_command"),
    "system": ("system", "system_group"),
    "profile": ("profile", "profile_command"),
    "whatif": ("whatif", "whatif_command"),
}


class LazyCommands(MutableMapping):
    """The group's ``commands``: names known up front, each command's module imported
    the first time the command is looked up, so that ``tabsched sweep`` starts without
    importing what ``adapt``, ``plot`` or ``tables`` need (``--help`` and shell
    completion look every command up, and so import them all)."""

    def __init__(self, where):
        self._where = dict(where)
        self._loaded = {}

    def __getitem__(self, name):
        if name not in self._loaded:
            module, attribute = self._where[name]
            self._loaded[name] = getattr(importlib.import_module(f"tabsched.cli.{module}"),
                                         attribute)
        return self._loaded[name]

    def __setitem__(self, name, command):
        self._where.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name):
        if name not in self._where and name not in self._loaded:
            raise KeyError(name)
        self._where.pop(name, None)
        self._loaded.pop(name, None)

    def __iter__(self):
        return iter(dict.fromkeys([*self._where, *self._loaded]))

    def __len__(self):
        return len(set(self._where) | set(self._loaded))


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             epilog=f"{EXIT_STATUS_HELP} Shell completion: eval \"$(_TABSCHED_COMPLETE="
                    f"bash_source tabsched)\" (zsh_source, fish_source for other shells).")
@click.version_option(package_name="tabsched")
def cli():
    """Compare and improve pipeline-parallel schedules without GPUs.

    A SCHEDULE is a family name (see `tabsched list`) or a .csv/.json table file.
    """


cli.commands = LazyCommands(COMMANDS)


class Terminated(BaseException):
    """SIGTERM (or SIGHUP) arrived: raised where the program is, so that every ``finally``
    runs on the way out -- a half-written file's temporary removed
    (:func:`tabsched.files.atomic_write`), forked workers stopped
    (:func:`tabsched.parallel.run_forked`) -- as SIGINT's KeyboardInterrupt does. A
    BaseException, so that no ``except Exception`` swallows it."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _terminated(signum, frame):
    raise Terminated(signum)


def _on_termination():
    """Turn SIGTERM and SIGHUP into :class:`Terminated` while the command runs (only where
    their handlers are the default: a program that embeds the CLI keeps its own)."""
    import signal
    installed = {}
    for name in ("SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is signal.SIG_DFL:
            try:
                installed[number] = signal.signal(number, _terminated)
            except ValueError:   # not the main thread: leave the default
                pass
    return installed


def main(argv=None):
    """Entry point: exit 0, or 1 with one ``Error:`` line, 2 on usage errors, 3 over budget;
    128 + the signal's number when SIGTERM or SIGHUP stops it (after cleaning up)."""
    import signal
    installed = _on_termination()
    try:
        cli.main(args=argv, prog_name="tabsched", standalone_mode=False)
    except Terminated as stop:
        click.echo(f"Error: stopped by {signal.Signals(stop.signum).name}; no output was "
                   f"left half-written", err=True)
        sys.exit(128 + stop.signum)
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
    finally:
        for number, previous in installed.items():
            signal.signal(number, previous)
    sys.exit(EXIT_OK)
