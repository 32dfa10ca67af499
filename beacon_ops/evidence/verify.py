"""The verification `beacon smoke` and `beacon local` share: did the run deliver what it promised?"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from beacon import contract

from beacon_ops.evidence.alarms import ALARM, AlarmSet, SeriesKey, series_key
from beacon_ops.evidence.reading import RunEvidence, metric_samples, read_run

NOT_ARMED = "NOT_ARMED"
EVALUATED_METRICS = (
    (contract.HEARTBEAT, "SampleCount", contract.RUN_DIMENSIONS),
    (contract.PROGRESS_AGE, "Maximum", contract.RUN_DIMENSIONS),
    (contract.UPLOAD_FAILURES, "Sum", contract.TEAM_DIMENSIONS),
    (contract.SPOOL_BACKLOG, "Maximum", contract.TEAM_DIMENSIONS),
)


@dataclass
class Verification:
    steps_expected: int
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

    @property
    def ok(self) -> bool:
        return (
            self.records_lost == 0
            and self.records_duplicated == 0
            and self.writer_ranks == [0]
            and all(v == 1 for v in self.chunk_versions.values())
            and self.checkpoints > 0
            and not self.metrics_missing
            and ALARM not in self.alarms.values()
            and NOT_ARMED not in self.alarms.values()  # a run too short to arm its alarms proves nothing
            and self.succeeded
            and self.bucket_versioning == "Enabled"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def recorded_samples(
    cloudwatch: Any, team: str, experiment: str, run: str
) -> dict[SeriesKey, list[tuple[float, float]]]:
    """The run's recorded metrics, in the evaluator's form."""
    samples: dict[SeriesKey, list[tuple[float, float]]] = {}
    for metric, statistic, dimension_kinds in EVALUATED_METRICS:
        dims = contract.run_dimensions(team, experiment, run)
        dims = {k: v for k, v in dims.items() if contract.Dim(k) in dimension_kinds}
        points = metric_samples(cloudwatch, metric, dims, statistic=statistic)
        samples[series_key(contract.metric_namespace(team), metric.name, dims)] = [
            (p.at.timestamp(), p.value) for p in points
        ]
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


def verify_run(
    evidence: RunEvidence, *, s3: Any, cloudwatch: Any, bucket: str, team: str, steps: int, alarms: AlarmSet
) -> Verification:
    expected = set(range(steps))
    seen = evidence.steps
    versions = {}
    for key in evidence.chunk_keys:
        listed = s3.list_object_versions(Bucket=bucket, Prefix=key)
        versions[key] = len([v for v in listed.get("Versions", []) if v["Key"] == key])
    dims = contract.run_dimensions(team, evidence.experiment, evidence.run)
    present: list[str] = []
    missing: list[str] = []
    datapoints = 0
    for metric in contract.JOB_METRICS:
        statistic = "SampleCount"
        points = metric_samples(cloudwatch, metric, dims, statistic=statistic)
        datapoints += len(points)
        (present if points else missing).append(metric.name)
    samples = recorded_samples(cloudwatch, team, evidence.experiment, evidence.run)
    beats = samples[series_key(contract.metric_namespace(team), contract.HEARTBEAT.name, dims)]
    states = evaluate_recorded(alarms, samples, beats[0][0], beats[-1][0]) if beats else {}
    return Verification(
        steps_expected=steps,
        records_in_s3=len(evidence.records),
        records_lost=len(expected - set(seen)),
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
    )


def read_and_verify(
    *, s3: Any, cloudwatch: Any, bucket: str, team: str, experiment: str, run: str, steps: int, alarms: AlarmSet
) -> tuple[RunEvidence, Verification]:
    """The run read once, and verified; the reading goes on to the doctor, which reads nothing again."""
    evidence = read_run(s3, bucket, experiment, run)
    verification = verify_run(
        evidence, s3=s3, cloudwatch=cloudwatch, bucket=bucket, team=team, steps=steps, alarms=alarms
    )
    return evidence, verification
