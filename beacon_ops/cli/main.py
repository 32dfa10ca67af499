"""`beacon`: the operator's command. Every option can also come from the environment.

Here: the commands' registration, signal handling and exit codes. Each command lives in a module of
its own beside this one.
"""

from __future__ import annotations

import os
import signal
import sys
from importlib.metadata import PackageNotFoundError, version
from types import FrameType
from typing import Annotated

import typer

# typer 0.29 vendors click; its exceptions are not the `click` package's (typer is pinned).
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from beacon_ops.cli.common import BeaconError
from beacon_ops.cli.doctor import doctor
from beacon_ops.cli.goodput import goodput
from beacon_ops.cli.local import local
from beacon_ops.cli.run import run
from beacon_ops.cli.smoke import smoke
from beacon_ops.cli.sync import sync
from beacon_ops.cli.tensorboard import tensorboard

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Beacon: training that is never lost in the cloud.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
    rich_markup_mode=None,  # plain help wraps long lines instead of cutting them at 80 columns
)


def show_version(value: bool) -> None:
    if value:
        try:  # the command's own distribution (the runtime, `beacon`, is the training image's)
            print(f"beacon {version('beacon-ops')}")
        except PackageNotFoundError:
            print("beacon (not installed; run `make install`)")
        raise typer.Exit(0)


@app.callback()
def main_options(
    _version: Annotated[
        bool, typer.Option("--version", callback=show_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Beacon: training that is never lost in the cloud."""


# In the order `beacon --help` has always listed them.
for command in (doctor, tensorboard, smoke, run, local, sync, goodput):
    # `beacon local -- <command>`: what follows `--` is the team's own command, passed on as it is
    if command is local:
        app.command(context_settings={"allow_extra_args": True}, options_metavar="[OPTIONS] [-- COMMAND...]")(local)
    else:
        app.command()(command)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a cancelled pipeline, a closed terminal): unwind like Ctrl-C, so every
    cleanup runs (the smoke Job deleted, a SageMaker job stopped, the demo's processes ended)."""


TERMINATED_BY: list[int] = []


def _terminated(signum: int, _frame: FrameType | None) -> None:
    TERMINATED_BY.append(signum)
    raise Terminated(signal.Signals(signum).name)


def main() -> None:
    """Bad input gets one line and exit code 2, not a usage box."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminated)
    try:
        code = app(prog_name="beacon", standalone_mode=False)
    except NoArgsIsHelpError:
        app(["--help"], prog_name="beacon", standalone_mode=False)
        sys.exit(2)
    except UsageError as error:
        command = error.ctx.command_path if error.ctx else "beacon"
        print(f"{command}: error: {error.format_message()} (see --help)", file=sys.stderr)
        sys.exit(2)
    except BeaconError as error:
        sys.exit(error.report())
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        sys.exit(130)
    if TERMINATED_BY:  # typer reports any interrupt as 130; a signal's own code is 128 + its number
        sys.exit(128 + TERMINATED_BY[0])
    sys.exit(code if isinstance(code, int) else 0)
