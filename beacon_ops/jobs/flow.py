"""A job on a team's deployed stack, launched, followed and proved: `beacon smoke` and `beacon run`.

One flow, run_job(target, access, outputs, job, expected): the targets (EKS, SageMaker) differ only in
how the job is launched, watched, its logs collected and cleaned up (the Target protocol). Reading the
stack outputs, watching delivery to S3, reading the run once for verification and the doctor, and the
report are here. The job is any training job (`workloads.manifests.TrainingJobSpec`: an image and a
command); the bundled smoke job is one (`run_smoke`), a team's own job another (`beacon_ops.jobs.team`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import boto3
from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.aws_access import AccessError, deployed_stack_outputs
from beacon_ops.credentials import assume_role_credentials
from beacon_ops.doctor.after_run import verify_and_diagnose
from beacon_ops.doctor.diagnosis import DoctorInputs
from beacon_ops.evidence.alarms import ALARM, AlarmSet
from beacon_ops.evidence.reading import Delivery, MetricsReadOnce
from beacon_ops.evidence.verify import Expected, Verification
from config import TeamConfig, names
from stacks import outputs as outputs_of
from workloads.manifests import SmokeJobSpec, TrainingJobSpec, smoke_job_spec

SHOW_EVERY_S = 5.0
Show = Callable[[str], None]


class JobError(Exception):
    """A one-line reason the job cannot start or go on; it names the resource or the setting."""


@dataclass(frozen=True)
class TeamOutputs:
    team: str
    region: str
    bucket: str
    writer_role_arn: str
    reader_role_arn: str
    kms_key_arn: str
    cluster_name: str
    namespace: str
    image_uri: str  # the bundled smoke image
    image_repository_uri: str  # the team's own images (ECR)
    alarm_topic_arn: str
    run_alarm_parameter: str
    team_alarm_names: tuple[str, ...]


def _stack_outputs(cloudformation: Any, stack: str, region: str, team: str) -> dict[str, str]:
    try:
        return deployed_stack_outputs(cloudformation, stack, region, team)
    except AccessError as error:
        raise JobError(str(error)) from None


def read_outputs(cloudformation: Any, team: str, region: str) -> TeamOutputs:
    """The team's stack outputs, or a JobError naming the stack and the output that is missing."""
    values: dict[str, dict[str, str]] = {}
    for component, keys in outputs_of.OPERATOR_NEEDS.items():
        stack = names.stack_name(team, component)
        outputs = _stack_outputs(cloudformation, stack, region, team)
        missing = [key for key in keys if key not in outputs]
        if missing:
            raise JobError(f"stack {stack}: output {missing[0]} is missing; redeploy it with this version of Beacon")
        values[component] = outputs
    artifacts, cluster, monitoring = values["artifacts"], values["cluster"], values["monitoring"]
    return TeamOutputs(
        team=team,
        region=region,
        bucket=artifacts[outputs_of.BUCKET_NAME],
        writer_role_arn=artifacts[outputs_of.WRITER_ROLE_ARN],
        reader_role_arn=artifacts[outputs_of.READER_ROLE_ARN],
        kms_key_arn=artifacts[outputs_of.KMS_KEY_ARN],
        cluster_name=cluster[outputs_of.CLUSTER_NAME],
        namespace=cluster[outputs_of.TRAINING_NAMESPACE],
        image_uri=cluster[outputs_of.SMOKE_IMAGE_URI],
        image_repository_uri=artifacts[outputs_of.IMAGE_REPOSITORY_URI],
        alarm_topic_arn=monitoring[outputs_of.ALARM_TOPIC_ARN],
        run_alarm_parameter=monitoring[outputs_of.RUN_ALARM_TEMPLATE_PARAMETER],
        team_alarm_names=tuple(
            v for k, v in sorted(monitoring.items()) if k.endswith(outputs_of.TEAM_ALARM_OUTPUT_SUFFIX)
        ),
    )


@dataclass
class Access:
    """The operator's session (control plane) and the team's reader role (what the run left)."""

    operator: boto3.session.Session
    reader: dict[str, str]

    @classmethod
    def open(cls, operator: boto3.session.Session, reader_role_arn: str) -> Access:
        try:
            return cls(operator, assume_role_credentials(operator.client("sts"), reader_role_arn, "beacon-smoke"))
        except (ClientError, BotoCoreError) as error:
            raise JobError(f"cannot assume the reader role {reader_role_arn}: {error}") from None

    def client(self, service: str) -> Any:
        return self.operator.client(service)

    def as_reader(self, service: str) -> Any:
        return self.operator.client(service, **self.reader)


def wait_for_final_status(delivery: Delivery, *, grace_s: float, interval_s: float = 2.0) -> bool:
    """The platform says the job ended; its last writes are at most a moment behind."""
    deadline = time.monotonic() + grace_s
    while not delivery.poll().finished and time.monotonic() < deadline:
        time.sleep(interval_s)
    return delivery.finished


def run_alarm_names(team: str, experiment: str, run: str) -> list[str]:
    return [contract.run_alarm_name(team, experiment, run, kind) for kind in contract.RunAlarm]


def alarm_set(access: Access, outputs: TeamOutputs, experiment: str, run: str) -> AlarmSet:
    """The team's alarms as deployed, plus this run's alarms from the template the job itself used."""
    cloudwatch = access.client("cloudwatch")
    try:
        template = access.client("ssm").get_parameter(Name=outputs.run_alarm_parameter)["Parameter"]["Value"]
        deployed = cloudwatch.describe_alarms(AlarmNames=list(outputs.team_alarm_names))["MetricAlarms"]
    except (ClientError, BotoCoreError) as error:
        raise JobError(f"cannot read the alarm definitions ({outputs.run_alarm_parameter}): {error}") from None
    rendered = contract.render_run_alarms(str(template), experiment, run)
    return AlarmSet.from_definitions([*deployed, *rendered["metric_alarms"]], [rendered["composite_alarm"]])


def observed_alarms(cloudwatch: Any, names: list[str], since: datetime) -> dict[str, str]:
    """CloudWatch's own verdicts: ALARM if an alarm went there since the run began, else its state now
    ("deleted" for a run alarm the job removed on its clean exit)."""
    try:
        answer = cloudwatch.describe_alarms(AlarmNames=names)
    except (ClientError, BotoCoreError) as error:
        return {name: f"unreadable: {error}" for name in names}
    now = {a["AlarmName"]: a["StateValue"] for a in [*answer["MetricAlarms"], *answer.get("CompositeAlarms", [])]}
    states: dict[str, str] = {}
    history_readable = True
    for name in names:
        history: list[dict[str, Any]] = []
        if history_readable:
            try:
                history = cloudwatch.describe_alarm_history(
                    AlarmName=name, HistoryItemType="StateUpdate", StartDate=since, MaxRecords=100
                )["AlarmHistoryItems"]
            except (ClientError, BotoCoreError):
                history_readable = False  # no history API (the embedded AWS): the state now is what there is
        went_to_alarm = any("to ALARM" in item.get("HistorySummary", "") for item in history)
        states[name] = ALARM if went_to_alarm else now.get(name, "deleted")
    return states


@dataclass
class JobReport:
    target: str
    team: str
    region: str
    run: str
    experiment: str
    command: str = "smoke"  # the `beacon` command that ran it
    stack_outputs: dict[str, Any] = field(default_factory=dict)
    launched: dict[str, Any] = field(default_factory=dict)
    platform_state: str = ""
    platform_succeeded: bool = False
    platform_detail: str = ""
    verification: Verification | None = None
    alarms_observed: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    doctor: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cleaned_up: bool = False
    wall_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.platform_succeeded
            and self.verification is not None
            and self.verification.ok
            and ALARM not in self.alarms_observed.values()
            and not self.problems
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "command": self.command,
            "target": self.target,
            "team": self.team,
            "region": self.region,
            "experiment": self.experiment,
            "run": self.run,
            "stack_outputs": self.stack_outputs,
            "launched": self.launched,
            "platform": {
                "state": self.platform_state,
                "succeeded": self.platform_succeeded,
                "detail": self.platform_detail,
            },
            "verification": self.verification.as_dict() if self.verification else None,
            "alarms_observed": self.alarms_observed,
            "doctor": self.doctor,
            "problems": self.problems,
            "logs": self.logs,
            "cleaned_up": self.cleaned_up,
            "wall_seconds": round(self.wall_seconds, 1),
        }


def verify(report: JobReport, access: Access, outputs: TeamOutputs, *, expected: Expected, started: datetime) -> None:
    """The checks both targets share; on a failure, also the doctor's verdicts for the run. The run is read
    from S3 once, and each metric series once: verification and the doctor take the same reading."""
    report.stack_outputs = asdict(outputs)
    alarms = alarm_set(access, outputs, report.experiment, report.run)
    inputs = DoctorInputs(
        team=outputs.team,
        experiment=report.experiment,
        run=report.run,
        bucket=outputs.bucket,
        region=outputs.region,
        s3=access.as_reader("s3"),
        cloudwatch=MetricsReadOnce(access.as_reader("cloudwatch")),
        probe_s3=None,
    )
    verdict = verify_and_diagnose(inputs, expected=expected, alarms=alarms)
    report.verification = verdict.verification
    if verdict.unreadable:
        report.problems.append(verdict.unreadable)
    if report.command == "run" and report.verification is not None and report.verification.records_in_s3 == 0:
        report.problems.append(
            f"no records under {contract.run_prefix(report.experiment, report.run)}: if the job's beacon.init "
            "names its experiment, that name must be the experiment here"
        )
    names = [*outputs.team_alarm_names, *run_alarm_names(outputs.team, report.experiment, report.run)]
    report.alarms_observed = observed_alarms(access.client("cloudwatch"), names, started)
    if not report.ok and verdict.diagnosis is not None:
        report.doctor = [asdict(v) for v in verdict.diagnosis.verdicts]


def fresh_suffix(now: datetime | None = None) -> str:
    """Each smoke run (and each `beacon run` not given a run id) is a fresh Job and a fresh run prefix."""
    return (now or datetime.now(UTC)).strftime("-%m%d%H%M%S")


def fresh_spec(config: TeamConfig, outputs: TeamOutputs) -> SmokeJobSpec:
    """The team's smoke job, for the deployed image and bucket, under a fresh run name."""
    return smoke_job_spec(
        config, image=outputs.image_uri, bucket=outputs.bucket, region=outputs.region, name_suffix=fresh_suffix()
    )


def conclude(
    report: JobReport,
    access: Access,
    outputs: TeamOutputs,
    delivery: Delivery,
    *,
    expected: Expected,
    started: datetime,
    collect_logs: Callable[[JobReport], None],
    logs_always: bool,
    show: Show,
) -> None:
    """Once the platform gave its verdict: the run's last writes, its logs (if it failed, or always),
    the checks."""
    if report.platform_succeeded and not wait_for_final_status(delivery, grace_s=60):
        report.problems.append(f"the {report.target} job succeeded but the run's final status never reached S3")
    if logs_always or not report.platform_succeeded:
        collect_logs(report)
    show("verifying S3, CloudWatch metrics and alarms")
    verify(report, access, outputs, expected=expected, started=started)


def started_at() -> datetime:
    return datetime.now(UTC)


class Target(Protocol):
    """Where a job runs. Each method is one step of run_job's flow."""

    name: str

    def launch(self, job: TrainingJobSpec, report: JobReport, show: Show) -> None:
        """Create the job (or raise JobError before anything is created); say in report.launched what."""

    def wait(self, report: JobReport, delivery: Delivery, show: Show) -> None:
        """Until the platform's verdict, or a bound runs out: report.platform_state and detail."""

    def collect_logs(self, report: JobReport) -> None:
        """The job's logs into report.logs (the tail of each container's)."""

    def cleanup(self, report: JobReport) -> None:
        """Leave nothing running or billing, whatever happened; report.cleaned_up says what was removed."""


def run_job(
    target: Target,
    access: Access,
    outputs: TeamOutputs,
    job: TrainingJobSpec,
    expected: Expected,
    *,
    show: Show,
    command: str = "run",
    logs_always: bool = True,
) -> JobReport:
    """Launch job on target, watch delivery to S3, then verify the run (and diagnose it if it failed)."""
    report = JobReport(target.name, outputs.team, outputs.region, job.name, job.experiment, command)
    began, clock = started_at(), time.monotonic()
    target.launch(job, report, show)
    try:
        delivery = Delivery(access.as_reader("s3"), outputs.bucket, job.experiment, job.name)
        target.wait(report, delivery, show)
        conclude(
            report,
            access,
            outputs,
            delivery,
            expected=expected,
            started=began,
            collect_logs=target.collect_logs,
            logs_always=logs_always,
            show=show,
        )
    finally:
        target.cleanup(report)
        report.wall_seconds = time.monotonic() - clock
    return report


def run_smoke(target: Target, access: Access, outputs: TeamOutputs, spec: SmokeJobSpec, *, show: Show) -> JobReport:
    """The bundled smoke job: every one of its steps, a checkpoint, its run alarms armed; logs on failure."""
    return run_job(
        target,
        access,
        outputs,
        spec.training_job(),
        Expected.exactly(spec.steps),
        show=show,
        command="smoke",
        logs_always=False,
    )
