"""`beacon smoke`: after `cdk deploy`, run a fresh smoke job on the team's stack and prove nothing was lost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from beacon_ops.cli.common import REGION_HELP, session_or_fail, team_or_fail
from beacon_ops.cli.follow import (
    AsJson,
    KubernetesUrl,
    PollInterval,
    StartTimeout,
    Where,
    finish,
    live_line,
    make_target,
)


def smoke(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name (config/teams/<team>.toml)")],
    target: Annotated[Where, typer.Option(envvar="BEACON_SMOKE_TARGET", help="where the job runs")] = Where.EKS,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    report_path: Annotated[Path, typer.Option("--report", envvar="BEACON_SMOKE_REPORT", help="JSON report")] = Path(
        ".beacon/smoke/report.json"
    ),
    kubernetes_url: KubernetesUrl = None,
    start_timeout: StartTimeout = 900,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="seconds for the whole run (default: eks 1800, sagemaker max run + 900)")
    ] = None,
    keep: Annotated[bool, typer.Option(help="leave the Job on the cluster for inspection (eks)")] = False,
    poll_interval: PollInterval = 5.0,
    as_json: AsJson = False,
) -> None:
    """After `cdk deploy`: run a fresh smoke job on the team's stack and prove nothing was lost."""
    from beacon_ops.jobs.flow import Access, fresh_spec, read_outputs, run_smoke

    config = team_or_fail("smoke", team, as_json=as_json)
    session = session_or_fail("smoke", region=region, config=config, as_json=as_json)
    region = str(session.region_name)
    with live_line("smoke", team, region, as_json=as_json) as show:
        outputs = read_outputs(session.client("cloudformation"), team, region)
        access = Access.open(session, outputs.reader_role_arn)
        where = make_target(
            target,
            access=access,
            outputs=outputs,
            config=config,
            kubernetes_url=kubernetes_url,
            start_timeout=start_timeout,
            timeout=timeout,
            keep=keep,
            poll_interval=poll_interval,
        )
        report = run_smoke(where, access, outputs, fresh_spec(config, outputs), show=show)
    finish(report, report_path, as_json=as_json)
