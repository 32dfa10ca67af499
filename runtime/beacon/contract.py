"""The contract every room shares: S3 key layout and CloudWatch metrics.

The monitoring stack, the job and the operator CLI import these names; none of them
writes a metric name, a dimension or a key format as a literal of its own.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

try:  # the spool's fast line writer; readers need none (the alarm's function bundles this file with boto3 alone)
    import orjson as _orjson
except ImportError:
    _orjson = None  # type: ignore[assignment]

# --- S3 layout -------------------------------------------------------------------------
EXPERIMENTS_PREFIX = "experiments/"
EVENTS = "events"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
PREFLIGHT = "preflight"
STATUS = "status"
PARAMS = "params"  # the run's hyperparameters, written once
RANKS = "ranks"  # every rank's progress signal and stack dumps, uploaded at the end of an attempt
# ... and during a stall, as rank 0 saw them then (`live_rank_evidence_key`); a snapshot whose files are
# all in S3 ends with this marker, written last, so a reader never takes a half-uploaded one for whole.
LIVE_SNAPSHOT = "live"
LIVE_SNAPSHOT_COMPLETE = ".complete"
# A node leader's uploads (`beacon.node_leader`), beside rank 0's: what rank 0 cannot upload because it
# stopped, or because the ranks directory is node-local (multi-node SageMaker). Same layout inside.
NODE = "node"
INDEX = "index"  # what each group of event chunks holds, so a reader finds the tail without listing them all
# Event chunks per index document: a 1,000,000-record run of 2,000 chunks has 31 of them, and a tail of 16.
INDEX_GROUP = 64
SAGEMAKER_VOLUME = "sagemaker-volume"  # SageMaker's checkpoint sync of the job's volume
# Where SageMaker itself uploads at a job's end (OutputDataConfig.S3OutputPath): <job>/output/model.tar.gz and
# output.tar.gz, by a plain PutObject or a multipart upload, never with If-None-Match.
SAGEMAKER_OUTPUT = "sagemaker-output"
# In a SageMaker job's container arguments, where torchrun's rendezvous goes: `beacon.launch` replaces it
# with this instance's, from the resource configuration SageMaker writes on every instance.
SAGEMAKER_RENDEZVOUS = "--beacon-sagemaker-rendezvous"
RENDEZVOUS_PORT = 29500  # where node 0's torchrun listens for the others, on EKS and SageMaker
# How a job's container exits when no retry can help (the Job's podFailurePolicy fails it at once): bad input
# (a setting, an argument) and a failed preflight (a sink unreachable, a spool that cannot keep records).
EXIT_BAD_INPUT = 2
EXIT_PREFLIGHT = 3
# What a diagnosis reads of a run (the doctor, the alarm's function): its records, their index, its preflights,
# its final state and its ranks' evidence; never its checkpoints (the model), TensorBoard files or hyperparameters.
DIAGNOSED_KINDS = (EVENTS, INDEX, PREFLIGHT, STATUS, RANKS)
# History that must never be overwritten: create-only writes (If-None-Match: *).
APPEND_ONLY_KINDS = (EVENTS, TENSORBOARD, PARAMS)
# What may be written without If-None-Match: checkpoints (versioning keeps old ones), the final
# status (a restart rewrites it), and what SageMaker writes itself with no conditional header: its
# checkpoint sync and its output upload.
OVERWRITABLE_KINDS = (CHECKPOINTS, STATUS, SAGEMAKER_VOLUME, SAGEMAKER_OUTPUT)

# S3-safe and Kubernetes-label-safe identifiers.
ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def whole_match(pattern: re.Pattern[str] | str, value: object) -> bool:
    """The one rule for a name's pattern: the whole value matches (`re.match` with `$` passes "r1\n")."""
    return isinstance(value, str) and re.fullmatch(pattern, value) is not None


def is_id(value: object) -> bool:
    return whole_match(ID_PATTERN, value)


def is_metric_name(value: object) -> bool:
    return whole_match(METRIC_NAME_PATTERN, value)


def validate_id(kind: str, value: str) -> str:
    if not is_id(value):
        raise ValueError(f"{kind} {value!r} must be 1-63 of a-z, 0-9 and '-', starting with a letter or digit")
    return value


def run_prefix(experiment: str, run: str) -> str:
    return f"{EXPERIMENTS_PREFIX}{experiment}/{run}/"


def events_key(experiment: str, run: str, chunk: int) -> str:
    return f"{run_prefix(experiment, run)}{EVENTS}/chunk-{chunk:08d}.jsonl"


def index_key(experiment: str, run: str, group: int) -> str:
    """The index of chunks `group * INDEX_GROUP` to `(group + 1) * INDEX_GROUP - 1`, create-only, written
    once S3 holds all of them; the chunks after the last index are the run's tail."""
    return f"{run_prefix(experiment, run)}{INDEX}/index-{group:08d}.json"


def rank_evidence_key(experiment: str, run: str, attempt: int, file_name: str) -> str:
    """A rank's last progress document, stack dumps or flight-recorder dump, as the attempt left it."""
    return f"{run_prefix(experiment, run)}{RANKS}/attempt-{attempt:05d}/{file_name}"


def live_rank_evidence_key(experiment: str, run: str, attempt: int, snapshot: int, file_name: str) -> str:
    """A file of the ranks directory as rank 0 uploaded it while a rank stalled: snapshot `snapshot` of
    the attempt (0, 1, ...), create-only, beside the attempt's end-of-attempt files. Readers prefer
    those; the newest complete snapshot stands in while the attempt still hangs."""
    return rank_evidence_key(experiment, run, attempt, f"{LIVE_SNAPSHOT}-{snapshot:05d}/{file_name}")


def node_rank_evidence_key(
    experiment: str, run: str, attempt: int, node: int, file_name: str, *, snapshot: int | None = None
) -> str:
    """A file of the ranks directory as node `node`'s leader (torchrun's GROUP_RANK, LOCAL_RANK 0)
    uploaded it: at the attempt's end, or as its live snapshot `snapshot` while a rank stalled. Create-only,
    under a prefix of its own, so no node's upload can meet another's or rank 0's."""
    live = "" if snapshot is None else f"{LIVE_SNAPSHOT}-{snapshot:05d}/"
    return rank_evidence_key(experiment, run, attempt, f"{NODE}-{node:05d}/{live}{file_name}")


def tensorboard_key(experiment: str, run: str, file_name: str) -> str:
    return f"{run_prefix(experiment, run)}{TENSORBOARD}/{file_name}"


def checkpoint_key(experiment: str, run: str, step: int) -> str:
    return f"{run_prefix(experiment, run)}{CHECKPOINTS}/step-{step:08d}.pt"


def preflight_key(experiment: str, run: str, probe: str) -> str:
    return f"{run_prefix(experiment, run)}{PREFLIGHT}/{probe}"


def final_status_key(experiment: str, run: str) -> str:
    """The run's final state (`FinalState`), written at its end; a later restart rewrites it."""
    return f"{run_prefix(experiment, run)}{STATUS}/final.json"


def hyperparams_key(experiment: str, run: str) -> str:
    """The run's hyperparameters (`hyperparams_document`), create-only: a restart of the run finds the
    first attempt's values there and never replaces them."""
    return f"{run_prefix(experiment, run)}{PARAMS}/hyperparams.json"


def overwritable_resource_patterns() -> list[str]:
    """Key patterns (IAM wildcards) exempt from create-only; everything else in the bucket is.

    IAM's ``*`` matches across ``/``, so a pattern for events/ would also match SageMaker's synced
    copy of the volume (``.../sagemaker-volume/.../events/...``): the exemptions are the precise list.
    """
    return [f"{EXPERIMENTS_PREFIX}*/*/{kind}/*" for kind in OVERWRITABLE_KINDS]


# --- Records ------------------------------------------------------------------------------
# JSON has no NaN or infinity; a strict reader (jq, a browser, Athena) refuses Python's bare `NaN`.
# Non-finite values are therefore written as these strings and read back as the floats they were.
_NON_FINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


# The slow path of a line (non-finite values, what orjson refuses): `json.dumps` with separators
# builds a new encoder per call.
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _encode_value(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _decode_value(value: float | int | str) -> float:
    if isinstance(value, str):
        if value not in _NON_FINITE_TEXT:
            raise ValueError(f"metric value {value!r} is neither a number nor NaN/Infinity/-Infinity")
        return _NON_FINITE_TEXT[value]
    return float(value)


@dataclass(frozen=True, init=False)
class Record:
    """One logged step: every metric of it, faithful (NaN stays NaN). The unit of the spool, of an
    event chunk in S3, and of every reader; `seq` is the spool's gapless sequence number."""

    experiment: str
    run: str
    step: int
    metrics: dict[str, float]
    wall_time: float
    seq: int = -1
    rank: int = 0  # the rank that wrote it: only rank 0 writes
    # The run's attempt that went through this step: 0, then one more at each restart. A restart that
    # resumes from a checkpoint goes through some steps again; see `history`.
    attempt: int = 0

    def __init__(
        self,
        experiment: str,
        run: str,
        step: int,
        metrics: dict[str, float],
        wall_time: float,
        seq: int = -1,
        rank: int = 0,
        attempt: int = 0,
    ) -> None:
        # One write rather than a frozen dataclass's eight: the spool thread makes one per record.
        object.__setattr__(
            self,
            "__dict__",
            {
                "experiment": experiment,
                "run": run,
                "step": step,
                "metrics": metrics,
                "wall_time": wall_time,
                "seq": seq,
                "rank": rank,
                "attempt": attempt,
            },
        )

    @property
    def loss(self) -> float | None:
        return self.metrics.get(LOSS_KEY)

    def to_line(self, seq: int | None = None) -> bytes:
        """The record as one JSON line; `seq` numbers it without a copy (the spool's hot path).

        orjson writes it, ~15x faster than `json`, whose `float.__repr__` took most of the spool thread's
        time. Its text may differ from `json`'s (`0.00001` for `1e-05`, UTF-8 for `\\u` escapes), never
        its values: `from_line`, and any JSON reader, reads both alike."""
        body = {
            "experiment": self.experiment,
            "run": self.run,
            "rank": self.rank,
            "attempt": self.attempt,
            "step": self.step,
            "seq": self.seq if seq is None else seq,
            "wall_time": self.wall_time,
            "metrics": self.metrics,
        }
        if _orjson is not None:
            # orjson writes NaN and infinity as null: any non-finite value makes this sum non-finite (so
            # does an overflow, which only costs the `json` path).
            try:
                if math.isfinite(sum(self.metrics.values(), self.wall_time)):
                    return _orjson.dumps(body, option=_orjson.OPT_APPEND_NEWLINE)
            except Exception:  # not numbers (a text, a tensor), what orjson refuses (an int beyond 64 bits)
                pass  # `json` decides
        try:
            return _LINE_ENCODER.encode(body).encode() + b"\n"
        except ValueError:  # a non-finite value: written as its name (see _NON_FINITE_TEXT)
            body["metrics"] = {name: _encode_value(value) for name, value in self.metrics.items()}
            return _LINE_ENCODER.encode(body).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes | str) -> Record:
        body = json.loads(line)
        return cls(
            experiment=str(body["experiment"]),
            run=str(body["run"]),
            step=int(body["step"]),
            metrics={str(name): _decode_value(value) for name, value in body["metrics"].items()},
            wall_time=float(body["wall_time"]),
            seq=int(body["seq"]),
            rank=int(body.get("rank", 0)),
            attempt=int(body.get("attempt", 0)),
        )


@dataclass(frozen=True)
class History:
    """A run's records as the model went through them. Several `run.log` calls for one step are one
    step: their metrics merge, in sequence order, into one live record (an evaluation logged at the
    step it ran after belongs to that step). When attempt k resumes from a checkpoint and first logs
    step N, the records of earlier attempts from step N on describe a past the model no longer has:
    they are superseded (kept in S3, marked here, never deleted)."""

    live: list[Record]  # one per step, in step order, its metrics merged from every call for the step
    superseded: list[Record]
    duplicated: list[Record]  # logged a metric its (attempt, step) already had: a second writer

    @property
    def live_steps(self) -> list[int]:
        return [record.step for record in self.live]

    @property
    def attempts(self) -> list[int]:
        return sorted({record.attempt for record in (*self.live, *self.superseded)})


def history(records: Iterable[Record]) -> History:
    """Sort `records` into the live history, the superseded records and the duplicates. The records of
    one (attempt, step) merge in sequence order; one that logs a metric its step already has is a
    duplicate (never expected of one writer) and merges nothing. An attempt's first logged step is
    where it took over: a record of attempt a at step s is superseded when a later attempt first
    logged at or before s."""
    first_step: dict[int, int] = {}
    merged: dict[tuple[int, int], Record] = {}
    duplicated: list[Record] = []
    for record in sorted(records, key=lambda r: r.seq):
        key = (record.attempt, record.step)
        earlier = merged.get(key)
        if earlier is None:
            merged[key] = record
        elif earlier.metrics.keys() & record.metrics.keys():
            duplicated.append(record)
            continue
        else:
            merged[key] = replace(earlier, metrics={**earlier.metrics, **record.metrics})
        first_step[record.attempt] = min(first_step.get(record.attempt, record.step), record.step)
    # The earliest step any later attempt took over at, for each attempt.
    taken_over_at: dict[int, float] = {}
    earliest = math.inf
    for attempt in sorted(first_step, reverse=True):
        taken_over_at[attempt] = earliest
        earliest = min(earliest, first_step[attempt])
    live: list[Record] = []
    superseded: list[Record] = []
    for (attempt, step), record in merged.items():
        (superseded if step >= taken_over_at[attempt] else live).append(record)
    live.sort(key=lambda r: r.step)
    superseded.sort(key=lambda r: (r.attempt, r.step))
    return History(live, superseded, duplicated)


def _plain(value: Any) -> Any:
    """`value` as strict JSON: mappings and sequences kept, non-finite floats as in records, a
    one-element tensor or NumPy scalar as its number, anything else as its text."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((_plain(item) for item in value), key=str)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _encode_value(value)
    if single_number(value):
        return _plain(value.item())
    return str(value)


def single_number(value: Any) -> bool:
    """A one-element tensor (`numel()`) or NumPy value (`size`): one number behind `.item()`."""
    if not hasattr(value, "item"):
        return False
    numel = getattr(value, "numel", None)
    return bool(numel() == 1) if callable(numel) else getattr(value, "size", None) == 1


def unloggable(value: Any) -> str:
    """Why `value` cannot be a metric's value ("" when it can): a real number, or a one-element real tensor or NumPy
    value. Its type and element count only, never its value: a CUDA tensor's would wait for the device."""
    if isinstance(value, int | float):  # bool too
        return ""
    if not single_number(value):
        shape = getattr(value, "shape", None)
        return f"a {type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")
    is_complex = getattr(value, "is_complex", None)  # a tensor's dtype; NumPy's says its kind
    if is_complex() if callable(is_complex) else getattr(getattr(value, "dtype", None), "kind", "f") == "c":
        return f"a complex {type(value).__name__}"
    return ""


def hyperparams_document(params: Mapping[str, Any]) -> bytes:
    """The body of `hyperparams_key`: strict JSON, keys sorted, so equal values give equal bytes."""
    return json.dumps(_plain(params), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class ChunkSummary:
    """What one event chunk holds, without its records: an entry of the run's index."""

    chunk: int
    records: int
    first_seq: int
    last_seq: int
    first_step: int
    last_step: int
    attempts: tuple[int, ...]
    first_wall_time: float
    last_wall_time: float

    @classmethod
    def of(cls, chunk: int, records: list[Record]) -> ChunkSummary:
        return cls(
            chunk=chunk,
            records=len(records),
            first_seq=min(r.seq for r in records),
            last_seq=max(r.seq for r in records),
            first_step=min(r.step for r in records),
            last_step=max(r.step for r in records),
            attempts=tuple(sorted({r.attempt for r in records})),
            first_wall_time=min(r.wall_time for r in records),
            last_wall_time=max(r.wall_time for r in records),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "attempts": list(self.attempts)}

    @classmethod
    def from_dict(cls, body: Mapping[str, Any]) -> ChunkSummary:
        """An index entry; ValueError naming the field when it is not one (a reader sets its document aside)."""
        if not isinstance(body, Mapping):
            raise ValueError(f"an index entry is not a JSON object but {type(body).__name__}")
        values: dict[str, Any] = {}
        for name in ("chunk", "records", "first_seq", "last_seq", "first_step", "last_step"):
            value = body.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: {value!r} is not a count")
            values[name] = value
        for name in ("first_wall_time", "last_wall_time"):
            value = body.get(name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name}: {value!r} is not a time")
            values[name] = float(value)
        attempts = body.get("attempts")
        if not isinstance(attempts, list) or not all(type(a) is int and a >= 0 for a in attempts):
            raise ValueError(f"attempts: {attempts!r} is not a list of attempts")
        return cls(**values, attempts=tuple(attempts))


def index_document(group: int, summaries: list[ChunkSummary]) -> bytes:
    body = {"group": group, "chunks_per_group": INDEX_GROUP, "chunks": [s.to_dict() for s in summaries]}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def summaries_of(document: bytes) -> list[ChunkSummary]:
    return [ChunkSummary.from_dict(entry) for entry in json.loads(document)["chunks"]]


def records_of(body: bytes | str) -> list[Record]:
    """Every record of one event chunk (or spool file), in order."""
    lines = body.splitlines() if isinstance(body, str) else body.decode().splitlines()
    return [Record.from_line(line) for line in lines if line.strip()]


# The metric every record of a training loop is expected to carry; the loss curve, the loss alarms
# and the doctor's divergence verdict read it.
LOSS_KEY = "loss"
# What a metric name may be: a CloudWatch metric name and a TensorBoard tag alike.
METRIC_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,250}")


class FinalState(StrEnum):
    """How a run ended, written once at its end (`final_status_key`). A run with none and no
    heartbeat had no clean exit: killed, its node lost, or its process hung until it was removed."""

    FINISHED = "finished"
    FAILED = "failed"  # with the exception's type
    PREEMPTED = "preempted"  # SIGTERM: spot interruption, eviction, a stopped SageMaker job


# --- Log lines ---------------------------------------------------------------------------
# Rank 0 logs one progress line every few steps: people read it in pod logs, and SageMaker's
# metric definitions parse it (the regexes below are what `beacon smoke` sends).
PROGRESS_LOG_INTERVAL = 10


def progress_line(step: int, loss: float) -> str:
    return f"beacon-progress step={step} loss={loss:.6f}"


PROGRESS_LOG_METRICS = {
    "step": r"beacon-progress step=(\d+)",
    "loss": r"beacon-progress step=\d+ loss=([0-9.eE+-]+)",
}


# --- Liveness ---------------------------------------------------------------------------
def liveness_file(base: str, local_rank: int) -> str:
    """The pod-local file one rank touches; a pod's probes check one per local rank."""
    return f"{base}.{local_rank}"


# --- CloudWatch ------------------------------------------------------------------------
# One namespace per team: CloudWatch has no condition key for dimensions, so the namespace is
# what keeps one team's writer from feeding another team's alarms.
NAMESPACE_PREFIX = "Beacon"


def metric_namespace(team: str) -> str:
    return f"{NAMESPACE_PREFIX}/{team}"


class Dim(StrEnum):
    TEAM = "Team"
    EXPERIMENT = "Experiment"
    RUN = "Run"
    PHASE = "Phase"  # PhaseSeconds only


class Phase(StrEnum):
    """What the loop is doing. Time in any phase but TRAINING is work, not a stall: ProgressAge
    leaves it out, and PhaseSeconds shows it."""

    TRAINING = "training"
    SETUP = "setup"  # preflight, resume (checkpoint load), model and data loader start, compile
    EVALUATION = "evaluation"
    CHECKPOINT = "checkpoint"  # the loop's hand-over of a checkpoint


class Unit(StrEnum):
    NONE = "None"
    COUNT = "Count"
    SECONDS = "Seconds"
    MILLISECONDS = "Milliseconds"
    COUNT_PER_SECOND = "Count/Second"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: Unit
    high_resolution: bool = False

    @property
    def storage_resolution(self) -> int:
        return 1 if self.high_resolution else 60


LOSS = Metric("Loss", Unit.NONE)
STEP = Metric("Step", Unit.COUNT)
STEPS_PER_SECOND = Metric("StepsPerSecond", Unit.COUNT_PER_SECOND)
# Sent by a thread independent of the loop; high resolution so the alarm can use 30 s periods.
HEARTBEAT = Metric("Heartbeat", Unit.COUNT, high_resolution=True)
# Seconds since the loop last finished a step, minus time spent in a phase (setup, evaluation, checkpoint).
PROGRESS_AGE = Metric("ProgressAge", Unit.SECONDS, high_resolution=True)
UPLOAD_LATENCY = Metric("UploadLatency", Unit.MILLISECONDS)
UPLOAD_FAILURES = Metric("UploadFailures", Unit.COUNT)
SPOOL_BACKLOG = Metric("SpoolBacklog", Unit.COUNT)
CHECKPOINT_SECONDS = Metric("CheckpointSeconds", Unit.SECONDS)
# Loss values that were NaN or infinite in the window. CloudWatch refuses such values (one of them
# fails the whole request, heartbeat included), so they are counted here and kept only in the spool.
NON_FINITE_LOSS = Metric("NonFiniteLoss", Unit.COUNT)
# Checkpoints skipped in the window because the one before was still being written (a slow disk, S3 away),
# and, beside them, how many steps a crash now would redo: those since the newest checkpoint it resumes from.
CHECKPOINTS_SKIPPED = Metric("CheckpointsSkipped", Unit.COUNT)
STEPS_SINCE_CHECKPOINT = Metric("StepsSinceCheckpoint", Unit.COUNT)
# CloudWatch's accepted range for a value: beyond it, or not finite, a datum fails the request.
CLOUDWATCH_VALUE_LIMIT = 2.0**360
# Seconds the loop has been in its current phase other than training, with a Phase dimension; sent
# with each heartbeat while such a phase lasts, so it is not among the metrics every run has.
PHASE_SECONDS = Metric("PhaseSeconds", Unit.SECONDS, high_resolution=True)

# The cross-rank view, sent by rank 0 of a job with more than one rank (`beacon.ranks`): the
# progress age of the slowest rank (a hung or dead rank stops rewriting its document and ages), and
# how many steps lie between the furthest and the least advanced rank.
SLOWEST_RANK_PROGRESS_AGE = Metric("SlowestRankProgressAge", Unit.SECONDS, high_resolution=True)
RANK_STEP_SPREAD = Metric("RankStepSpread", Unit.COUNT, high_resolution=True)
RANK_METRICS = (SLOWEST_RANK_PROGRESS_AGE, RANK_STEP_SPREAD)

JOB_METRICS = (
    LOSS,
    STEP,
    STEPS_PER_SECOND,
    HEARTBEAT,
    PROGRESS_AGE,
    UPLOAD_LATENCY,
    UPLOAD_FAILURES,
    SPOOL_BACKLOG,
    CHECKPOINT_SECONDS,
)
# Sent only when something happened: verification does not expect them in every run.
EVENT_METRICS = (NON_FINITE_LOSS, PHASE_SECONDS, CHECKPOINTS_SKIPPED, STEPS_SINCE_CHECKPOINT)
# Per-run metrics carry all three; team roll-ups (for team alarms) carry Team only.
RUN_DIMENSIONS = (Dim.TEAM, Dim.EXPERIMENT, Dim.RUN)
TEAM_DIMENSIONS = (Dim.TEAM,)
# Delivery signals are also sent rolled up per team, so one team alarm covers every run.
TEAM_ROLLUP_METRICS = (UPLOAD_FAILURES, SPOOL_BACKLOG)


def run_dimensions(team: str, experiment: str, run: str) -> dict[str, str]:
    return {Dim.TEAM.value: team, Dim.EXPERIMENT.value: experiment, Dim.RUN.value: run}


def team_dimensions(team: str) -> dict[str, str]:
    return {Dim.TEAM.value: team}


def phase_dimensions(team: str, experiment: str, run: str, phase: str) -> dict[str, str]:
    return {**run_dimensions(team, experiment, run), Dim.PHASE.value: str(phase)}


def team_metric(name: str) -> Metric:
    """A metric the team logs and lists for CloudWatch (`cloudwatch_metrics`), beside the contract's."""
    return Metric(name, Unit.NONE)


def reserved_metric_names() -> frozenset[str]:
    return frozenset(metric.name for metric in (*JOB_METRICS, *EVENT_METRICS, *RANK_METRICS))


# Container Insights (the CloudWatch Observability add-on) publishes these.
CONTAINER_INSIGHTS_NAMESPACE = "ContainerInsights"
# 1 while a pod is in phase Failed. Jobs run restartPolicy Never: a failure is a new pod, never a
# container restart. Published per pod only (no {ClusterName, Namespace} roll-up).
CONTAINER_FAILED_PODS = "pod_status_failed"
CONTAINER_INSIGHTS_POD_DIMENSIONS = ("ClusterName", "Namespace", "PodName")
TRAINING_NAMESPACE = "training"


# --- Health alarms: periods and budgets -------------------------------------------------
# A job is silent when its heartbeat stops; stalled when the heartbeat lives but steps do not
# advance. Per-run alarms exist only while a run does (the job creates them after preflight and
# deletes them on a clean exit), so an idle team has nothing that can sit in ALARM.
SILENT_BUDGET_S = 120
STALLED_BUDGET_S = 180
HEARTBEAT_PERIOD_S = 30  # high-resolution metrics allow 10, 20 or 30 s periods
SILENT_EVALUATION_PERIODS = 3  # last beat, then 3 empty periods: ALARM by last beat + 120 s
STALL_THRESHOLD_S = 90  # ProgressAge above this is not progress (checkpoint time excluded)
# A named phase pauses the stall clock this long at most: a rank hung inside its checkpoint or evaluation
# (a collective in a save, a dead mount) then reads as stalled once the phase is this old (`RunSettings.phase_limit`).
PHASE_LIMIT_S = 1800
STALLED_EVALUATION_PERIODS = 2  # beat after threshold + 2 periods: ALARM by stall + 165 s
DELIVERY_PERIOD_S = 60
DELIVERY_EVALUATION_PERIODS = 3
DELIVERY_DATAPOINTS_TO_ALARM = 2
BACKLOG_THRESHOLD_RECORDS = 500
RESTARTS_PERIOD_S = 60

ALARM_PREFIX = "beacon"
EXPERIMENT_PLACEHOLDER = "${Experiment}"
RUN_PLACEHOLDER = "${Run}"


class RunAlarm(StrEnum):
    SILENT = "silent"
    STALLED = "stalled"
    METRICS_LOST = "metrics-lost"


class TeamAlarm(StrEnum):
    UPLOAD_FAILURES = "upload-failures"
    SPOOL_BACKLOG = "spool-backlog"
    RESTARTS = "restarts"


def run_alarm_prefix(team: str) -> str:
    return f"{ALARM_PREFIX}-{team}-run-"


def alarm_prefix_collision(team: str) -> str | None:
    """Why this team name would let another team's alarm grant match its alarms, or None.

    Team ``a``'s writer manages ``beacon-a-run-*``; a team named ``a-run`` or ``a-run-b`` would have
    alarms inside that pattern. So no hyphen-separated part after the first may be ``run``.
    """
    if "run" in team.split("-")[1:]:
        return f"'run' after a hyphen would put its alarms inside team {team.split('-run')[0]!r}'s run alarms"
    return None


def run_alarm_name(team: str, experiment: str, run: str, kind: RunAlarm) -> str:
    return f"{run_alarm_prefix(team)}{experiment}-{run}-{kind.value}"


def team_alarm_name(team: str, kind: TeamAlarm) -> str:
    return f"{ALARM_PREFIX}-{team}-{kind.value}"


def smoke_min_duration_s(heartbeat_interval_s: float) -> float:
    """How long a smoke run must last for its run alarms to arm and be evaluated at least once:
    the first heartbeat's period closes, and a beat or two follow."""
    return HEARTBEAT_PERIOD_S * 2 + heartbeat_interval_s


def run_alarm_parameter_name(team: str) -> str:
    return f"/beacon/{team}/run-alarm-template"


def render_run_alarms(template: str, experiment: str, run: str) -> dict[str, Any]:
    """Fill a run-alarm template (JSON from the monitoring stack) for one run."""
    validate_id("experiment", experiment)
    validate_id("run", run)
    filled = template.replace(EXPERIMENT_PLACEHOLDER, experiment).replace(RUN_PLACEHOLDER, run)
    return dict(json.loads(filled))


def run_alarms_arm_at(first_heartbeat_at: float) -> float:
    """When a job may create its run alarms: once the period holding its first heartbeat closed.

    The silent alarm treats missing data as breaching; created earlier, it would find only empty
    periods to evaluate and open in ALARM.
    """
    return (math.floor(first_heartbeat_at / HEARTBEAT_PERIOD_S) + 1) * HEARTBEAT_PERIOD_S
