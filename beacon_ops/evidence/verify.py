"""The verification `beacon smoke`, `beacon run` and `beacon local` share: did the run deliver what it promised?

What a run must show depends on what is known of it in advance (`Expected`): the smoke job's steps are
known, so every one of them must be in S3; a team's own job logs as many steps as it does, so every
record its spool numbered must be in S3, through the last step its final state names."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from beacon import contract

from beacon_ops.evidence.alarms import ALARM, AlarmSet, SeriesKey, series_key
from beacon_ops.evidence.reading import RunEvidence, metric_samples, read_run

NOT_ARMED = "NOT_ARMED"


@dataclass(frozen=True)
class Expected:
    """What a run must show to pass, beyond what every run must show (no record lost or duplicated,
    rank 0 alone writing, one version per chunk, the health metrics, no alarm, final state finished)."""

    steps: int | None  # steps 0..steps-1 each in S3; None: the job's own count (every record it numbered)
    checkpoint: bool = True  # at least one checkpoint
    alarms_armed: bool = True  # the run lasted long enough to arm its run alarms (NOT_ARMED fails)

    @classmethod
    def exactly(cls, steps: int) -> Expected:
        """The smoke job: its steps, a checkpoint, and long enough to arm its alarms."""
        return cls(steps=steps)

    @classmethod
    def own_job(cls, steps: int | None = None) -> Expected:
        """A team's own job: whatever it logged, all of it; checkpoints and armed alarms are its business."""
        return cls(steps=steps, checkpoint=False, alarms_armed=False)


@dataclass
class Verification:
    steps_expected: int | None  # None: not known in advance (a team's own job)
    records_in_s3: int
    records_lost: int
    records_duplicated: int
    records_superseded: int  # earlier attempts' records of steps a restart went through again: kept
    writer_ranks: list[int]
    chunk_versions: dict[str, int]
    checkpoints: int
    tensorboard_files: int
    metrics_present: list[str]
    metrics_missing: list[str]
    cloudwatch_datapoints: int
    alarms: dict[str, str] = field(default_factory=dict)
    succeeded: bool = False
    bucket_versioning: str = ""
    records_numbered: int = 0  # the spool's gapless sequence numbers the records in S3 reach up to
    last_step_in_s3: int | None = None  # the live history's last step
    last_step_final: int | None = None  # the last step the job logged, in its own final state
    checkpoint_required: bool = True
    alarms_must_arm: bool = True

    @property
    def ok(self) -> bool:
        return (
            self.records_in_s3 > 0
            and self.records_lost == 0
            and self.records_duplicated == 0
            and self.writer_ranks == [0]
            and all(v == 1 for v in self.chunk_versions.values())
            and (self.checkpoints > 0 or not self.checkpoint_required)
            and not self.metrics_missing
            and ALARM not in self.alarms.values()
            # a run too short to arm its alarms proves nothing about them (the smoke job must arm them)
            and (NOT_ARMED not in self.alarms.values() or not self.alarms_must_arm)
            and self.succeeded
            and self.last_step_final in (None, self.last_step_in_s3)  # the tail reached S3
            and self.bucket_versioning == "Enabled"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def recorded_samples(
    cloudwatch: Any, alarms: AlarmSet, *also: tuple[contract.Metric, dict[str, str], str]
) -> dict[SeriesKey, list[tuple[float, float]]]:
    """The recorded series each of `alarms` evaluates (its metric, dimensions and statistic; a Metrics Insights query's
    aside: Container Insights is not the run's), and `also` (a metric, its dimensions, a statistic), in the evaluator's
    form: what the alarms watch is read from them, never listed beside them."""
    known = {metric.name: metric for metric in (*contract.JOB_METRICS, *contract.EVENT_METRICS, *contract.RANK_METRICS)}
    wanted = {
        series_key(alarm.namespace, alarm.metric_name, alarm.dimensions): alarm.statistic
        for alarm in alarms.metric_alarms.values()
        if alarm.query is None
    }
    for metric, dimensions, statistic in also:
        namespace = contract.metric_namespace(dimensions[contract.Dim.TEAM.value])
        wanted[series_key(namespace, metric.name, dimensions)] = statistic
    samples: dict[SeriesKey, list[tuple[float, float]]] = {}
    for key, statistic in wanted.items():
        _, name, dims = key
        metric = known.get(name, contract.team_metric(name))
        points = metric_samples(cloudwatch, metric, dict(dims), statistic=statistic)
        samples[key] = [(p.at.timestamp(), p.value) for p in points]
    return samples


def evaluate_recorded(
    alarms: AlarmSet, samples: dict[SeriesKey, list[tuple[float, float]]], first_beat: float, last_beat: float
) -> dict[str, str]:
    """Each alarm's worst state over the run: team alarms from the first heartbeat, run alarms from
    when the job armed them (one heartbeat period later) until its clean exit deleted them."""
    armed = contract.run_alarms_arm_at(first_beat)
    worst = {}
    for name in alarms.names:
        is_run_alarm = name.startswith(contract.ALARM_PREFIX) and "-run-" in name
        start = armed if is_run_alarm else first_beat
        if start > last_beat:
            worst[name] = NOT_ARMED
            continue
        worst[name] = ALARM if alarms.first_alarm(name, samples, start, last_beat) is not None else "OK"
    return worst


def lost_records(evidence: RunEvidence, expected: Expected) -> int:
    """Known steps: each step not in the live history. Otherwise: each sequence number the job's spool
    gave a record (gapless from 0, across attempts) that S3 does not hold."""
    if expected.steps is not None:
        return len(set(range(expected.steps)) - set(evidence.steps))
    numbered = {r.seq for r in evidence.records}
    return len(set(range(max(numbered, default=-1) + 1)) - numbered)


def required_metrics(evidence: RunEvidence, expected: Expected) -> list[contract.Metric]:
    """The contract's job metrics; of a team's own job, Loss only if it logs a loss, and checkpoint
    time only if it checkpointed (the library sends them only then)."""
    if expected.steps is not None:
        return list(contract.JOB_METRICS)
    logs_loss = any(r.loss is not None for r in evidence.records)
    return [
        m
        for m in contract.JOB_METRICS
        if (m is not contract.LOSS or logs_loss) and (m is not contract.CHECKPOINT_SECONDS or evidence.checkpoints)
    ]


def verify_run(
    evidence: RunEvidence, *, s3: Any, cloudwatch: Any, bucket: str, team: str, expected: Expected, alarms: AlarmSet
) -> Verification:
    versions = {}
    for key in evidence.chunk_keys:
        listed = s3.list_object_versions(Bucket=bucket, Prefix=key)
        versions[key] = len([v for v in listed.get("Versions", []) if v["Key"] == key])
    dims = contract.run_dimensions(team, evidence.experiment, evidence.run)
    present: list[str] = []
    missing: list[str] = []
    datapoints = 0
    for metric in required_metrics(evidence, expected):
        statistic = "SampleCount"
        points = metric_samples(cloudwatch, metric, dims, statistic=statistic)
        datapoints += len(points)
        (present if points else missing).append(metric.name)
    samples = recorded_samples(cloudwatch, alarms, (contract.HEARTBEAT, dims, "SampleCount"))
    beats = samples[series_key(contract.metric_namespace(team), contract.HEARTBEAT.name, dims)]
    states = evaluate_recorded(alarms, samples, beats[0][0], beats[-1][0]) if beats else {}
    final_step = (evidence.final or {}).get("last_step")
    return Verification(
        steps_expected=expected.steps,
        records_in_s3=len(evidence.records),
        records_lost=lost_records(evidence, expected),
        records_duplicated=evidence.duplicated,
        records_superseded=len(evidence.history.superseded),
        writer_ranks=evidence.writer_ranks,
        chunk_versions=versions,
        checkpoints=len(evidence.checkpoints),
        tensorboard_files=len(evidence.tensorboard_files),
        metrics_present=present,
        metrics_missing=missing,
        cloudwatch_datapoints=datapoints,
        alarms=states,
        succeeded=evidence.finished,
        bucket_versioning=str(s3.get_bucket_versioning(Bucket=bucket).get("Status", "Disabled")),
        records_numbered=max((r.seq for r in evidence.records), default=-1) + 1,
        last_step_in_s3=evidence.last_step,
        last_step_final=final_step if isinstance(final_step, int) and final_step >= 0 else None,
        checkpoint_required=expected.checkpoint,
        alarms_must_arm=expected.alarms_armed,
    )


def read_and_verify(
    *,
    s3: Any,
    cloudwatch: Any,
    bucket: str,
    team: str,
    experiment: str,
    run: str,
    expected: Expected,
    alarms: AlarmSet,
) -> tuple[RunEvidence, Verification]:
    """The run read once, and verified; the reading goes on to the doctor, which reads nothing again."""
    evidence = read_run(s3, bucket, experiment, run)
    verification = verify_run(
        evidence, s3=s3, cloudwatch=cloudwatch, bucket=bucket, team=team, expected=expected, alarms=alarms
    )
    return evidence, verification
