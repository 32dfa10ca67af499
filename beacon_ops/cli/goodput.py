"""`beacon goodput`: where a run's instance-hours went, read as the team's reader from the run's evidence in S3
(`beacon_ops.evidence.goodput`): a table of the ledger's categories, a bar per attempt, and dollars where the run's
instance type is recorded; `--json` for the same as one object."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
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
    fail,
    identifier,
    kept_or_fail,
    team_reader_or_fail,
)
from beacon_ops.evidence.goodput import GoodputReport, PeriodReport, goodput_report, runs_since
from beacon_ops.evidence.reading import read_run

SINCE = re.compile(r"([1-9][0-9]*)([dhm])")
UNIT_S = {"d": 86400, "h": 3600, "m": 60}


def goodput(
    run: Annotated[
        str | None, typer.Option(envvar="BEACON_RUN_ID", help="run id (or --since)", callback=identifier("run"))
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="every run started in this period, the worst first: 30d, 12h, 90m")
    ] = None,
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
    if (run is None) == (since is None):
        raise fail("goodput", "give one of --run (one run) or --since (a period, e.g. 30d)", as_json=as_json)
    if since is not None and experiment is not None:
        raise fail("goodput", "--experiment goes with --run: --since takes every experiment's runs", as_json=as_json)
    period = SINCE.fullmatch(since or "1d")
    if period is None:
        raise fail("goodput", f"--since {since!r}: a number and d, h or m (30d, 12h, 90m)", as_json=as_json)
    if local:
        from beacon_ops.local.demo import TEAM

        kept = kept_or_fail("goodput", workdir, as_json=as_json)
        experiment = experiment or kept.runs.get(run or "", "default")
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
    if since is not None:
        start = datetime.now(UTC) - timedelta(seconds=int(period[1]) * UNIT_S[period[2]])
        show_period(s3, bucket, where, start, prices=prices, team=team, as_json=as_json)
        return
    assert run is not None
    try:
        evidence = read_run(s3, bucket, experiment, run)
    except (ClientError, BotoCoreError) as error:
        raise fail("goodput", f"cannot read {where}: {describe_aws_error(error)}", as_json=as_json) from None
    if not evidence.records:
        raise fail("goodput", f"run {run!r} of experiment {experiment!r} has no records in s3://{bucket} (has it "
                   f"recorded a step? `beacon doctor --run {run} --experiment {experiment}` says why not)",
                   as_json=as_json)  # fmt: skip
    show(goodput_report(evidence, prices=prices), team=team, as_json=as_json)


def show_period(
    s3: Any, bucket: str, where: str, start: datetime, *, prices: dict[str, dict[str, float]], team: str, as_json: bool
) -> None:
    try:
        runs, undated = runs_since(s3, bucket, start)
        reports = [goodput_report(read_run(s3, bucket, experiment, run), prices=prices) for experiment, run in runs]
    except (ClientError, BotoCoreError) as error:
        raise fail("goodput", f"cannot read {where}: {describe_aws_error(error)}", as_json=as_json) from None
    recorded = [r for r in reports if r.book.total > 0]
    period = PeriodReport(start, recorded, undated, without_records=len(reports) - len(recorded))
    if as_json:
        print(json.dumps({"command": "goodput", "ok": True, "team": team, **period.as_dict()}))
        return
    print("\n".join(period.lines()))


def show(report: GoodputReport, *, team: str, as_json: bool) -> None:
    if as_json:
        answer: dict[str, Any] = {"command": "goodput", "ok": True, "team": team, **report.as_dict()}
        print(json.dumps(answer))
        return
    print("\n".join(report.lines()))
