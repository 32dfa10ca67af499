"""`beacon`: the operator's command. Every option can also come from the environment."""

from __future__ import annotations

import json
import os
import signal
import sys
from enum import StrEnum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import boto3
import typer
from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError
from rich.console import Console
from rich.table import Table

# typer 0.29 vendors click; its exceptions are not the `click` package's (typer is pinned).
from typer._click.exceptions import NoArgsIsHelpError, UsageError

from beacon_ops.aws_access import AccessError, describe_aws_error, open_session
from beacon_ops.credentials import assume_role_credentials
from beacon_ops.doctor import FAIL, OK, WARN, Diagnosis, DoctorInputs, diagnose
from beacon_ops.smoke import SmokeReport
from config import ConfigError, TeamConfig, load_team
from stacks import outputs as outputs_of


def identifier(kind: str) -> Any:
    def check(value: str) -> str:
        try:
            return contract.validate_id(kind, value)
        except ValueError as error:
            raise typer.BadParameter(str(error)) from None

    return check


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Beacon: training that is never lost in the cloud.",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
    rich_markup_mode=None,  # plain help wraps long lines instead of cutting them at 80 columns
)
REGION_HELP = "AWS region (default: the team file's region, then AWS_REGION)"


def fail(command: str, message: str, *, as_json: bool = False) -> typer.Exit:
    """The command cannot start: one line on stderr (and a JSON object on stdout with --json), exit 2."""
    print(f"beacon {command}: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps({"command": command, "ok": False, "exit_code": 2, "error": message}))
    return typer.Exit(2)


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


def show_version(value: bool) -> None:
    if value:
        try:
            print(f"beacon {version('beacon')}")
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


console = Console(width=None if sys.stdout.isatty() else 160, log_path=False)
STYLE = {OK: "green", WARN: "yellow", FAIL: "red"}


def print_diagnosis(result: Diagnosis) -> None:
    table = Table(title=f"beacon doctor: {result.experiment}/{result.run} -> {result.diagnosis}")
    for column in ("check", "verdict", "evidence", "fix"):
        table.add_column(column, overflow="fold")
    for v in result.verdicts:
        table.add_row(v.check, f"[{STYLE.get(v.status, 'white')}]{v.verdict}[/]", v.evidence, v.fix)
    console.print(table)


def stack_outputs(cloudformation: Any, stack: str) -> dict[str, str]:
    answer = cloudformation.describe_stacks(StackName=stack)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in answer.get("Outputs", [])}


@app.command()
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
            outputs = stack_outputs(session.client("cloudformation"), contract.stack_name(team, "artifacts"))
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


@app.command()
def tensorboard(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name")],
    run: Annotated[str, typer.Option(envvar="BEACON_RUN_ID", help="run id", callback=identifier("run"))],
    experiment: Annotated[str, typer.Option(envvar="BEACON_EXPERIMENT", callback=identifier("experiment"))] = "smoke",
    port: Annotated[int, typer.Option(min=1, max=65535, help="TensorBoard's port on localhost")] = 6006,
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="where the files go (default: .beacon/tensorboard/<team>/<experiment>/<run>)"),
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve/--no-serve", help="--no-serve: download only, and print the directory")
    ] = True,
    bucket: Annotated[str | None, typer.Option(envvar="BEACON_BUCKET", help="default: the stack output")] = None,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    reader_role_arn: Annotated[str | None, typer.Option(envvar="BEACON_READER_ROLE_ARN")] = None,
) -> None:
    """A run's TensorBoard files from S3 into a local directory, then TensorBoard on them."""
    from beacon_ops.tensorboard import TensorBoardError, default_directory, fetch_run
    from beacon_ops.tensorboard import serve as serve_tensorboard

    config = team_or_fail("tensorboard", team, as_json=False)
    session = session_or_fail("tensorboard", region=region, config=config, as_json=False)
    region = str(session.region_name)
    target = directory or default_directory(team, experiment, run)
    try:
        if bucket is None or reader_role_arn is None:
            outputs = stack_outputs(session.client("cloudformation"), contract.stack_name(team, "artifacts"))
            bucket = bucket or outputs[outputs_of.BUCKET_NAME]
            reader_role_arn = reader_role_arn or outputs.get(outputs_of.READER_ROLE_ARN)
        sts = session.client("sts")
        reader = assume_role_credentials(sts, reader_role_arn, "beacon-tensorboard") if reader_role_arn else {}
        fetched = fetch_run(
            session.client("s3", **reader), bucket=bucket, experiment=experiment, run=run, directory=target
        )
    except TensorBoardError as error:
        raise fail("tensorboard", str(error)) from None
    except (ClientError, BotoCoreError) as error:
        why = describe_aws_error(error)
        raise fail("tensorboard", f"cannot read team {team!r} in {region}: {why}") from None
    except KeyError as error:
        raise fail("tensorboard", f"cannot read team {team!r} in {region}: stack output {error} is missing") from None
    except OSError as error:
        raise fail("tensorboard", f"--dir {target}: {error.strerror or error}") from None
    print(
        f"beacon tensorboard: {len(fetched.files)} files ({fetched.downloaded} new) from {fetched.source} "
        f"in {fetched.directory}",
        file=sys.stderr,
    )
    if not serve:
        print(fetched.directory)
        raise typer.Exit(0)
    print(f"beacon tensorboard: serving at http://localhost:{port}/ (Ctrl-C stops it)", file=sys.stderr)
    try:
        raise typer.Exit(serve_tensorboard(fetched.directory, port))
    except TensorBoardError as error:
        raise fail("tensorboard", str(error)) from None


class Target(StrEnum):
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


@app.command()
def smoke(
    team: Annotated[str, typer.Option(envvar="BEACON_TEAM", help="team name (config/teams/<team>.toml)")],
    target: Annotated[Target, typer.Option(envvar="BEACON_SMOKE_TARGET", help="where the job runs")] = Target.EKS,
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
    from beacon_ops.smoke import Access, SmokeError, read_outputs

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
            if target is Target.EKS:
                from beacon_ops.smoke_eks import run_eks_smoke

                report = run_eks_smoke(
                    access,
                    outputs,
                    config,
                    kubernetes_url=kubernetes_url,
                    start_timeout_s=start_timeout,
                    timeout_s=timeout or 1800,
                    keep=keep,
                    show=show,
                    poll_interval_s=poll_interval,
                )
            else:
                from beacon_ops.smoke_sagemaker import run_sagemaker_smoke

                report = run_sagemaker_smoke(
                    access, outputs, config, timeout_s=timeout, show=show, poll_interval_s=poll_interval
                )
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


@app.command()
def local(
    workdir: Annotated[Path, typer.Option(envvar="BEACON_DEMO_DIR")] = Path(".beacon/demo"),
    steps: Annotated[int, typer.Option(min=1)] = 200,
    ranks: Annotated[int, typer.Option(min=1, max=4)] = 2,
) -> None:
    """The whole flow on an embedded AWS (moto): no account needed. What `make demo` runs."""
    from beacon_ops.local import run_local

    with console.status("beacon local") as status:

        def log(line: str) -> None:
            status.update(line)
            console.log(line)

        report = run_local(workdir, steps=steps, ranks=ranks, log=log)
    data = report.as_dict()
    table = Table(title=f"beacon local: run {report.run} ({data['wall_seconds']} s)")
    table.add_column("what")
    table.add_column("result", overflow="fold")
    for key in (
        "steps",
        "ranks",
        "records_written",
        "records_in_s3",
        "records_lost",
        "records_duplicated",
        "writer_ranks",
        "checkpoints",
        "cloudwatch_datapoints",
        "doctor",
    ):
        table.add_row(key, str(data[key]))
    for name, state in sorted(data["alarms"].items()):
        table.add_row(f"alarm {name}", state)
    for name, scenario in data["scenarios"].items():
        table.add_row(
            f"scenario {name}", f"{scenario['verdict']} in {scenario['seconds_to_verdict']} s — {scenario['detail']}"
        )
    console.print(table)
    console.print(f"report: {workdir / 'report.json'}   picture: {data['picture']}")
    expected = {
        "permission": "permission",
        "frozen-doctor": "silent",
        "frozen-alarm": "ALARM",
        "tmpfs-spool": "refused",
    }
    scenarios_ok = all(data["scenarios"][k]["verdict"] == v for k, v in expected.items())
    silent_in_budget = data["scenarios"]["frozen-alarm"]["seconds_to_verdict"] <= 120
    good = report.verification.ok and report.doctor.healthy and scenarios_ok and silent_in_budget
    if not good:
        print("beacon local: the demo did not hold; see the table and report.json", file=sys.stderr)
    raise typer.Exit(0 if good else 1)


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
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        sys.exit(130)
    if TERMINATED_BY:  # typer reports any interrupt as 130; a signal's own code is 128 + its number
        sys.exit(128 + TERMINATED_BY[0])
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
