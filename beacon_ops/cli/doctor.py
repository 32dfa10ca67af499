"""`beacon doctor`: why are my metrics missing? Verdicts with evidence and fixes, most likely first.

A Beacon run (`--run`) is diagnosed from its evidence and, when the team's cluster answers, from what the
orchestrator says about its Job (Beacon names the Job after the run). Any Kubernetes Job (`--job`) is
diagnosed from the orchestrator alone, unless its container carries a Beacon run's settings. With
`--target sagemaker` the orchestrator is SageMaker: `--job` names any training job of the team (its name has
the team's prefix), `--run` the run's job. Either way the job's container logs in CloudWatch Logs are read and
classified, as the team's reader role (it may read exactly those logs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, NoReturn

import boto3
import typer
from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError
from rich.table import Table

from beacon_ops.aws_access import AccessError, deployed_stack_outputs, describe_aws_error
from beacon_ops.cli.common import (
    DEFAULT_LOCAL_WORKDIR,
    REGION_HELP,
    Local,
    LocalWorkdir,
    console,
    fail,
    kept_or_fail,
    session_or_fail,
    team_or_fail,
)
from beacon_ops.cli.follow import KubernetesUrl, Where
from beacon_ops.credentials import assume_role_credentials
from beacon_ops.doctor.diagnosis import FAIL, OK, WARN, Diagnosis, DoctorInputs, diagnose, diagnose_job
from beacon_ops.doctor.eks_state import read_job
from beacon_ops.doctor.log_reader import eks_job_logs, read_log_verdicts, sagemaker_job_logs
from beacon_ops.doctor.orchestrator import OrchestratorState, pod_nodes
from beacon_ops.doctor.sagemaker_state import TrainingJobReading, newest_training_job, read_training_job
from beacon_ops.doctor.verdict import Verdict
from beacon_ops.jobs.eks import cluster_api
from beacon_ops.jobs.flow import JobError
from config import names
from stacks import outputs as outputs_of

STYLE = {OK: "green", WARN: "yellow", FAIL: "red"}


def print_diagnosis(result: Diagnosis) -> None:
    print(result.headline())  # the first line: the cause and its evidence, never wrapped
    if result.timeline:
        gap = "t = the run's last heartbeat, else its newest record" if result.experiment else "UTC"
        print(f"timeline ({gap}):")
        for line in result.timeline_lines():
            print(f"  {line}")
    subject = f"{result.experiment}/{result.run}" if result.experiment else f"job {result.run}"
    table = Table(title=f"beacon doctor: {subject} -> {result.diagnosis}")
    for column in ("check", "verdict", "evidence", "fix"):
        table.add_column(column, overflow="fold")
    for v in result.verdicts:
        table.add_row(v.check, f"[{STYLE.get(v.status, 'white')}]{v.verdict}[/]", v.evidence, v.fix)
    console.print(table)
    for note in result.orchestrator.notes if result.orchestrator else ():
        console.print(f"not read: {note}")


def read_orchestrator(
    session: boto3.session.Session, team: str, job: str, *, namespace: str | None, kubernetes_url: str | None
) -> OrchestratorState:
    """The Job as the team's cluster sees it; what stands in the way otherwise, as the state's problem."""
    stack = names.stack_name(team, "cluster")
    cluster, where = names.cluster_name(team), namespace or contract.TRAINING_NAMESPACE
    region = str(session.region_name)
    try:
        outputs = deployed_stack_outputs(session.client("cloudformation"), stack, region, team)
        cluster = outputs.get(outputs_of.CLUSTER_NAME, cluster)
        where = namespace or outputs.get(outputs_of.TRAINING_NAMESPACE, where)
    except (ClientError, BotoCoreError, AccessError) as error:
        problem = str(error) if isinstance(error, AccessError) else f"stack {stack}: {describe_aws_error(error)}"
        fix = f"deploy the team's cluster stack (make deploy TEAM={team}), or read the stack as a role that may"
        return OrchestratorState("eks", cluster, where, job, datetime.now(UTC), problem=problem, fix=fix)
    try:
        api = cluster_api(session, cluster, region, url_override=kubernetes_url)
    except (ClientError, BotoCoreError, JobError) as error:
        problem = str(error) if isinstance(error, JobError) else describe_aws_error(error)
        fix = "the doctor's identity needs eks:DescribeCluster and an access entry on the cluster"
        return OrchestratorState("eks", cluster, where, job, datetime.now(UTC), problem=problem, fix=fix)
    return read_job(api, cluster=cluster, namespace=where, name=job)


def reader_credentials(session: boto3.session.Session, team: str, reader_role_arn: str | None) -> dict[str, str]:
    """The team's reader role, which may read the team's job logs and training jobs; without a stack that names
    it, or a trust that admits the caller, the caller's own identity (the verdicts then say what it was refused)."""
    try:
        if reader_role_arn is None:
            stack = names.stack_name(team, "artifacts")
            outputs = deployed_stack_outputs(session.client("cloudformation"), stack, str(session.region_name), team)
            reader_role_arn = outputs.get(outputs_of.READER_ROLE_ARN)
        return (
            assume_role_credentials(session.client("sts"), reader_role_arn, "beacon-doctor") if reader_role_arn else {}
        )
    except (ClientError, BotoCoreError, AccessError):
        return {}


LogsAt = Callable[[datetime | None], tuple[Verdict, ...]]  # the job's log verdicts, given the gap in its metrics


def eks_logs(session: boto3.session.Session, reader: dict[str, str], state: OrchestratorState) -> LogsAt:
    job = state.job
    since = job.created_at if job is not None else None
    # Its pods, and gone ones its events name: another Job's pods may look alike (an Indexed `a` and a Job `a-2`)
    pods = frozenset([p.name for p in job.pods] + [e.name for e in job.events if e.kind == "Pod"] if job else [])
    group = names.container_log_group(state.cluster)
    placed = pod_nodes(list(job.pods), list(job.events)) if job else {}
    where = eks_job_logs(
        group=group, job_name=state.job_name, since=since, pods=pods, placed=placed, namespace=state.namespace
    )
    return lambda gap: tuple(read_log_verdicts(session.client("logs", **reader), where, gap=gap))


def read_sagemaker(
    session: boto3.session.Session, reader: dict[str, str], name: str
) -> tuple[TrainingJobReading, LogsAt]:
    """The training job as SageMaker describes it, and its logs' verdicts: as the reader, which may read the team's
    own jobs (`<team>-run-*`) alone; a job named otherwise (launched without Beacon), as the caller's own identity."""
    reading = read_training_job(session.client("sagemaker", **reader), name)
    if reader and reading.description is None and reading.verdict.verdict == "unreadable":
        reader = {}  # the caller's own identity, which may read what the reader may not
        reading = read_training_job(session.client("sagemaker"), name)
    where = sagemaker_job_logs(group=names.SAGEMAKER_LOG_GROUP, training_job_name=name)
    return reading, lambda gap: tuple(read_log_verdicts(session.client("logs", **reader), where, gap=gap))


def doctor(
    team: Annotated[str | None, typer.Option(envvar="BEACON_TEAM", help="team name (not with --local)")] = None,
    run: Annotated[str | None, typer.Option(envvar="BEACON_RUN_ID", help="a Beacon run id")] = None,
    job: Annotated[
        str | None, typer.Option(help="any Kubernetes Job on the team's cluster, with or without Beacon's library")
    ] = None,
    experiment: Annotated[
        str | None,
        typer.Option(envvar="BEACON_EXPERIMENT", help="default: smoke; with --local, the one the run was started in"),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="the Job's namespace (default: the stack's training namespace)")
    ] = None,
    bucket: Annotated[str | None, typer.Option(envvar="BEACON_BUCKET", help="default: the stack output")] = None,
    region: Annotated[str | None, typer.Option(help=REGION_HELP)] = None,
    reader_role_arn: Annotated[str | None, typer.Option(envvar="BEACON_READER_ROLE_ARN")] = None,
    writer_role_arn: Annotated[str | None, typer.Option(envvar="BEACON_WRITER_ROLE_ARN")] = None,
    kubernetes_url: KubernetesUrl = None,
    target: Annotated[
        Where, typer.Option(help="the job's orchestrator: eks (a Kubernetes Job) or sagemaker (a training job)")
    ] = Where.EKS,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    local: Local = False,
    workdir: LocalWorkdir = DEFAULT_LOCAL_WORKDIR,
) -> None:
    """Why are my metrics missing? Verdicts with evidence and fixes, most likely first."""
    if (run is None) == (job is None):
        raise fail("doctor", "give one of --run (a Beacon run) or --job (any Kubernetes Job)", as_json=as_json)
    for kind, value in (("run", run), ("experiment", experiment)):
        if value is not None:
            try:
                contract.validate_id(kind, value)
            except ValueError as error:
                raise fail("doctor", str(error), as_json=as_json) from None
    if local:
        doctor_local(workdir, experiment=experiment, run=run, as_json=as_json)
    experiment = experiment or "smoke"
    if team is None:
        raise fail("doctor", "Missing option '--team' (or --local, for a run of beacon local)", as_json=as_json)
    training_job_name = job
    run_jobs: list[str] = []
    if target is Where.SAGEMAKER and run is not None:
        try:
            run_jobs = names.training_job_names(team, run)
        except ValueError as error:
            raise fail("doctor", f"--run: {error}", as_json=as_json) from None
    config = team_or_fail("doctor", team, as_json=as_json)
    session = session_or_fail("doctor", region=region, config=config, as_json=as_json)
    region = str(session.region_name)
    reader = reader_credentials(session, team, reader_role_arn)
    state: OrchestratorState | None = None
    training_job: TrainingJobReading | None = None
    platform: OrchestratorState | TrainingJobReading
    if target is Where.SAGEMAKER:
        if run_jobs:  # the run's newest job: a rerun has a name of its own
            training_job_name = newest_training_job(session.client("sagemaker", **reader), run_jobs)
        assert training_job_name is not None
        training_job, logs = read_sagemaker(session, reader, training_job_name)
        beacon_run, platform = training_job.beacon, training_job
    else:
        state = read_orchestrator(session, team, job or str(run), namespace=namespace, kubernetes_url=kubernetes_url)
        logs = eks_logs(session, reader, state)
        beacon_run, platform = (state.job.beacon if state.job is not None else {}), state
    if job is not None:
        # A job that carries a Beacon run's settings gets the whole diagnosis of that run
        if beacon_run.get("BEACON_RUN_ID") and beacon_run.get("BEACON_TEAM", team) == team:
            run, experiment = beacon_run["BEACON_RUN_ID"], beacon_run.get("BEACON_EXPERIMENT", experiment)
        else:
            show(diagnose_job(team, platform, logs=logs(None)), as_json=as_json)
    assert run is not None
    try:
        if bucket is None or reader_role_arn is None:
            stack = names.stack_name(team, "artifacts")
            outputs = deployed_stack_outputs(session.client("cloudformation"), stack, region, team)
            bucket = bucket or outputs[outputs_of.BUCKET_NAME]
            reader_role_arn = reader_role_arn or outputs.get(outputs_of.READER_ROLE_ARN)
            writer_role_arn = writer_role_arn or outputs.get(outputs_of.WRITER_ROLE_ARN)
        sts = session.client("sts")
        if reader_role_arn and not reader:
            reader = assume_role_credentials(sts, reader_role_arn, "beacon-doctor")  # fails the command: say why
        probe, probe_unavailable = None, ""
        if writer_role_arn:
            try:
                probe = session.client("s3", **assume_role_credentials(sts, writer_role_arn, "beacon-doctor-probe"))
            except ClientError as error:  # the writer trusts only its workloads; the verdict says so
                code = error.response.get("Error", {}).get("Code", "")
                probe_unavailable = f"the writer role {writer_role_arn} cannot be assumed from here ({code})"
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
                probe_unavailable=probe_unavailable,
                orchestrator=state,
                training_job=training_job,
                read_logs=logs,
                prices=config.prices.table(),
            )
        )
    except (ClientError, BotoCoreError) as error:
        why = describe_aws_error(error)
        raise fail("doctor", f"cannot read team {team!r} in {region}: {why}", as_json=as_json) from None
    except AccessError as error:
        raise fail("doctor", str(error), as_json=as_json) from None
    except KeyError as error:
        why = f"stack output {error} is missing"
        raise fail("doctor", f"cannot read team {team!r} in {region}: {why}", as_json=as_json) from None
    show(result, as_json=as_json)


def doctor_local(workdir: Path, *, experiment: str | None, run: str | None, as_json: bool) -> NoReturn:
    """A run of `beacon local --keep -- <command>`: its embedded AWS and identities from the work directory."""
    from beacon_ops.local.own_command import doctor_inputs

    kept = kept_or_fail("doctor", workdir, as_json=as_json)
    if run is None:
        raise fail("doctor", "--local: give --run", as_json=as_json)
    experiment = experiment or kept.runs.get(run, "default")  # `beacon local` remembers where each run wrote
    show(diagnose(doctor_inputs(kept, experiment=experiment, run=run)), as_json=as_json)


def show(result: Diagnosis, *, as_json: bool) -> NoReturn:
    if as_json:
        print(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        print_diagnosis(result)
    raise typer.Exit(0 if result.healthy else 1)
