"""What a run left behind, read back through the same contract the job wrote with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract
from beacon.flight_recorder import FLIGHT_RECORDER_PREFIX
from beacon.ranks import RankProgress
from botocore.exceptions import BotoCoreError, ClientError


@dataclass
class RunEvidence:
    experiment: str
    run: str
    records: list[contract.Record] = field(default_factory=list)
    chunk_keys: list[str] = field(default_factory=list)
    preflights: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    checkpoints: list[str] = field(default_factory=list)
    tensorboard_files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # The newest attempt's ranks' evidence (`beacon.ranks`, uploaded by rank 0): file name -> bytes.
    rank_files: dict[str, bytes] = field(default_factory=dict)
    # Where they came from: `attempt-<k>` (the attempt's end) or `attempt-<k>/live-<n>` (a stall's snapshot).
    rank_files_from: str = ""

    def ranks(self) -> tuple[list[RankProgress], dict[int, str]]:
        """Every rank's last document, and each rank's stack dumps, from the rank files."""
        documents, stacks = [], {}
        for name, body in sorted(self.rank_files.items()):
            if name.startswith("rank-") and name.endswith(".json"):
                documents.append(RankProgress.from_document(body))
            elif name.startswith("stacks-rank-") and name.endswith(".txt"):
                stacks[int(name.removeprefix("stacks-rank-").removesuffix(".txt"))] = body.decode(errors="replace")
        return documents, stacks

    def flight_recorder_dumps(self) -> dict[str, bytes]:
        """Each rank's flight-recorder dump among the rank files, by its key in S3."""
        ranks = f"{contract.run_prefix(self.experiment, self.run)}{contract.RANKS}/{self.rank_files_from}/"
        return {ranks + name: body for name, body in self.rank_files.items() if name.startswith(FLIGHT_RECORDER_PREFIX)}

    @property
    def history(self) -> contract.History:
        """The live history across the run's attempts; superseded records are kept, and counted apart."""
        return contract.history(self.records)

    @property
    def steps(self) -> list[int]:
        """The steps of the live history: one each, whatever restarts went through them again."""
        return self.history.live_steps

    @property
    def last_step(self) -> int | None:
        return max(self.steps) if self.records else None

    @property
    def duplicated(self) -> int:
        """Records of one (attempt, step) beyond the first: never expected."""
        return len(self.history.duplicated)

    @property
    def writer_ranks(self) -> list[int]:
        return sorted({r.rank for r in self.records})

    @property
    def final_state(self) -> str | None:
        """How the run ended (`contract.FinalState`), or None while no final state is written."""
        return None if self.final is None else str(self.final.get("state", contract.FinalState.FINISHED))

    @property
    def finished(self) -> bool:
        return self.final_state == contract.FinalState.FINISHED

    @property
    def preflight(self) -> dict[str, Any] | None:
        return self.preflights[-1] if self.preflights else None


@dataclass
class Delivery:
    """What has reached S3 so far, read incrementally while the job runs (each chunk once), for the
    progress line; the verdict takes read_run's reading once the job ended."""

    s3: Any
    bucket: str
    experiment: str
    run: str
    records: int = 0
    last_step: int | None = None
    finished: bool = False
    final_state: str = ""
    _read: set[str] = field(default_factory=set)

    def poll(self) -> Delivery:
        prefix = f"{contract.run_prefix(self.experiment, self.run)}{contract.EVENTS}/"
        try:
            pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
            keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
            for key in sorted(set(keys) - self._read):
                body = self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                steps = [record.step for record in contract.records_of(body)]
                self.records += len(steps)
                self.last_step = max([*steps, *([self.last_step] if self.last_step is not None else [])])
                self._read.add(key)
            final = self.s3.get_object(Bucket=self.bucket, Key=contract.final_status_key(self.experiment, self.run))
            self.final_state = str(json.loads(final["Body"].read()).get("state", contract.FinalState.FINISHED))
            self.finished = True
        except (ClientError, BotoCoreError):
            pass  # not there yet, or a transient error: the next poll tries again
        return self

    def describe(self) -> str:
        step = "-" if self.last_step is None else str(self.last_step)
        ended = f", final state {self.final_state}" if self.finished else ""
        return f"last step {step}, {self.records} records in S3{ended}"


def _keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return sorted(keys)


def _read(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def read_run(s3: Any, bucket: str, experiment: str, run: str) -> RunEvidence:
    evidence = RunEvidence(experiment, run)
    prefix = contract.run_prefix(experiment, run)
    try:
        keys = _keys(s3, bucket, prefix)
    except (ClientError, BotoCoreError) as error:
        evidence.errors.append(f"s3:ListBucket s3://{bucket}/{prefix}: {error}")
        return evidence
    for key in keys:
        kind = key.removeprefix(prefix).split("/", 1)[0]
        if kind == contract.EVENTS:
            evidence.chunk_keys.append(key)
            body = _read(s3, bucket, key)
            evidence.records.extend(contract.records_of(body))
        elif kind == contract.PREFLIGHT:
            evidence.preflights.append(json.loads(_read(s3, bucket, key)))
        elif kind == contract.STATUS and key == contract.final_status_key(experiment, run):
            evidence.final = json.loads(_read(s3, bucket, key))
        elif kind == contract.CHECKPOINTS:
            evidence.checkpoints.append(key)
        elif kind == contract.TENSORBOARD:
            evidence.tensorboard_files.append(key)
    chosen, evidence.rank_files_from = rank_keys(prefix, keys)
    for key in chosen:
        evidence.rank_files[key.rsplit("/", 1)[1]] = _read(s3, bucket, key)
    return evidence


def rank_keys(prefix: str, keys: list[str]) -> tuple[list[str], str]:
    """The ranks' evidence to read, chosen from the run's one listing, and where it is (`attempt-<k>` or
    `attempt-<k>/live-<n>`): the newest attempt's end-of-attempt files when it has them; else that
    attempt's newest live snapshot (rank 0 uploads one while a rank stalls), the newest complete one
    when there is one (a snapshot still uploading lacks files)."""
    ranks = f"{prefix}{contract.RANKS}/"
    paths = [key.removeprefix(ranks).split("/") for key in keys if key.startswith(ranks)]
    if not paths:
        return [], ""
    newest = max(path[0] for path in paths)  # attempt-<k>, zero-padded
    final = [path for path in paths if path[0] == newest and len(path) == 2]
    live = [
        path
        for path in paths
        if path[0] == newest and len(path) == 3 and path[1].startswith(f"{contract.LIVE_SNAPSHOT}-")
    ]
    if final or not live:
        return [ranks + "/".join(path) for path in final], newest if final else ""
    complete = {path[1] for path in live if path[2] == contract.LIVE_SNAPSHOT_COMPLETE}
    snapshot = max(complete or {path[1] for path in live})  # live-<n>, zero-padded
    chosen = [path for path in live if path[1] == snapshot and path[2] != contract.LIVE_SNAPSHOT_COMPLETE]
    return [ranks + "/".join(path) for path in chosen], f"{newest}/{snapshot}"


@dataclass(frozen=True)
class Sample:
    at: datetime
    value: float


def metric_samples(
    cloudwatch: Any,
    metric: contract.Metric,
    dimensions: dict[str, str],
    *,
    statistic: str,
    minutes: int = 30,
    period: int | None = None,
    now: datetime | None = None,
) -> list[Sample]:
    """Datapoints of one metric, oldest first. By default 1 s periods for high-resolution metrics
    (their data comes back raw) and 60 s for standard ones."""
    now = now or datetime.now(UTC)
    answer = cloudwatch.get_metric_statistics(
        Namespace=contract.metric_namespace(dimensions[contract.Dim.TEAM.value]),
        MetricName=metric.name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=now - timedelta(minutes=minutes),
        EndTime=now + timedelta(seconds=5),
        Period=period or (1 if metric.high_resolution else 60),
        Statistics=[statistic],
    )
    return sorted(
        (Sample(point["Timestamp"].astimezone(UTC), float(point[statistic])) for point in answer["Datapoints"]),
        key=lambda sample: sample.at,
    )


def alarm_states(cloudwatch: Any, names_prefix: str) -> dict[str, str]:
    answer = cloudwatch.describe_alarms(AlarmNamePrefix=names_prefix)
    return {a["AlarmName"]: a["StateValue"] for a in [*answer["MetricAlarms"], *answer.get("CompositeAlarms", [])]}
