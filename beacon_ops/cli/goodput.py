"""`beacon goodput`: where a run's instance-hours went, read as the team's reader from the run's evidence in S3
(`beacon_ops.evidence.goodput`): a table of the ledger's categories, a bar per attempt, and dollars where the run's
instance type is recorded; `--json` for the same as one object."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.aws_access import describe_aws_error
from beacon_ops.cli.common import (
    DEFAULT_LOCAL_WORKDIR,
    Local,
    LocalWorkdir,
    ReaderBucket,
    ReaderExperiment,
    ReaderRegion,
    ReaderRoleArn,
    ReaderTeam,
    RunId,
    fail,
    kept_or_fail,
    team_reader_or_fail,
)
from beacon_ops.evidence.goodput import GoodputReport, goodput_report
from beacon_ops.evidence.reading import read_run


def goodput(
    run: RunId,
    team: ReaderTeam = None,
    experiment: ReaderExperiment = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object on stdout")] = False,
    bucket: ReaderBucket = None,
    region: ReaderRegion = None,
    reader_role_arn: ReaderRoleArn = None,
    local: Local = False,
    workdir: LocalWorkdir = DEFAULT_LOCAL_WORKDIR,
) -> None:
    """Where a run's instance-hours went: productive steps, start, setup, checkpoints, evaluation, hangs, wasted
    progress, restart gaps, and what no evidence covers, in hours and dollars.

    Exit codes: 0 the ledger was read; 2 bad input, or the run cannot be read."""
    if local:
        from beacon_ops.local.demo import TEAM

        kept = kept_or_fail("goodput", workdir, as_json=as_json)
        experiment = experiment or kept.runs.get(run, "default")
        s3, bucket, where = kept.client("s3", kept.reader), kept.bucket, f"the embedded AWS at {kept.url}"
        team, prices = TEAM, {}
    elif team is None:
        raise fail("goodput", "Missing option '--team' (or --local, for a run of beacon local)", as_json=as_json)
    else:
        experiment = experiment or "smoke"
        s3, bucket, where, config = team_reader_or_fail(
            "goodput", team, region=region, bucket=bucket, reader_role_arn=reader_role_arn, as_json=as_json
        )
        prices = config.prices.table()
    try:
        evidence = read_run(s3, bucket, experiment, run)
    except (ClientError, BotoCoreError) as error:
        raise fail("goodput", f"cannot read {where}: {describe_aws_error(error)}", as_json=as_json) from None
    if not evidence.records:
        raise fail("goodput", f"run {run!r} of experiment {experiment!r} has no records in s3://{bucket} (has it "
                   f"recorded a step? `beacon doctor --run {run} --experiment {experiment}` says why not)",
                   as_json=as_json)  # fmt: skip
    show(goodput_report(evidence, prices=prices), team=team, as_json=as_json)


def show(report: GoodputReport, *, team: str, as_json: bool) -> None:
    if as_json:
        answer: dict[str, Any] = {"command": "goodput", "ok": True, "team": team, **report.as_dict()}
        print(json.dumps(answer))
        return
    print("\n".join(report.lines()))
