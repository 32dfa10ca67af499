"""The alarm carries the verdict: when a run's `metrics-lost`, `slow` or `slowed` alarm goes to ALARM, the doctor's
diagnosis of that run (its evidence in S3, its metrics and alarms in CloudWatch) goes to the team's topic.

The monitoring stack runs this as a Lambda function (`handler`), behind an EventBridge rule on the
team's "CloudWatch Alarm State Change" events; the alarm's own notification still goes out as before,
this one follows with the verdict. It never calls the Kubernetes API. `notify` is the whole function
with its clients passed in, so tests run it in-process against the embedded AWS.

Its bundle (`beacon_constructs.alarm_verdict.BUNDLE`) holds the runtime's `beacon` package and the
operator's doctor and evidence reading; Lambda's Python runtime brings boto3.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.doctor.diagnosis import FAIL, WARN, Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.reading import metric_samples

log = logging.getLogger("beacon.alarm_verdict")

# The function's environment, set by the monitoring stack.
ENV_TEAM = "BEACON_TEAM"
ENV_BUCKET = "BEACON_BUCKET"
ENV_TOPIC_ARN = "BEACON_TOPIC_ARN"
ENV_READER_ROLE_ARN = "BEACON_READER_ROLE_ARN"  # the artifact store's verdict reader role
ENV_PRICES = "BEACON_PRICES"  # the team file's own prices, as JSON (`config.PricesConfig.table`)
READER_SESSION_NAME = "beacon-verdict"  # then the run, as CloudTrail shows which run a session read
READER_SESSION_S = 900  # STS's shortest; the function's timeout is shorter

ALARM_STATE_CHANGE = "CloudWatch Alarm State Change"
ALARM_SOURCE = "aws.cloudwatch"
# SNS: a subject of at most 100 printable ASCII characters; a message of at most 256 KiB (UTF-8).
SUBJECT_LIMIT = 100
MESSAGE_LIMIT = 256 * 1024
STACK_FRAMES = 12  # of the stopped rank's main thread, innermost first
# A frozen rank 0 uploads nothing, and its silent alarm can fire 75 s after the freeze; a node leader stands in
# once rank 0's document is `stall_dump_after` (90 s as deployed) old, within one more pass
# (beacon.evidence.node_leader).
# So a multi-rank run whose verdict names no rank yet is read again, every poll, this long at most: the verdict
# then names the rank within three minutes of the freeze. A single-rank run (no RankStepSpread) is not waited on.
RANK_EVIDENCE_WAIT_S = 150.0
RANK_EVIDENCE_POLL_S = 15.0
AFTER_THE_WAIT_S = 60.0  # the last reading and the publish, within the function's timeout


@dataclass(frozen=True)
class AlarmedRun:
    alarm: str
    team: str
    experiment: str
    run: str
    reason: str


@dataclass(frozen=True)
class Notification:
    subject: str
    message: str


def notifying_suffixes() -> list[str]:
    return [f"-{kind.value}" for kind in contract.RunAlarm.notifying()]


def alarm_patterns(team: str) -> list[str]:
    """The EventBridge wildcards naming every run's notifying alarm of this team (metrics-lost, slow, slowed), nothing
    else."""
    return [f"{contract.run_alarm_prefix(team)}*{suffix}" for suffix in notifying_suffixes()]


def _dimensions_of(detail: dict[str, Any]) -> dict[str, str]:
    """A metric alarm's dimensions, as its state-change event carries them."""
    found: dict[str, str] = {}
    for metric in (detail.get("configuration") or {}).get("metrics") or []:
        found.update(((metric.get("metricStat") or {}).get("metric") or {}).get("dimensions") or {})
    return found


def _sibling_dimensions(cloudwatch: Any, team: str, alarm: str) -> dict[str, str]:
    """The composite has no dimensions: its run's silent alarm, a metric alarm, names the run in its own."""
    silent = alarm.removesuffix(contract.RunAlarm.METRICS_LOST.value) + contract.RunAlarm.SILENT.value
    if not alarm.endswith(contract.RunAlarm.METRICS_LOST.value):
        return {}  # a metric alarm: its own event names its run
    try:
        answer = cloudwatch.describe_alarms(AlarmNames=[silent], AlarmTypes=["MetricAlarm"])
    except (ClientError, BotoCoreError) as error:
        log.warning("cannot describe %s: %s", silent, error)
        return {}
    for found in answer.get("MetricAlarms", []):
        return {d["Name"]: d["Value"] for d in found.get("Dimensions", [])}
    return {}


def alarmed_run(event: dict[str, Any], *, team: str, cloudwatch: Any) -> AlarmedRun | str:
    """The run whose metrics-lost, slow or slowed alarm (`RunAlarm.notifying`) went to ALARM, or why this event is not
    one to act on."""
    if event.get("source") != ALARM_SOURCE or event.get("detail-type") != ALARM_STATE_CHANGE:
        return f"not an alarm state change: {event.get('source')} {event.get('detail-type')}"
    detail = event.get("detail") or {}
    alarm = str(detail.get("alarmName", ""))
    state = (detail.get("state") or {}).get("value")
    prefix = contract.run_alarm_prefix(team)
    suffix = next((s for s in notifying_suffixes() if alarm.endswith(s)), None)
    if not alarm.startswith(prefix) or suffix is None:
        return f"not a notifying run alarm of team {team}: {alarm}"
    if state != "ALARM":
        return f"{alarm} went to {state}, not ALARM"
    reason = str((detail.get("state") or {}).get("reason", ""))
    dimensions = _dimensions_of(detail) or _sibling_dimensions(cloudwatch, team, alarm)
    experiment = dimensions.get(contract.Dim.EXPERIMENT.value)
    run = dimensions.get(contract.Dim.RUN.value)
    if dimensions.get(contract.Dim.TEAM.value, team) != team:
        return f"{alarm} names team {dimensions[contract.Dim.TEAM.value]}, not {team}"
    if experiment is None or run is None:
        # Without the run's own alarms to ask, the name alone: unambiguous only if one hyphen parts them.
        parts = alarm.removeprefix(prefix).removesuffix(suffix).split("-")
        if len(parts) == 2:
            experiment, run = parts
        else:
            experiment, run = "", alarm.removeprefix(prefix).removesuffix(suffix)
    return AlarmedRun(alarm, team, experiment, run, reason)


def _ascii(text: str) -> str:
    return text.encode("ascii", "replace").decode().replace("\n", " ")


def subject_of(alarmed: AlarmedRun, diagnosis: Diagnosis | None) -> str:
    verdict = diagnosis.diagnosis if diagnosis is not None else "no verdict"
    subject = _ascii(f"Beacon {alarmed.team}: {alarmed.experiment}/{alarmed.run} {verdict}")
    return subject if len(subject) <= SUBJECT_LIMIT else subject[: SUBJECT_LIMIT - 3] + "..."


def message_of(alarmed: AlarmedRun, diagnosis: Diagnosis, bucket: str) -> str:
    """The verdict first (the cause, with the rank that stopped the run), then where it hangs, then every check."""
    doctor = f"beacon doctor --team {alarmed.team} --experiment {alarmed.experiment} --run {alarmed.run}"
    lines = [
        diagnosis.headline(),
        "",
        f"Alarm {alarmed.alarm} is in ALARM: {alarmed.reason or 'no reason given'}",
        f"Run: team {alarmed.team}, experiment {alarmed.experiment}, run {alarmed.run} "
        f"(s3://{bucket}/{contract.run_prefix(alarmed.experiment, alarmed.run)})",
    ]
    stopped = diagnosis.stopped_rank
    if stopped is not None and stopped.stack:
        lines += ["", f"Rank {stopped.rank}'s main thread, innermost first:"]
        lines += [f"  {frame}" for frame in stopped.stack[:STACK_FRAMES]]
        if len(stopped.stack) > STACK_FRAMES:
            lines.append(f"  ... {len(stopped.stack) - STACK_FRAMES} more frame(s)")
    lines += ["", "Checks:"]
    for v in diagnosis.verdicts:
        lines.append(f"  [{v.status}] {v.check}: {v.verdict}: {v.evidence}")
        if v.fix and v.status in (FAIL, WARN):
            lines.append(f"      fix: {v.fix}")
    lines += ["", f"Then run: {doctor}"]
    return _fit("\n".join(lines))


def _fit(message: str) -> str:
    encoded = message.encode()
    if len(encoded) <= MESSAGE_LIMIT:
        return message
    cut = "\n... (cut to SNS's 256 KiB; `beacon doctor` shows all)"
    return encoded[: MESSAGE_LIMIT - len(cut.encode())].decode(errors="ignore") + cut


def _several_ranks(inputs: DoctorInputs) -> bool:
    """Rank 0 sent the cross-rank view (`RankStepSpread`): only a run of several ranks does."""
    dimensions = contract.run_dimensions(inputs.team, inputs.experiment, inputs.run)
    try:
        return bool(
            metric_samples(
                inputs.cloudwatch, contract.RANK_STEP_SPREAD, dimensions, statistic="Maximum", now=inputs.now
            )
        )
    except (ClientError, BotoCoreError) as error:
        log.warning("cannot read %s: %s", contract.RANK_STEP_SPREAD.name, error)
        return False


def diagnose_naming_the_rank(
    inputs: DoctorInputs, *, wait_s: float, poll_s: float, sleep: Callable[[float], None]
) -> tuple[Diagnosis, float]:
    """The diagnosis, read again while a run of several ranks has no rank named and its ranks' evidence may
    still be on its way (a node leader standing in for a frozen rank 0); and the seconds waited for it."""
    started = time.monotonic()
    diagnosis = diagnose(inputs)
    waited = 0.0
    if diagnosis.stopped_rank is not None or diagnosis.healthy or diagnosis.diagnosis in ("rank-slow", "run-slowed"):
        return diagnosis, waited  # a rank named (a slow one too), or none to name
    if not _several_ranks(inputs):
        return diagnosis, waited
    # Sleeps and readings together stay within `wait_s`: the function's own time bounds it (`handler`).
    while (
        diagnosis.stopped_rank is None and waited + poll_s <= wait_s and time.monotonic() - started + poll_s <= wait_s
    ):
        sleep(poll_s)
        waited += poll_s
        later = None if inputs.now is None else inputs.now.astimezone(UTC) + timedelta(seconds=waited)
        diagnosis = diagnose(replace(inputs, now=later))
    return diagnosis, waited


def notify(
    event: dict[str, Any],
    *,
    team: str,
    bucket: str,
    topic_arn: str,
    region: str,
    s3_for_run: Callable[[str, str], Any],
    cloudwatch: Any,
    sns: Any,
    now: datetime | None = None,
    rank_wait_s: float = RANK_EVIDENCE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    prices: dict[str, dict[str, float]] | None = None,
) -> Notification | None:
    """Publish the doctor's verdict on the run whose metrics-lost alarm this event reports; None (and
    nothing published) for any other event. `s3_for_run(experiment, run)` gives the S3 client the run's
    evidence is read with: in Lambda, a session that may read that run alone (`run_session_policy`)."""
    alarmed = alarmed_run(event, team=team, cloudwatch=cloudwatch)
    if isinstance(alarmed, str):
        log.info("ignored: %s", alarmed)
        return None
    if not alarmed.experiment:
        diagnosis = None
        message = (
            f"Alarm {alarmed.alarm} is in ALARM, but its run's own alarms are gone and its name does not say "
            f"where the experiment ends and the run begins ({alarmed.run}).\n"
            f"Run: beacon doctor --team {team} --experiment <experiment> --run <run>"
        )
    else:
        try:
            s3 = s3_for_run(alarmed.experiment, alarmed.run)
            inputs = DoctorInputs(team, alarmed.experiment, alarmed.run, bucket, region, s3, cloudwatch, now=now,
                                  prices=prices or {})  # fmt: skip
            diagnosis, waited = diagnose_naming_the_rank(
                inputs, wait_s=rank_wait_s, poll_s=RANK_EVIDENCE_POLL_S, sleep=sleep
            )
            message = message_of(alarmed, diagnosis, bucket)
            if waited and diagnosis.stopped_rank is None:
                message += (
                    f"\nNo rank named: its ranks' evidence did not reach S3 within {waited:.0f} s of the alarm; "
                    "it is on the run's volume (`python -m beacon.sync` uploads it)."
                )
        except (ClientError, BotoCoreError, ValueError) as error:
            log.exception("the diagnosis of %s/%s failed", alarmed.experiment, alarmed.run)
            diagnosis = None
            message = (
                f"Alarm {alarmed.alarm} is in ALARM; the doctor could not read the run's evidence: {error}\n"
                f"Run: beacon doctor --team {team} --experiment {alarmed.experiment} --run {alarmed.run}"
            )
        except Exception as error:  # a file nobody foresaw: the team still hears of the alarm, and what to run
            log.exception("the diagnosis of %s/%s failed", alarmed.experiment, alarmed.run)
            diagnosis = None
            message = (
                f"Alarm {alarmed.alarm} is in ALARM; the doctor failed on the run's evidence: "
                f"{type(error).__name__}: {error}\n"
                f"Run: beacon doctor --team {team} --experiment {alarmed.experiment} --run {alarmed.run}"
            )
    notification = Notification(subject_of(alarmed, diagnosis), message)
    sns.publish(TopicArn=topic_arn, Subject=notification.subject, Message=notification.message)
    return notification


def run_session_policy(bucket: str, experiment: str, run: str, *, partition: str = "aws") -> dict[str, Any]:
    """The session policy that narrows the verdict reader role to one run: what a diagnosis reads of it (the
    kinds `contract.DIAGNOSED_KINDS`), a listing under its prefix, and the bucket's key (the role itself allows
    that only through S3). A session's rights are the role's and these together."""
    # names from the alarm: a wildcard in one would widen the policy to other runs
    prefix = contract.run_prefix(contract.validate_id("experiment", experiment), contract.validate_id("run", run))
    bucket_arn = f"arn:{partition}:s3:::{bucket}"
    statements = [
        {
            "Sid": "ReadTheAlarmedRun",
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": [f"{bucket_arn}/{prefix}{kind}/*" for kind in contract.DIAGNOSED_KINDS],
        },
        {
            "Sid": "ListTheAlarmedRun",
            "Effect": "Allow",
            "Action": "s3:ListBucket",
            "Resource": bucket_arn,
            "Condition": {"StringLike": {"s3:prefix": f"{prefix}*"}},
        },
        {"Sid": "DecryptItsObjects", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"},
    ]
    return {"Version": "2012-10-17", "Statement": statements}


def reader_session_name(run: str) -> str:
    return f"{READER_SESSION_NAME}-{run}"[:64]


def run_reader(session: Any, *, role_arn: str, bucket: str, region: str) -> Callable[[str, str], Any]:
    """`s3_for_run` for Lambda: an S3 client in a session of the verdict reader role that may read one run."""
    import boto3  # Lambda's Python runtime provides it

    partition = role_arn.split(":")[1]

    def s3_for_run(experiment: str, run: str) -> Any:
        policy = json.dumps(run_session_policy(bucket, experiment, run, partition=partition), separators=(",", ":"))
        credentials = session.client("sts").assume_role(
            RoleArn=role_arn, RoleSessionName=reader_session_name(run), Policy=policy, DurationSeconds=READER_SESSION_S
        )["Credentials"]
        scoped = boto3.session.Session(
            aws_access_key_id=credentials["AccessKeyId"],
            aws_secret_access_key=credentials["SecretAccessKey"],
            aws_session_token=credentials["SessionToken"],
            region_name=region,
        )
        return scoped.client("s3")

    return s3_for_run


def rank_wait_for(context: object) -> float:
    """How long the function may wait for a run's ranks' evidence: what Lambda says it has left, less a reading and
    the publish after the last wait (`RANK_EVIDENCE_WAIT_S` at most)."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return RANK_EVIDENCE_WAIT_S
    return max(0.0, min(RANK_EVIDENCE_WAIT_S, float(remaining()) / 1000 - AFTER_THE_WAIT_S))


def prices_of(text: str) -> dict[str, dict[str, float]]:
    """The team's own prices from the function's environment; none (the list prices) where it holds none, or
    something else than the stack writes (said in the log, never a failed notification)."""
    if not text:
        return {}
    try:
        table = json.loads(text)
        return {str(kind): {str(t): float(p) for t, p in by_type.items()} for kind, by_type in table.items()}
    except (ValueError, TypeError, AttributeError) as error:
        log.warning("%s is not the team's prices (%s): the list prices are used", ENV_PRICES, error)
        return {}


def handler(event: dict[str, Any], context: object) -> dict[str, Any]:
    """The Lambda entry point: clients from the function's role, names from its environment."""
    import boto3  # Lambda's Python runtime provides it; imported here so tests need no environment

    logging.getLogger().setLevel(logging.INFO)
    region = os.environ["AWS_REGION"]
    session = boto3.session.Session(region_name=region)
    bucket = os.environ[ENV_BUCKET]
    notification = notify(
        event,
        team=os.environ[ENV_TEAM],
        bucket=bucket,
        topic_arn=os.environ[ENV_TOPIC_ARN],
        region=region,
        s3_for_run=run_reader(session, role_arn=os.environ[ENV_READER_ROLE_ARN], bucket=bucket, region=region),
        cloudwatch=session.client("cloudwatch"),
        sns=session.client("sns"),
        rank_wait_s=rank_wait_for(context),
        prices=prices_of(os.environ.get(ENV_PRICES, "")),
    )
    return {"published": notification is not None, "subject": notification.subject if notification else ""}
