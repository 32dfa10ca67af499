"""`beacon smoke`: after `cdk deploy`, run a fresh smoke job on the team's stack and prove nothing was lost."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from beacon_ops.aws_access import describe_aws_error
from beacon_ops.cli.common import REGION_HELP, console, fail, session_or_fail, team_or_fail
from beacon_ops.smoke.flow import SmokeReport


class Where(StrEnum):
    EKS = "eks"
    SAGEMAKER = "sagemaker"


def print_smoke(report: SmokeReport, path: Path) -> None:
    v = report.verification
    verdict = "[green]passed[/]" if report.ok else "[red]FAILED[/]"
    table = Table(title=f"beacon smoke --target {report.target}: {report.team}/{report.run} {verdict}")
    table.add_column("check")
    table.add_column("result", overflow="fold")
    table.add_row("platform", f"{report.platform_state}: {report.platform_detail}")
    if v is not None:
        versions = sorted(set(v.chunk_versions.values()))
        table.add_row(
            "records in S3",
            f"{v.records_in_s3} of {v.steps_expected} (lost {v.records_lost}, "
            f"duplicated {v.records_duplicated}, superseded by a restart {v.records_superseded}), "
            f"writer ranks {v.writer_ranks}",
        )
        table.add_row("versioning", f"bucket {v.bucket_versioning}; versions per chunk {versions}")
        table.add_row("checkpoints", str(v.checkpoints))
        table.add_row("metrics", f"present {v.metrics_present}; missing {v.metrics_missing or 'none'}")
        table.add_row("alarms (evaluated)", ", ".join(f"{k}={s}" for k, s in sorted(v.alarms.items())))
        table.add_row("run finished", str(v.succeeded))
    table.add_row("alarms (CloudWatch)", ", ".join(f"{k}={s}" for k, s in sorted(report.alarms_observed.items())))
    for problem in report.problems:
        table.add_row("[red]problem[/]", problem)
    table.add_row("cleaned up", str(report.cleaned_up))
    table.add_row("wall seconds", f"{report.wall_seconds:.0f}")
    console.print(table)
    for verdict_row in report.doctor if not report.ok else []:
        console.print(f"doctor {verdict_row['check']}: {verdict_row['verdict']} — {verdict_row['evidence']}")
    for source, text in report.logs.items():
        tail = "\n".join(text.splitlines()[-20:])
        console.print(f"[bold]log {source}[/] (last lines)\n{tail}", markup=True, highlight=False)
    console.print(f"report: {path}")


def smoke(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name (config/teams/<team>.toml)")],
    target: Annotated[Where, typer.Option(envvar="BEACON_SMOKE_TARGET", help="where the job runs")] = Where.EKS,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    report_path: Annotated[Path, typer.Option("--report", envvar="BEACON_SMOKE_REPORT", help="JSON report")] = Path(
        ".beacon/smoke/report.json"
    ),
    kubernetes_url: Annotated[
        str | None,
        typer.Option(envvar="BEACON_KUBERNETES_URL", help="API URL through a tunnel (default: the EKS endpoint)"),
    ] = None,
    start_timeout: Annotated[float, typer.Option(min=1, help="seconds for a pod to become ready (eks)")] = 900,
    timeout: Annotated[
        float | None, typer.Option(min=1, help="seconds for the whole run (default: eks 1800, sagemaker max run + 900)")
    ] = None,
    keep: Annotated[bool, typer.Option(help="leave the Job on the cluster for inspection (eks)")] = False,
    poll_interval: Annotated[float, typer.Option(min=0.1, hidden=True)] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """After `cdk deploy`: run a fresh smoke job on the team's stack and prove nothing was lost."""
    from beacon_ops.smoke.flow import Access, SmokeError, Target, fresh_spec, read_outputs, run_smoke

    config = team_or_fail("smoke", team, as_json=as_json)
    session = session_or_fail("smoke", region=region, config=config, as_json=as_json)
    region = str(session.region_name)

    def show(line: str) -> None:
        status.update(line)
        if not sys.stdout.isatty():
            console.log(line)

    try:
        with console.status(f"beacon smoke: reading the stacks of {team} in {region}") as status:
            outputs = read_outputs(session.client("cloudformation"), team, region)
            access = Access.open(session, outputs.reader_role_arn)
            where: Target
            if target is Where.EKS:
                from beacon_ops.smoke.eks import EksTarget

                where = EksTarget(
                    access=access,
                    outputs=outputs,
                    kubernetes_url=kubernetes_url,
                    start_timeout_s=start_timeout,
                    timeout_s=timeout or 1800,
                    keep=keep,
                    poll_interval_s=poll_interval,
                )
            else:
                from beacon_ops.smoke.sagemaker import SageMakerTarget

                where = SageMakerTarget(
                    access=access, outputs=outputs, config=config, timeout_s=timeout, poll_interval_s=poll_interval
                )
            report = run_smoke(where, access, outputs, fresh_spec(config, outputs), show=show)
    except SmokeError as error:
        raise fail("smoke", str(error), as_json=as_json) from None
    except (ClientError, BotoCoreError) as error:
        raise fail("smoke", f"{describe_aws_error(error)} (region {region})", as_json=as_json) from None
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(json.dumps(report.as_dict(), indent=2, default=str))
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print_smoke(report, report_path)
    raise typer.Exit(0 if report.ok else 1)
