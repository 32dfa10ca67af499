"""What `beacon smoke` and `beacon run` share: the target, the live line, the report and the verdict."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from beacon_ops.aws_access import describe_aws_error
from beacon_ops.cli.common import console, fail
from config import TeamConfig

if TYPE_CHECKING:
    from beacon_ops.jobs.flow import Access, JobReport, Show, Target, TeamOutputs


class Where(StrEnum):
    EKS = "eks"
    SAGEMAKER = "sagemaker"


# The options both commands take, alike.
KubernetesUrl = Annotated[
    str | None,
    typer.Option(envvar="BEACON_KUBERNETES_URL", help="API URL through a tunnel (default: the EKS endpoint)"),
]
StartTimeout = Annotated[float, typer.Option(min=1, help="seconds for a pod to become ready (eks)")]
PollInterval = Annotated[float, typer.Option(min=0.1, hidden=True)]
AsJson = Annotated[bool, typer.Option("--json", help="print the report as JSON")]


def records_row(report: JobReport) -> str:
    v = report.verification
    assert v is not None
    of = f"{v.steps_expected}" if v.steps_expected is not None else f"{v.records_numbered} the job numbered"
    return (
        f"{v.records_in_s3} of {of} (lost {v.records_lost}, "
        f"duplicated {v.records_duplicated}, superseded by a restart {v.records_superseded}), "
        f"writer ranks {v.writer_ranks}"
    )


def print_report(report: JobReport, path: Path) -> None:
    v = report.verification
    verdict = "[green]passed[/]" if report.ok else "[red]FAILED[/]"
    title = f"beacon {report.command} --target {report.target}: {report.team}/{report.run} {verdict}"
    table = Table(title=title)
    table.add_column("check")
    table.add_column("result", overflow="fold")
    table.add_row("platform", f"{report.platform_state}: {report.platform_detail}")
    if v is not None:
        versions = sorted(set(v.chunk_versions.values()))
        table.add_row("records in S3", records_row(report))
        if v.steps_expected is None:
            table.add_row("last step", f"in S3 {v.last_step_in_s3}; the job's final state says {v.last_step_final}")
        table.add_row("versioning", f"bucket {v.bucket_versioning}; versions per chunk {versions}")
        table.add_row("checkpoints", f"{v.checkpoints}{'' if v.checkpoint_required else ' (not required)'}")
        table.add_row("metrics", f"present {v.metrics_present}; missing {v.metrics_missing or 'none'}")
        table.add_row("alarms (evaluated)", ", ".join(f"{k}={s}" for k, s in sorted(v.alarms.items())))
        table.add_row("run finished", str(v.succeeded))
    table.add_row("alarms (CloudWatch)", ", ".join(f"{k}={s}" for k, s in sorted(report.alarms_observed.items())))
    for problem in report.problems:
        table.add_row("[red]problem[/]", problem)
    table.add_row(
        "cleaned up", str(report.cleaned_up) + (f" ({report.launched['left']})" if "left" in report.launched else "")
    )
    table.add_row("wall seconds", f"{report.wall_seconds:.0f}")
    console.print(table)
    for verdict_row in report.doctor if not report.ok else []:
        console.print(f"doctor {verdict_row['check']}: {verdict_row['verdict']} — {verdict_row['evidence']}")
    for source, text in report.logs.items():
        tail = "\n".join(text.splitlines()[-20:])
        console.print(f"[bold]log {source}[/] (last lines)\n{tail}", markup=True, highlight=False)
    console.print(f"report: {path}")


def make_target(
    where: Where,
    *,
    access: Access,
    outputs: TeamOutputs,
    config: TeamConfig,
    kubernetes_url: str | None,
    start_timeout: float,
    timeout: float | None,
    keep: bool,
    poll_interval: float,
    keep_ended: bool = False,
) -> Target:
    if where is Where.EKS:
        from beacon_ops.jobs.eks import EksTarget

        return EksTarget(
            access=access,
            outputs=outputs,
            kubernetes_url=kubernetes_url,
            start_timeout_s=start_timeout,
            timeout_s=timeout or 1800,
            keep=keep,
            keep_ended=keep_ended,
            poll_interval_s=poll_interval,
        )
    from beacon_ops.jobs.sagemaker import SageMakerTarget

    return SageMakerTarget(
        access=access,
        outputs=outputs,
        config=config,
        timeout_s=timeout,
        poll_interval_s=poll_interval,
    )


@contextmanager
def live_line(command: str, team: str, region: str, *, as_json: bool) -> Iterator[Show]:
    """The status line while the job runs (and a log line each when not on a terminal); the flow's
    one-line errors become the command's exit 2."""
    from beacon_ops.jobs.flow import JobError

    try:
        with console.status(f"beacon {command}: reading the stacks of {team} in {region}") as status:

            def show(line: str) -> None:
                status.update(line)
                if not sys.stdout.isatty():
                    console.log(line)

            yield show
    except JobError as error:
        raise fail(command, str(error), as_json=as_json) from None
    except (ClientError, BotoCoreError) as error:
        raise fail(command, f"{describe_aws_error(error)} (region {region})", as_json=as_json) from None


def finish(report: JobReport, path: Path, *, as_json: bool) -> NoReturn:
    """The report written and shown; exit 0 only when the run was proved."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_dict(), indent=2, default=str))
    if as_json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print_report(report, path)
    raise typer.Exit(0 if report.ok else 1)
