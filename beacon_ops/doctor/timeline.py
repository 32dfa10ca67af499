"""One timeline: the gap in a run's metrics lined up with what happened around it (a pod created or
deleted, a node interrupted, a container OOMKilled, a line in its log, the last record in S3, the last
heartbeat), oldest first, each placed in seconds from the gap: the moment the run's metrics stopped.
Pure: every source is read by its own reader first."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from beacon_ops.doctor.orchestrator import OrchestratorState
from beacon_ops.doctor.rank_verdict import RankVerdict
from beacon_ops.doctor.verdict import Verdict
from beacon_ops.evidence.reading import RunEvidence

MOST_MOMENTS = 40  # of the orchestrator's events, the newest: a pod's events can repeat for hours


@dataclass(frozen=True)
class Moment:
    at: datetime
    source: str  # orchestrator, sagemaker, logs, metrics, s3, ranks
    what: str
    from_gap_s: float | None = None  # seconds after the gap (negative: before it); None when there is no gap

    def line(self) -> str:
        offset = ""
        if self.from_gap_s is not None:
            offset = "t" if abs(self.from_gap_s) < 0.5 else f"t{self.from_gap_s:+.0f} s"
        return f"{self.at:%H:%M:%S} {offset:>9}  {self.source}: {self.what}"


def orchestrator_moments(state: OrchestratorState | None) -> list[Moment]:
    """The Job's creation and conditions, each pod's creation and its containers' starts and ends (the
    previous run of a restarted one too), its nodes' creation, unhealthy conditions and deletion, and the
    events on the Job, its pods and their nodes."""
    job = state.job if state is not None else None
    if job is None:
        return []
    found = [Moment(job.created_at, "orchestrator", f"Job {job.name} created")] if job.created_at else []
    found += [
        Moment(c.at, "orchestrator", f"Job {c.type}={c.status} {c.reason}: {c.message}".rstrip(": "))
        for c in job.conditions
        if c.at is not None
    ]
    for pod in job.pods:
        if pod.created_at:
            found.append(Moment(pod.created_at, "orchestrator", f"pod {pod.name} created on {pod.node or 'no node'}"))
        for c in pod.containers:
            where = f"container {c.name} of pod {pod.name}"
            if c.last_finished_at:
                found.append(
                    Moment(
                        c.last_finished_at, "orchestrator", f"{where} ended {_ending(c.last_reason, c.last_exit_code)}"
                    )
                )
            if c.started_at:
                found.append(Moment(c.started_at, "orchestrator", f"{where} started"))
            if c.finished_at:
                found.append(Moment(c.finished_at, "orchestrator", f"{where} ended {_ending(c.reason, c.exit_code)}"))
    for node in job.nodes:
        if node.created_at:
            found.append(Moment(node.created_at, "orchestrator", f"node {node.name} created"))
        for health in node.unhealthy:
            if health.since:
                found.append(Moment(health.since, "orchestrator", f"node {node.name}: {health.quoted()}"))
        if node.deleting_since:
            found.append(Moment(node.deleting_since, "orchestrator", f"node {node.name} deleted: Karpenter drains it"))
    events = [e for e in job.events if e.at is not None]
    for event in events[-MOST_MOMENTS:]:
        assert event.at is not None
        count = f" (x{event.count})" if event.count > 1 else ""
        text = f"{event.type} {event.reason} on {event.kind} {event.name}: {event.message}{count}"
        found.append(Moment(event.at, "orchestrator", text))
    return found


def _ending(reason: str, exit_code: int | None) -> str:
    return f"{reason or 'terminated'}" + (f" (exit code {exit_code})" if exit_code is not None else "")


def training_job_moments(description: dict[str, Any] | None) -> list[Moment]:
    """SageMaker's own history of the job: its secondary status transitions, and its end."""
    if not description:
        return []
    found = []
    for transition in description.get("SecondaryStatusTransitions") or []:
        if isinstance(transition.get("StartTime"), datetime):
            message = f": {transition['StatusMessage']}" if transition.get("StatusMessage") else ""
            found.append(Moment(transition["StartTime"], "sagemaker", f"{transition.get('Status')}{message}"))
    if isinstance(description.get("TrainingEndTime"), datetime):
        reason = f": {description['FailureReason']}" if description.get("FailureReason") else ""
        status = description.get("TrainingJobStatus", "ended")
        found.append(Moment(description["TrainingEndTime"], "sagemaker", f"training job {status}{reason}"))
    return found


def verdict_moments(verdicts: Iterable[Verdict]) -> list[Moment]:
    """Verdicts that know when their evidence happened (a log line's time)."""
    return [Moment(v.at, v.check, f"{v.verdict}: {v.evidence}") for v in verdicts if v.at is not None]


def timeline(moments: Iterable[Moment], *, gap: datetime | None) -> list[Moment]:
    """Oldest first, each placed from `gap` (the last heartbeat, else the last record in S3)."""
    placed = [
        Moment(m.at, m.source, m.what, None if gap is None else (m.at - gap).total_seconds())
        for m in moments
        if m.at.tzinfo is not None
    ]
    return sorted(placed, key=lambda m: m.at)


def evidence_moments(evidence: RunEvidence, stopped: RankVerdict | None) -> list[Moment]:
    """What the run itself left in S3: each attempt's start (its preflight), the newest record read, the
    final state; and the rank that stopped, its last step and last word."""
    found = []
    for attempt, preflight in enumerate(evidence.preflights):
        at = _parsed(preflight.get("started_at"))
        if at is not None:
            found.append(Moment(at, "s3", f"attempt {attempt} passed its preflight on {preflight.get('host', '?')}"))
    newest = evidence.newest_record_at
    if newest is not None:
        found.append(Moment(_wall(newest[0]), "s3", f"the newest record in S3 was logged: step {newest[1]}"))
    if evidence.final is not None and isinstance(evidence.final.get("ended_at"), int | float):
        state = evidence.final.get("state", "finished")
        found.append(Moment(_wall(evidence.final["ended_at"]), "s3", f"final state written: {state}"))
    if stopped is not None:
        documents = {r.rank: r for r in evidence.ranks()[0]}
        document = documents.get(stopped.rank)
        if document is not None:
            found.append(
                Moment(
                    _wall(document.last_step_wall_time),
                    "ranks",
                    f"rank {stopped.rank} dispatched step {document.step}, its last",
                )
            )
            if document.ended:
                found.append(
                    Moment(_wall(document.wall_time), "ranks", f"rank {stopped.rank}'s last word: {document.ended}")
                )
    return found


def _wall(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _parsed(text: Any) -> datetime | None:
    try:
        at = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
