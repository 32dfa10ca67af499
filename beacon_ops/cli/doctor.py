"""`beacon doctor`: why are my metrics missing? Verdicts with evidence and fixes, most likely first."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from beacon_ops.aws_access import describe_aws_error
from beacon_ops.cli.common import REGION_HELP, console, fail, identifier, session_or_fail, stack_outputs, team_or_fail
from beacon_ops.credentials import assume_role_credentials
from beacon_ops.doctor.diagnosis import FAIL, OK, WARN, Diagnosis, DoctorInputs, diagnose
from config import names
from stacks import outputs as outputs_of

STYLE = {OK: "green", WARN: "yellow", FAIL: "red"}


def print_diagnosis(result: Diagnosis) -> None:
    table = Table(title=f"beacon doctor: {result.experiment}/{result.run} -> {result.diagnosis}")
    for column in ("check", "verdict", "evidence", "fix"):
        table.add_column(column, overflow="fold")
    for v in result.verdicts:
        table.add_row(v.check, f"[{STYLE.get(v.status, 'white')}]{v.verdict}[/]", v.evidence, v.fix)
    console.print(table)


def doctor(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name")],
    run: Annotated[str, typer.Option(envvar="BEACON_RUN_ID", help="run id", callback=identifier("run"))],
    experiment: Annotated[str, typer.Option(envvar="BEACON_EXPERIMENT", callback=identifier("experiment"))] = "smoke",
    bucket: Annotated[str | None, typer.Option(envvar="BEACON_BUCKET", help="default: the stack output")] = None,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    reader_role_arn: Annotated[str | None, typer.Option(envvar="BEACON_READER_ROLE_ARN")] = None,
    writer_role_arn: Annotated[str | None, typer.Option(envvar="BEACON_WRITER_ROLE_ARN")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Why are my metrics missing? Verdicts with evidence and fixes, most likely first."""
    config = team_or_fail("doctor", team, as_json=as_json)
    session = session_or_fail("doctor", region=region, config=config, as_json=as_json)
    region = str(session.region_name)
    try:
        if bucket is None or reader_role_arn is None:
            outputs = stack_outputs(session.client("cloudformation"), names.stack_name(team, "artifacts"))
            bucket = bucket or outputs[outputs_of.BUCKET_NAME]
            reader_role_arn = reader_role_arn or outputs.get(outputs_of.READER_ROLE_ARN)
            writer_role_arn = writer_role_arn or outputs.get(outputs_of.WRITER_ROLE_ARN)
        sts = session.client("sts")
        reader = assume_role_credentials(sts, reader_role_arn, "beacon-doctor") if reader_role_arn else {}
        probe = None
        if writer_role_arn:
            try:
                probe = session.client("s3", **assume_role_credentials(sts, writer_role_arn, "beacon-doctor-probe"))
            except ClientError:
                probe = None  # the writer trusts only its workloads; the verdict says so
        result = diagnose(
            DoctorInputs(
                team=team,
                experiment=experiment,
                run=run,
                bucket=bucket,
                region=region,
                s3=session.client("s3", **reader),
                cloudwatch=session.client("cloudwatch", **reader),
                probe_s3=probe,
            )
        )
    except (ClientError, BotoCoreError) as error:
        why = describe_aws_error(error)
        raise fail("doctor", f"cannot read team {team!r} in {region}: {why}", as_json=as_json) from None
    except KeyError as error:
        why = f"stack output {error} is missing"
        raise fail("doctor", f"cannot read team {team!r} in {region}: {why}", as_json=as_json) from None
    if as_json:
        print(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        print_diagnosis(result)
    raise typer.Exit(0 if result.healthy else 1)
