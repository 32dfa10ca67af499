"""What every `beacon` command shares: its options' checks, the console, and the one way to fail."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import boto3
import typer
from beacon import contract
from rich.console import Console

from beacon_ops.aws_access import AccessError, open_session
from config import ConfigError, TeamConfig, load_team

if TYPE_CHECKING:
    from beacon_ops.local.own_command import LocalAws

REGION_HELP = "AWS region (default: the team file's region, then AWS_REGION)"
console = Console(width=None if sys.stdout.isatty() else 160, log_path=False)


class BeaconError(Exception):
    """The command cannot start or go on. main() turns it into one line on stderr (and a JSON object
    on stdout with --json) and exit code 2, whichever command raised it."""

    def __init__(self, command: str, message: str, *, as_json: bool = False) -> None:
        super().__init__(message)
        self.command = command
        self.message = message
        self.as_json = as_json

    def report(self) -> int:
        print(f"beacon {self.command}: {self.message}", file=sys.stderr)
        if self.as_json:
            print(json.dumps({"command": self.command, "ok": False, "exit_code": 2, "error": self.message}))
        return 2


def fail(command: str, message: str, *, as_json: bool = False) -> BeaconError:
    """The error to raise: `raise fail(...) from None`."""
    return BeaconError(command, message, as_json=as_json)


def identifier(kind: str) -> Any:
    def check(value: str | None) -> str | None:
        if value is None:  # an option left out: its default is the command's to choose
            return None
        try:
            return contract.validate_id(kind, value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None

    return check


def team_or_fail(command: str, team: str, *, as_json: bool) -> TeamConfig:
    try:
        return load_team(team)
    except ConfigError as error:
        for line in error.lines[:-1]:
            print(f"beacon {command}: {line}", file=sys.stderr)
        raise fail(command, error.lines[-1], as_json=as_json) from None


def session_or_fail(command: str, *, region: str | None, config: TeamConfig, as_json: bool) -> boto3.session.Session:
    try:
        return open_session(region_flag=region, team_region=config.region)
    except AccessError as error:
        raise fail(command, str(error), as_json=as_json) from None


# A run of `beacon local --keep -- <command>`, read on the embedded AWS it left running (`doctor`, `tensorboard`).
Local = Annotated[
    bool, typer.Option(help="a run of `beacon local --keep -- <command>`, on the embedded AWS it left running")
]
LocalWorkdir = Annotated[
    Path, typer.Option(envvar="BEACON_DEMO_DIR", help="with --local: beacon local's work directory")
]
DEFAULT_LOCAL_WORKDIR = Path(".beacon/demo")
# The options of a command that reads one run as the team's reader (`beacon tensorboard`, `beacon goodput`)
RunId = Annotated[str, typer.Option(envvar="BEACON_RUN_ID", help="run id", callback=identifier("run"))]
ReaderTeam = Annotated[str | None, typer.Option(envvar="BEACON_TEAM", help="team name (not with --local)")]
ReaderExperiment = Annotated[
    str | None,
    typer.Option(
        envvar="BEACON_EXPERIMENT",
        callback=identifier("experiment"),
        help="default: smoke; with --local, the one the run was started in",
    ),
]
ReaderBucket = Annotated[str | None, typer.Option(envvar="BEACON_BUCKET", help="default: the stack output")]
ReaderRegion = Annotated[str | None, typer.Option(help=REGION_HELP)]
ReaderRoleArn = Annotated[str | None, typer.Option(envvar="BEACON_READER_ROLE_ARN")]


def kept_or_fail(command: str, workdir: Path, *, as_json: bool = False) -> LocalAws:
    """The embedded AWS `beacon local --keep` left running from `workdir`, or one line saying how to start one."""
    from beacon_ops.local.own_command import KEPT, LocalAws

    kept = LocalAws.kept(workdir)
    if kept is None:
        raise fail(command, f"--local: no embedded AWS running from {workdir / KEPT}: start one with "
                   f"`beacon local --workdir {workdir} --keep -- <command>`", as_json=as_json)  # fmt: skip
    return kept


def team_reader_or_fail(
    command: str,
    team: str,
    *,
    region: str | None,
    bucket: str | None,
    reader_role_arn: str | None,
    as_json: bool = False,
) -> tuple[Any, str, str, TeamConfig]:
    """An S3 client as the team's reader (its role from the artifacts stack's outputs, unless given), the team's
    bucket, the words that name where it reads ("team 'demo' in us-east-1") and its team file; or the one line that
    says why not."""
    from botocore.exceptions import BotoCoreError, ClientError

    from beacon_ops.aws_access import deployed_stack_outputs, describe_aws_error
    from beacon_ops.credentials import assume_role_credentials
    from config import names
    from stacks import outputs as outputs_of

    config = team_or_fail(command, team, as_json=as_json)
    session = session_or_fail(command, region=region, config=config, as_json=as_json)
    where = f"team {team!r} in {session.region_name}"
    try:
        if bucket is None or reader_role_arn is None:
            stack = names.stack_name(team, "artifacts")
            outputs = deployed_stack_outputs(session.client("cloudformation"), stack, str(session.region_name), team)
            bucket = bucket or outputs[outputs_of.BUCKET_NAME]
            reader_role_arn = reader_role_arn or outputs.get(outputs_of.READER_ROLE_ARN)
        sts = session.client("sts")
        reader = assume_role_credentials(sts, reader_role_arn, f"beacon-{command}") if reader_role_arn else {}
        return session.client("s3", **reader), bucket, where, config
    except AccessError as error:
        raise fail(command, str(error), as_json=as_json) from None
    except (ClientError, BotoCoreError) as error:
        raise fail(command, f"cannot read {where}: {describe_aws_error(error)}", as_json=as_json) from None
    except KeyError as error:
        raise fail(command, f"cannot read {where}: stack output {error} is missing", as_json=as_json) from None
