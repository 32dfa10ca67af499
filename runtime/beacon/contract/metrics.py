"""What a run publishes to CloudWatch: its namespace, dimensions, metrics and units, and the liveness file."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
# ProgressAge over the run's stall threshold (`contract.pace`: `stall_dump_after`, or sooner at the run's own pace,
# the longest any rank states): 1 or more is stalled. The stalled alarm's metric: one threshold, the run's, whatever
# its step time.
STALL_RATIO = Metric("StallRatio", Unit.NONE, high_resolution=True)
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

# The cross-rank view, sent by rank 0 of a job with more than one rank (`beacon.evidence.ranks`): the
# progress age of the slowest rank (a hung or dead rank stops rewriting its document and ages), and
# how many steps lie between the furthest and the least advanced rank.
SLOWEST_RANK_PROGRESS_AGE = Metric("SlowestRankProgressAge", Unit.SECONDS, high_resolution=True)
RANK_STEP_SPREAD = Metric("RankStepSpread", Unit.COUNT, high_resolution=True)
# The share of each step the other ranks wait for the slowest one (`contract.pace.straggler_of`), once every rank
# timed its collectives (`run.watch`) over a full window: the slow-rank alarm's metric.
STRAGGLER_WAIT_SHARE = Metric("StragglerWaitShare", Unit.NONE, high_resolution=True)
RANK_METRICS = (SLOWEST_RANK_PROGRESS_AGE, RANK_STEP_SPREAD, STRAGGLER_WAIT_SHARE)
# The run's step time over its own baseline (`contract.pace.run_slowed`), sent by rank 0 (or a run's one rank) once it
# has a baseline, while it steps and no rank stands out: the slowed alarm's metric.
STEP_TIME_RATIO = Metric("StepTimeRatio", Unit.NONE, high_resolution=True)

JOB_METRICS = (
    LOSS,
    STEP,
    STEPS_PER_SECOND,
    HEARTBEAT,
    PROGRESS_AGE,
    STALL_RATIO,
    UPLOAD_LATENCY,
    UPLOAD_FAILURES,
    SPOOL_BACKLOG,
    CHECKPOINT_SECONDS,
)
# Sent only when something happened: verification does not expect them in every run.
EVENT_METRICS = (NON_FINITE_LOSS, PHASE_SECONDS, CHECKPOINTS_SKIPPED, STEPS_SINCE_CHECKPOINT, STEP_TIME_RATIO)
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
