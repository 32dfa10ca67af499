"""`beacon doctor`: why are my metrics missing? The usual causes, checked in order.

Each check is a verdict with its evidence and the fix, listed in order of likelihood. The
diagnosis names the root cause: a refused write explains silence, not the other way round.
"""

from __future__ import annotations

import math
import re
import statistics
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract
from beacon.contract.pace import (
    RUN_SLOWED_FOR_S,
    RUN_SLOWED_RATIO,
    SLOW_RANK_SHARE,
    rank_slow,
    run_slowed,
    run_stall_after,
    slow_rank_share_problem,
)
from beacon.contract.rank_evidence import SIGNAL_DUMP, RankProgress, signal_stacks_name, stacks_name
from botocore.exceptions import BotoCoreError, ClientError

from beacon_ops.doctor.flight_recorder import FlightRecorderReading, ranks_in_a_collective, read_flight_recorder
from beacon_ops.doctor.orchestrator import CHECK as CHECK_ORCHESTRATOR
from beacon_ops.doctor.orchestrator import NodeView, OrchestratorState, orchestrator_verdict, running_now
from beacon_ops.doctor.rank_verdict import RankVerdict, slow_rank, which_rank
from beacon_ops.doctor.run_cost import cost_verdict, placement
from beacon_ops.doctor.sagemaker_state import TrainingJobReading
from beacon_ops.doctor.timeline import (
    Moment,
    evidence_moments,
    orchestrator_moments,
    timeline,
    training_job_moments,
    verdict_moments,
)
from beacon_ops.doctor.verdict import FAIL, INFO, OK, WARN, Verdict
from beacon_ops.evidence.reading import RunEvidence, alarm_states, metric_samples, read_run

__all__ = ["FAIL", "INFO", "OK", "WARN", "Diagnosis", "DoctorInputs", "Verdict", "diagnose", "diagnose_job"]
# The orchestrator's verdicts that say a job failed but not why: a failure in its log, when there is one, says why.
UNEXPLAINED = frozenset({"exit-code", "job-failed"})
# The orchestrator's verdicts for a job not yet running: they say why a run that never started is silent.
NOT_YET_RUNNING = frozenset({"waiting-for-node", "starting"})
# Beacon's verdicts that say why a container exited, and lead a bare exit code.
BEACON_SPECIFIC = frozenset({"endpoint", "permission", "spool", "ranks", "rank", "job"})
SLOW_RANK_FIX = (
    "look at that node: its GPUs' clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE), its network, a noisy "
    "neighbour; to move the run off it, cordon the node and restart the run from its checkpoint"
)
SLOW_RANK_0_FIX = (
    "rank 0 does work the others do not: Beacon's own is off the training thread, but a loop's logging, printing "
    "or evaluation on rank 0 alone is on it; move such work out of the step, else look at rank 0's node (its GPUs' "
    "clocks, its network)"
)
# Every rank slower alike: what they share
SLOWED_RUN_FIX = (
    "look at what every rank shares: the data pipeline (DataLoader workers, the dataset's storage and its throughput), "
    "the network between nodes, a noisy neighbour on the file system; a step that grew with the run (a longer "
    "sequence, a leak) slows it alike"
)
# Past the run's paced threshold, short of its stall_dump_after: what a pause the loop did not name may be
PAUSE_ADVICE = (
    "not yet a stall: if this is an evaluation or a data loader's restart, wrap it in run.phase('evaluation') (a named "
    "phase is work)"
)
SILENT_BEATS = 3  # heartbeats missed before the doctor calls a run silent
# ... and never sooner than this: a beat sent takes seconds to be read back from CloudWatch, so a run beating every
# second would read as silent between each beat and its reading.
SILENT_FLOOR_S = 30.0


@dataclass
class Diagnosis:
    team: str
    experiment: str
    run: str
    diagnosis: str
    verdicts: list[Verdict] = field(default_factory=list)
    heartbeat_age_s: float | None = None
    progress_age_s: float | None = None
    lead: str = ""  # the check whose verdict is the cause
    stopped_rank: RankVerdict | None = None  # the rank that stopped a multi-rank run, with its stack
    orchestrator: OrchestratorState | None = None  # what the orchestrator said about the job, when asked
    flight_recorder: FlightRecorderReading | None = None  # the ranks' flight-recorder dumps, read by torch
    training_job: TrainingJobReading | None = None  # a SageMaker job: what DescribeTrainingJob said
    # Everything around the gap, oldest first, placed from it (the last heartbeat, else the newest record)
    timeline: list[Moment] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.diagnosis in ("healthy", "finished")

    def headline(self) -> str:
        """One line: the cause and the evidence of the verdict that names it, e.g. `rank-hung: rank 3 on
        pod train-1, node node-1 hung at step 51 in training (train.py:12 in forward); 3 rank(s) wait in ...`."""
        lead = next((v for v in self.verdicts if v.check == self.lead), None)
        return f"{self.diagnosis}: {lead.evidence}" if lead is not None else self.diagnosis

    def timeline_lines(self) -> list[str]:
        return [moment.line() for moment in self.timeline]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy, "headline": self.headline()}


@dataclass
class DoctorInputs:
    team: str
    experiment: str
    run: str
    bucket: str
    region: str
    s3: Any  # read access to the bucket
    cloudwatch: Any  # read access to metrics and alarms
    probe_s3: Any | None = None  # the job's identity, for the write probe
    probe_unavailable: str = ""  # why there is no probe_s3 (the writer role trusts only the job's services)
    stall_after_s: float | None = None  # the stall threshold; None: the run's own (its preflight), else Beacon's
    now: datetime | None = None
    # The job as its orchestrator sees it, read by the caller (`beacon doctor` reads the Kubernetes API; the
    # alarm's Lambda does not): its verdict leads the others when it fails.
    orchestrator: OrchestratorState | None = None
    training_job: TrainingJobReading | None = None  # the SageMaker job, as its orchestrator sees it
    logs: tuple[Verdict, ...] = ()  # the job's container logs, classified (log_reader.read_log_verdicts)
    # Or how to read them once the gap is known (the last heartbeat, else the newest record): the last lines
    # before it are read too (`beacon doctor` passes this; the alarm's Lambda reads no logs).
    read_logs: Callable[[datetime | None], tuple[Verdict, ...]] | None = None
    # The team's own hourly prices ({"on-demand": {type: $}, "spot": {...}}, its team file's), over the list prices
    prices: dict[str, dict[str, float]] = field(default_factory=dict)

    def orchestrator_verdict(self) -> Verdict | None:
        if self.orchestrator is not None:
            return orchestrator_verdict(self.orchestrator)
        return self.training_job.verdict if self.training_job is not None else None


def leading(orchestrator: Verdict | None, logs: Sequence[Verdict]) -> Verdict | None:
    """The cause the orchestrator and the logs name, if they name one: the orchestrator's when it says why (the
    kernel's OOM kill, a node taken, an image not pulled, SageMaker's FailureReason), else the log's first failure
    (a container's start first), else the orchestrator's bare failure."""
    failing_log = next((v for v in logs if v.status == FAIL), None)
    if orchestrator is not None and orchestrator.status != FAIL:
        # Running (restarted or resumed too) or finished: its log's timeouts and refused connections were retried
        # past (the TCPStore's "Connection refused" while the workers wait for rank 0, say): evidence, not the
        # cause. A job the orchestrator cannot show (gone, unreadable, not yet started) has its log as the best
        # evidence.
        return None if orchestrator.status == OK or running_now(orchestrator) else failing_log
    explains = orchestrator is not None and (orchestrator.verdict not in UNEXPLAINED or failing_log is None)
    return orchestrator if explains else failing_log


def settled(orchestrator: Verdict | None, logs: Sequence[Verdict]) -> tuple[Verdict, ...]:
    """The log's verdicts, each failure a warning when the orchestrator says the job runs now or ran fine."""
    if orchestrator is None or not (orchestrator.status == OK or running_now(orchestrator)):
        return tuple(logs)
    return tuple(replace(v, status=WARN) if v.status == FAIL else v for v in logs)


def diagnose(inputs: DoctorInputs, *, evidence: RunEvidence | None = None) -> Diagnosis:
    """evidence: the run as its caller already read it (smoke's verification), so it is read once."""
    now = inputs.now or datetime.now(UTC)
    if evidence is None:
        # A run of any length: the index's summaries, and the chunks after them (smoke passes a full reading)
        evidence = read_run(inputs.s3, inputs.bucket, inputs.experiment, inputs.run, tail_only=True)
    dims = contract.run_dimensions(inputs.team, inputs.experiment, inputs.run)
    interval = float((evidence.preflight or {}).get("heartbeat_interval", contract.HEARTBEAT_INTERVAL_S))
    # The run's own stall threshold, when its preflight says it (a run of another version: the doctor's); and the
    # sooner one its ranks' documents state from their pace (`contract.pace.run_stall_after`): between the two, a
    # pause the loop did not name is said as one, not as a hang (a hung rank the rank check names still leads)
    stall_after = inputs.stall_after_s or float(
        (evidence.preflight or {}).get("stall_dump_after", contract.STALL_THRESHOLD_S)
    )
    documents = evidence.ranks()[0]
    paced_after = run_stall_after((r.stall_after_s for r in documents), stall_after)
    beats = _samples(inputs, contract.HEARTBEAT, dims, "SampleCount", now)
    progress = _samples(inputs, contract.PROGRESS_AGE, dims, "Maximum", now)
    # Ages as of the moment the metrics were read, not of whatever reading follows (the flight recorders' takes
    # seconds): a beat that arrived meanwhile was not seen, and must not count as missed.
    read_at = inputs.now or datetime.now(UTC)
    heartbeat_age = (read_at - beats[-1].at).total_seconds() if beats else None
    progress_age = progress[-1].value + (read_at - progress[-1].at).total_seconds() if progress else None

    world_size = max((r.world_size for r in evidence.ranks()[0]), default=0)
    recorder = read_flight_recorder(evidence.flight_recorder_dumps(), world_size=world_size)
    # A slow rank is named from the ranks' documents rank 0 uploaded while it was slow, if its heartbeat has said so for
    # the verdict's span and still does (`contract.pace.rank_slow`), at the run's own share (its team file's, as its
    # preflight record states it; the default for a run of another version)
    shares = _samples(inputs, contract.STRAGGLER_WAIT_SHARE, dims, "Minimum", now)
    fresh_for = max(SILENT_FLOOR_S, SILENT_BEATS * interval)
    stated = (evidence.preflight or {}).get("slow_rank_share", SLOW_RANK_SHARE)
    share = SLOW_RANK_SHARE if slow_rank_share_problem(stated) else float(stated)
    samples = [(s.at.timestamp(), s.value) for s in shares]
    slow_share = rank_slow(samples, read_at.timestamp(), gap_s=fresh_for, share=share)
    # A rank stopped outside a collective while the others wait, its progress not yet `stall_after` old: named, as a
    # pause it may be (an evaluation on one rank the loop did not wrap), not yet as a hang
    stall = Stall(stall_after, read_at.timestamp(), progress_age)
    job = inputs.orchestrator.job if inputs.orchestrator is not None else None
    nodes = {node.name: node for node in job.nodes if node.exists} if job is not None else {}
    rank_check, stopped = _stopped_rank(
        evidence, recorder, slow_share=slow_share, share=share, stall=stall, nodes=nodes
    )
    ratios = _samples(inputs, contract.STEP_TIME_RATIO, dims, "Minimum", now)
    platform = inputs.orchestrator_verdict()
    newest = evidence.newest_record_at
    gap = beats[-1].at if beats else (datetime.fromtimestamp(newest[0], UTC) if newest is not None else None)
    job_logs = inputs.logs or (inputs.read_logs(gap) if inputs.read_logs is not None else ())
    logs = settled(platform, job_logs)
    verdicts = [
        *([platform] if platform is not None else []),
        *logs,
        _job_state(evidence, inputs),
        _liveness(evidence, heartbeat_age, progress_age, interval, stall_after, inputs, paced_after, documents),
        _delivery(inputs, evidence, dims, now),
        _write_probe(inputs, evidence),
        _endpoint(inputs, evidence),
        _rank_collision(evidence),
        rank_check,
        _spool(evidence),
        _divergence(inputs, dims, now),
        _pace(ratios, read_at, fresh_for, documents),
        _checkpoints(inputs, evidence, dims, now),
        _set_aside(evidence),
        _alarms(inputs),
    ]
    by_check: dict[str, Verdict] = {}
    for verdict in verdicts:
        by_check.setdefault(verdict.check, verdict)
    # In order: the first failing check that explains the others is the cause. What killed or blocked the job
    # (the orchestrator, its log) explains the silence it left.
    causes: list[tuple[str, Callable[[Verdict], str]]] = [
        ("permission", lambda v: "permission"),
        ("spool", lambda v: "spool-not-persistent"),
        ("ranks", lambda v: "rank-collision"),
        ("rank", lambda v: f"rank-{v.verdict}"),  # the rank that stopped the run leads
        ("liveness", lambda v: v.verdict),
        ("delivery", lambda v: "delivery"),
        ("endpoint", lambda v: "endpoint"),
    ]
    if by_check["endpoint"].verdict in ("no bucket", "not readable", "unreachable"):
        # Without the bucket every verdict from S3 is blind: that leads, after what the orchestrator saw.
        causes.insert(0, ("endpoint", lambda v: v.verdict.replace(" ", "-")))
    failing = [(check, name) for check, name in causes if check in by_check and by_check[check].status == FAIL]
    first = leading(platform, logs)
    if by_check["job"].verdict == "failed":
        # The run's own last word (the exception's type) says more than the container's exit code
        failing.insert(next((i for i, (c, _) in enumerate(failing) if c not in BEACON_SPECIFIC), len(failing)),
                       ("job", lambda v: "failed"))  # fmt: skip
    if first is not None:
        bare = first.check == CHECK_ORCHESTRATOR and first.verdict in UNEXPLAINED
        # A bare exit code follows what Beacon's own evidence says of why (a refused write, a dead rank, ...)
        at = next((i for i, (c, _) in enumerate(failing) if c not in BEACON_SPECIFIC), len(failing)) if bare else 0
        failing.insert(at, (first.check, lambda v: first.verdict))
    elif platform is not None and by_check["job"].verdict == "not started" and platform.verdict in NOT_YET_RUNNING:
        # Never started, and the orchestrator says why (no node yet, still pulling): that, not "silent"
        failing.insert(0, (platform.check, lambda v: platform.verdict.replace(" ", "-")))
    lead, cause = next(((check, name(by_check[check])) for check, name in failing), ("job", ""))
    if not cause:
        cause = "not-started" if by_check["job"].verdict == "not started" else evidence.final_state or "healthy"
        # A healthy run's evidence is its heartbeat and its last step, not its attempts
        lead = "liveness" if cause == "healthy" and by_check["liveness"].verdict == "healthy" else lead
        if cause == "healthy" and by_check["rank"].verdict == "slow":  # alive and stepping, at the slowest's pace
            cause, lead = "rank-slow", "rank"
        elif cause == "healthy" and by_check["pace"].verdict == "slowed":  # every rank slower alike
            cause, lead = "run-slowed", "pace"
        elif cause == "healthy" and by_check["rank"].verdict == "paused":  # named, its stack shows where it is
            cause, lead = "paused", "rank"
        elif cause == "healthy" and by_check["liveness"].verdict == "paused":  # not yet a stall: say what it may be
            cause, lead = "paused", "liveness"
    # What it has cost so far (idle) or costs each hour (waiting), where its instances are placed
    slowed = run_slowed([(s.at.timestamp(), s.value) for s in ratios], read_at.timestamp(), gap_s=fresh_for)
    training_job = inputs.training_job.description if inputs.training_job is not None else None
    where = [] if _released(inputs, evidence) else placement(_held(inputs, nodes), documents, training_job)
    idle_s = _idle_since(stopped, documents, read_at) or progress_age
    costed = cost_verdict(cause, where, progress_age=idle_s, heartbeat_age=heartbeat_age,
                          slow_share=slow_share, slowed_ratio=slowed, prices=inputs.prices)  # fmt: skip
    if costed is not None:
        verdicts.append(costed)
    return Diagnosis(
        inputs.team,
        inputs.experiment,
        inputs.run,
        cause,
        verdicts,
        heartbeat_age,
        progress_age,
        lead,
        stopped,
        inputs.orchestrator,
        recorder,
        inputs.training_job,
        _run_timeline(inputs, evidence, job_logs, beats, progress, stopped, gap),
    )


def _held(inputs: DoctorInputs, nodes: Mapping[str, NodeView]) -> dict[str, NodeView]:
    """The nodes the job's pods hold now (pending or running, not being deleted): an earlier attempt's nodes that
    still exist, or a draining one, cost the run nothing more."""
    job = inputs.orchestrator.job if inputs.orchestrator is not None else None
    live = {p.node for p in job.pods if p.phase in ("Pending", "Running") and not p.deleting} if job else set()
    return {name: node for name, node in nodes.items() if name in live}


def _released(inputs: DoctorInputs, evidence: RunEvidence) -> bool:
    """The run holds no instance now, as far as the evidence says: its newest attempt wrote its final state, its
    Job's pods are gone or done (EKS), or its training job ended (SageMaker). Its cost is then no longer growing,
    and the doctor does not price an idle time that has no end."""
    if evidence.final is not None:
        return True
    job = inputs.orchestrator.job if inputs.orchestrator is not None else None
    if job is not None and not any(p.phase in ("Pending", "Running") and not p.deleting for p in job.pods):
        return True
    description = inputs.training_job.description if inputs.training_job is not None else None
    return description is not None and description.get("TrainingJobStatus") in ("Completed", "Failed", "Stopped")


def _idle_since(stopped: RankVerdict | None, documents: Sequence[RankProgress], now: datetime) -> float | None:
    """Seconds since the rank that stopped the run last made progress, as its document says (the others wait since)."""
    last = [d.last_step_wall_time for d in documents if stopped is not None and d.rank == stopped.rank]
    return now.timestamp() - last[0] if last and last[0] > 0 else None


def _run_timeline(
    inputs: DoctorInputs,
    evidence: RunEvidence,
    logs: Sequence[Verdict],
    beats: list[Any],
    progress: list[Any],
    stopped: RankVerdict | None,
    gap: datetime | None,
) -> list[Moment]:
    moments = [
        *orchestrator_moments(inputs.orchestrator),
        *training_job_moments(inputs.training_job.description if inputs.training_job else None),
        *verdict_moments(logs),
        *evidence_moments(evidence, stopped),
    ]
    if beats:
        moments += [
            Moment(beats[0].at, "metrics", "first heartbeat"),
            Moment(beats[-1].at, "metrics", "last heartbeat"),
        ]
    if progress:
        last_step_at = progress[-1].at - timedelta(seconds=progress[-1].value)
        age = f"{progress[-1].value:.0f} s before the last progress report"
        moments.append(Moment(last_step_at, "metrics", f"the last step dispatched, {age}"))
    return timeline(moments, gap=gap)


def diagnose_job(
    team: str,
    state: OrchestratorState | TrainingJobReading,
    *,
    logs: Sequence[Verdict] = (),
) -> Diagnosis:
    """A job without Beacon's library (or whose run is not known): what its orchestrator (a Kubernetes Job or a
    SageMaker training job) and its container logs can tell, and what they cannot."""
    verdict = state.verdict if isinstance(state, TrainingJobReading) else orchestrator_verdict(state)
    name = state.name if isinstance(state, TrainingJobReading) else state.job_name
    blind = Verdict(
        "beacon",
        INFO,
        "not known",
        "no Beacon records for this job: no heartbeat, no step progress, no delivery to S3, no per-rank stacks, "
        "no preflight (permissions, spool, endpoint) — the doctor cannot tell a hung loop from a slow one, nor "
        "whether metrics were lost",
        "`import beacon` in the training (beacon.init, run.log) and run it with Beacon's environment "
        "(workloads.manifests.training_job sets it), or `beacon run`",
    )
    logs = settled(verdict, logs)
    first = leading(verdict, logs)
    if first is not None:
        lead, cause = first.check, first.verdict
    elif verdict.verdict == "unreadable":
        lead, cause = CHECK_ORCHESTRATOR, "orchestrator-unreadable"
    elif verdict.verdict == "complete":
        lead, cause = CHECK_ORCHESTRATOR, "finished"
    elif verdict.verdict == "running":
        lead, cause = CHECK_ORCHESTRATOR, "healthy"
    else:
        lead, cause = CHECK_ORCHESTRATOR, verdict.verdict.replace(" ", "-").replace(",", "")
    return Diagnosis(
        team,
        "",
        name,
        cause,
        [verdict, *logs, blind],
        lead=lead,
        orchestrator=state if isinstance(state, OrchestratorState) else None,
        training_job=state if isinstance(state, TrainingJobReading) else None,
        timeline=timeline(
            [
                *orchestrator_moments(state if isinstance(state, OrchestratorState) else None),
                *training_job_moments(state.description if isinstance(state, TrainingJobReading) else None),
                *verdict_moments(logs),
            ],
            gap=None,  # no metrics: nothing to line up with
        ),
    )


def _samples(
    inputs: DoctorInputs, metric: contract.Metric, dims: dict[str, str], stat: str, now: datetime
) -> list[Any]:
    try:
        return metric_samples(inputs.cloudwatch, metric, dims, statistic=stat, now=now)
    except (ClientError, BotoCoreError):
        return []


def _log_by_hand(inputs: DoctorInputs) -> str:
    """How to read the job's own log, on its orchestrator (both when the doctor does not know which)."""
    kubectl = f"kubectl -n {contract.TRAINING_NAMESPACE} logs job/{inputs.run}"
    if inputs.training_job is not None:
        return f"aws logs tail /aws/sagemaker/TrainingJobs --log-stream-name-prefix {inputs.training_job.name}/"
    return kubectl if inputs.orchestrator is not None else f"{kubectl} (EKS), or its SageMaker training job's log"


def _job_state(evidence: RunEvidence, inputs: DoctorInputs) -> Verdict:
    attempts = len(evidence.preflights)
    failed = evidence.failed_starts
    # Starts that stopped in their preflight (the run's alarms refused, say) are not attempts: counted apart
    counted = "1 start failed its preflight" if len(failed) == 1 else f"{len(failed)} starts failed their preflight"
    starts = f"; {counted}, the last: {failed[-1].get('failed')}" if failed else ""
    if attempts == 0:
        return Verdict(
            "job",
            FAIL,
            "not started",
            "no preflight record under the run prefix: the job never passed its first seconds" + starts,
            f"the logs check above reads the container's first 20 s; by hand: {_log_by_hand(inputs)} (preflight "
            "prints one line, or why it stopped)",
        )
    restarted = f", restarted {attempts - 1} time(s)" if attempts > 1 else ""
    if evidence.final is not None:
        return _final_state(evidence, restarted + starts)
    earlier = evidence.superseded_final
    before = (
        f"; an earlier attempt ended {earlier.get('state')} at step {earlier.get('last_step')}, and a later one "
        "started since without a final state yet"
        if earlier is not None
        else ""
    )
    return Verdict(
        "job",
        OK if attempts == 1 else WARN,
        "running",
        f"{attempts} attempt(s) started{restarted}{before}{starts}",
        "" if attempts == 1 else "the orchestrator restarted the job: check its events and exit codes",
    )


def _final_state(evidence: RunEvidence, restarted: str) -> Verdict:
    final = evidence.final or {}
    at = f"at step {final.get('last_step')}{restarted}"
    if evidence.final_state == contract.FinalState.FAILED:
        return Verdict(
            "job",
            FAIL,
            "failed",
            f"the run failed {at}: {final.get('error') or 'an exception'}",
            "read the container log around the failure; a rerun with the same run id resumes from the last checkpoint",
        )
    if evidence.final_state == contract.FinalState.PREEMPTED:
        return Verdict(
            "job",
            WARN,
            "preempted",
            f"stopped by {final.get('signal') or 'SIGTERM'} {at}, drained first",
            "a spot interruption, an eviction or a stop: rerun with the same run id to resume",
        )
    return Verdict("job", OK, "succeeded", f"final state written {at}")


def _liveness(
    evidence: RunEvidence,
    heartbeat_age: float | None,
    progress_age: float | None,
    interval: float,
    stall_after: float,
    inputs: DoctorInputs,
    paced_after: float | None = None,
    documents: Sequence[RankProgress] = (),
) -> Verdict:
    if evidence.final is not None:
        return Verdict(
            "liveness", OK, "finished", f"the run ended ({evidence.final_state}); its heartbeat stopped on purpose"
        )
    silent_after = max(SILENT_BEATS * interval, SILENT_FLOOR_S)
    if heartbeat_age is None:
        return Verdict(
            "liveness",
            FAIL,
            "silent",
            "no heartbeat in CloudWatch for this run",
            "the job cannot reach CloudWatch, or never started: see the job and endpoint checks",
        )
    if heartbeat_age > silent_after:
        return Verdict(
            "liveness",
            FAIL,
            "silent",
            f"last heartbeat {heartbeat_age:.0f} s ago (> {silent_after:g} s: {SILENT_BEATS} beats of {interval:g} s, "
            f"at least {SILENT_FLOOR_S:g} s)",
            "the process is frozen, killed or cut off: "
            + (
                "check the training job's status and its instance's log"
                if inputs.training_job is not None
                else "check the pod (OOMKilled? evicted?) and its network"
            ),
        )
    if progress_age is not None and progress_age > stall_after:
        return Verdict(
            "liveness",
            FAIL,
            "stalled",
            f"heartbeat {heartbeat_age:.0f} s ago, but no step for {progress_age:.0f} s (> {stall_after:g} s)",
            "the loop hangs while the process lives: each rank dumps its stacks into ranks/stacks-rank-<r>.txt once "
            "stalled, and the rank check names the one that stopped; a DataLoader or a collective waiting on a dead "
            "rank is the usual cause",
        )
    if progress_age is not None and paced_after is not None and progress_age > paced_after:
        paced = [r for r in documents if r.pace_steps]
        step = max((r.step for r in documents), default=-1)
        pace = f" (its steps take {statistics.median(r.pace_step_s for r in paced):.2f} s)" if paced else ""
        return Verdict(
            "liveness",
            WARN,
            "paused",
            f"no step for {progress_age:.0f} s after step {step}{pace}: past the {paced_after:g} s its pace allows, "
            f"not yet the {stall_after:g} s of a stall",
            f"{PAUSE_ADVICE}; if it hangs, the rank check names the rank once the ranks' stacks are in",
        )
    age = f"{progress_age:.0f} s" if progress_age is not None else "unknown"
    return Verdict("liveness", OK, "healthy", f"heartbeat {heartbeat_age:.0f} s ago, last step {age} ago")


def _delivery(inputs: DoctorInputs, evidence: RunEvidence, dims: dict[str, str], now: datetime) -> Verdict:
    steps = _samples(inputs, contract.STEP, dims, "Maximum", now)
    backlog = _samples(inputs, contract.SPOOL_BACKLOG, dims, "Maximum", now)
    failures = _samples(inputs, contract.UPLOAD_FAILURES, dims, "Sum", now)
    if evidence.errors:
        return Verdict(
            "delivery", WARN, "unknown", f"S3 could not be read: {evidence.errors[0]}", "see the endpoint check"
        )
    in_s3 = evidence.last_step
    seen = int(max(s.value for s in steps)) if steps else None
    # A run that ended says in its final state what it left unacknowledged: newer than the last backlog it
    # published while it ran (the drain at its end comes after).
    at_end = (evidence.final or {}).get("unacknowledged_records")
    pending = at_end if isinstance(at_end, int) else int(backlog[-1].value) if backlog else 0
    failed = int(sum(s.value for s in failures))
    # From the index, when the run has one: every chunk counted, the tail's records read.
    counted = f" ({len(evidence.indexed)} chunks counted from the index)" if evidence.indexed else ""
    text = (
        f"{evidence.record_count} records in S3{counted}, last step {in_s3}; last step in CloudWatch: {seen}; "
        f"spool backlog {pending}{' at its end' if isinstance(at_end, int) else ''}; upload failures {failed}"
    )
    if in_s3 is None and seen is None:
        return Verdict("delivery", INFO, "nothing yet", text, "see the job check: no step was logged yet")
    if evidence.missing and evidence.final is not None:
        return Verdict(
            "delivery",
            FAIL,
            "lost",
            f"{evidence.missing} of {evidence.numbered} numbered records are not in S3; {text}",
            "their spool files are on the job's volume: `python -m beacon.sync` there uploads them",
        )
    if failed and pending > contract.BACKLOG_THRESHOLD_RECORDS:
        return Verdict(
            "delivery",
            FAIL,
            "behind",
            text,
            "uploads fail after retries: check the S3 endpoint, throttling and the bucket policy",
        )
    behind = seen is not None and seen - (-1 if in_s3 is None else in_s3) > contract.BACKLOG_THRESHOLD_RECORDS
    if failed or behind or evidence.missing:
        return Verdict("delivery", WARN, "lagging", text, "records wait in the spool; they are safe and will drain")
    return Verdict("delivery", OK, "delivered", text)


def _write_probe(inputs: DoctorInputs, evidence: RunEvidence) -> Verdict:
    if inputs.probe_s3 is None:
        if evidence.preflight is not None:
            return Verdict(
                "permission",
                OK,
                "wrote at start",
                f"the job's preflight wrote under the run prefix as the job's identity at "
                f"{evidence.preflight.get('started_at')} (host {evidence.preflight.get('host')})",
            )
        return Verdict(
            "permission",
            INFO,
            "not probed",
            inputs.probe_unavailable or "no writer role to probe with",
            "the writer role trusts only the job's services (EKS Pod Identity, SageMaker), so only a job can "
            f"probe it: `beacon smoke --team {inputs.team}` runs one in the cluster and its preflight writes as it",
        )
    key = contract.run_prefix(inputs.experiment, inputs.run) + f"doctor/{int(time.time())}-{uuid.uuid4().hex[:8]}"
    target = f"s3://{inputs.bucket}/{key}"
    try:
        inputs.probe_s3.put_object(Bucket=inputs.bucket, Key=key, Body=b"beacon doctor probe", IfNoneMatch="*")
    except ClientError as error:
        code = error.response["Error"]["Code"]
        return Verdict(
            "permission",
            FAIL,
            "denied",
            f"s3:PutObject {target}: {code}",
            "bind the training service account to the Beacon writer role (Pod Identity) or fix its policy",
        )
    except BotoCoreError as error:
        return Verdict("permission", WARN, "unknown", f"s3:PutObject {target}: {error}", "see the endpoint check")
    return Verdict("permission", OK, "writable", f"s3:PutObject {target} as the job's identity succeeded")


def _endpoint(inputs: DoctorInputs, evidence: RunEvidence) -> Verdict:
    started = time.monotonic()
    try:
        inputs.s3.list_objects_v2(
            Bucket=inputs.bucket, Prefix=contract.run_prefix(inputs.experiment, inputs.run), MaxKeys=1
        )
    except (ClientError, BotoCoreError) as error:
        code = error.response.get("Error", {}).get("Code", "") if isinstance(error, ClientError) else ""
        if code == "NoSuchBucket":
            return Verdict(
                "endpoint",
                FAIL,
                "no bucket",
                f"s3://{inputs.bucket} does not exist in {inputs.region} ({inputs.s3.meta.endpoint_url})",
                f"deploy the team's artifacts stack (make deploy TEAM={inputs.team}), or pass the bucket it created",
            )
        if code in ("AccessDenied", "AllAccessDisabled"):
            return Verdict(
                "endpoint",
                FAIL,
                "not readable",
                f"s3:ListBucket s3://{inputs.bucket}: {code} for the doctor's identity",
                "the team's reader role may list the bucket's experiments/ prefix: if you passed --bucket, pass the "
                "team's (the artifacts stack's BucketName); else check the bucket policy for a Deny on the reader",
            )
        return Verdict(
            "endpoint",
            FAIL,
            "unreachable",
            f"{inputs.s3.meta.endpoint_url}: {error}",
            "check AWS_ENDPOINT_URL, the VPC endpoints and the region",
        )
    latency_ms = (time.monotonic() - started) * 1000
    job_region = (evidence.preflight or {}).get("region")
    text = f"S3 answered in {latency_ms:.0f} ms at {inputs.s3.meta.endpoint_url}; job region {job_region}"
    if job_region and job_region != inputs.region:
        return Verdict(
            "endpoint",
            FAIL,
            "wrong region",
            f"{text}, stack region {inputs.region}",
            "set AWS_REGION in the job to the stack's region: its metrics go to another region",
        )
    if latency_ms > 1000:
        return Verdict("endpoint", WARN, "slow", text, "a far endpoint or collector: use the in-region VPC endpoints")
    return Verdict("endpoint", OK, "reachable", text)


def _rank_collision(evidence: RunEvidence) -> Verdict:
    ranks = evidence.writer_ranks
    hosts = {p.get("host") for p in evidence.preflights}
    if (ranks and ranks != [0]) or evidence.duplicated:
        return Verdict(
            "ranks",
            FAIL,
            "collision",
            f"records from ranks {ranks}, {evidence.duplicated} record(s) logged a metric its step already had",
            "only rank 0 may write: two jobs (or ranks) share this run id",
        )
    if len(hosts) > 1 and evidence.final is None:
        return Verdict(
            "ranks",
            WARN,
            "several hosts",
            f"preflight records from {sorted(map(str, hosts))}",
            "more than one job may be using this run id",
        )
    # From the tail alone on an indexed run: a second writer shows in its newest records.
    read = f"the last {len(evidence.records)} records" if evidence.indexed else f"{len(evidence.records)} records"
    return Verdict("ranks", OK, "rank 0 only", f"{read}, all from rank 0")


def _stopped_rank(
    evidence: RunEvidence,
    recorder: FlightRecorderReading | None,
    *,
    slow_share: float | None = None,
    share: float = SLOW_RANK_SHARE,
    stall: Stall | None = None,
    nodes: Mapping[str, NodeView] | None = None,
) -> tuple[Verdict, RankVerdict | None]:
    """Which rank stopped a multi-rank run, from the ranks' last documents and stack dumps; and the first collective
    they did not all join, where their flight recorders say; the rank's node as its orchestrator shows it (`nodes`:
    its instance, NodeClaim and conditions), when the doctor read it. With none stopped, the rank the others wait
    for, while the run's heartbeat says it is slow (`slow_share`: the least StragglerWaitShare of the verdict's span,
    `contract.pace.rank_slow`) and its documents name it at the run's `share`."""
    documents, stacks = evidence.ranks()
    if len(documents) < 2 and which_rank(documents, stacks) is None:
        if slow_share is not None:
            return _slow_not_placed(slow_share), None
        return Verdict(
            "rank", INFO, "not applicable", "no per-rank evidence (a single rank, or none uploaded yet)"
        ), None
    # What torch read goes with the evidence; where the dumps lie, when it could not, goes with the fix.
    read = f"; {recorder.line()}" if recorder is not None and not recorder.unread else ""
    unread = recorder.line() if recorder is not None and recorder.unread else ""
    not_joined = recorder.mismatch.missing if recorder is not None and recorder.mismatch is not None else None
    in_flight = ranks_in_a_collective(evidence.flight_recorder_dumps())
    stopped = which_rank(documents, stacks, not_joined=not_joined, in_flight=in_flight)
    newest = evidence.last_step
    if stopped is not None and stopped.rank == 0 and stopped.how != "hung" and newest is not None:
        # Rank 0 writes the records: its newest one says more than its document, rewritten every few seconds
        stopped = replace(stopped, step=max(stopped.step, newest))
    if stopped is None:
        if slow_share is not None and (slow := slow_rank(documents, share=share)) is not None:
            fix = SLOW_RANK_0_FIX if slow.straggler.rank == 0 else SLOW_RANK_FIX
            return Verdict("rank", WARN, "slow", slow.line() + _on_node(nodes, slow.node) + read, fix), None
        if slow_share is not None:
            return _slow_not_placed(slow_share), None
        return Verdict(
            "rank", OK, "none stands out", f"{len(documents)} ranks, none stopped apart from the others{read}", unread
        ), None
    stacks_file = stacks_name(stopped.rank)
    if SIGNAL_DUMP in stacks.get(stopped.rank, "").rsplit("\n--- rank ", 1)[-1].split("\n", 1)[0]:
        stacks_file = signal_stacks_name(stopped.rank)  # its stack is faulthandler's, at SIGTERM
    key = evidence.rank_file_keys.get(stacks_file, "")
    found = f"{contract.RANKS}/" + (
        key.split(f"/{contract.RANKS}/", 1)[1] if key else f"{evidence.rank_files_from or '…'}/{stacks_file}"
    )
    if f"/{contract.LIVE_SNAPSHOT}-" in found:  # a live snapshot: the attempt has not ended yet
        node = re.search(rf"/{contract.NODE}-(\d+)/", found)
        uploader = f"node {int(node[1])}'s leader" if node else "rank 0"
        found += f" (live snapshot: {uploader} uploaded it while the run hung)"
    if stopped.stack:
        where = f"its stack: {found}"
    elif stopped.how == "failed":  # its own exception ended it: the traceback went to its log
        where = "its exception's traceback is in its container's log (the logs check; kubectl logs --previous)"
    else:
        where = "no stack dump (killed outright, or frozen)"
    fix = "; ".join(filter(None, (where, unread)))
    document = next((r for r in documents if r.rank == stopped.rank), None)
    placed = _on_node(nodes, stopped.node)
    if stopped.how == "hung" and stall is not None and document is not None and stall.not_yet(document):
        line = replace(stopped, how="stopped").line()  # not yet said to hang
        return Verdict("rank", WARN, "paused", line + placed + read, f"{PAUSE_ADVICE}; {fix}"), stopped
    return Verdict("rank", FAIL, stopped.how, stopped.line() + placed + read, fix), stopped


def _on_node(nodes: Mapping[str, NodeView] | None, name: str) -> str:
    """What the orchestrator shows of the rank's node (`NodeView.placed`), after the rank's line; "" without it."""
    node = (nodes or {}).get(name)
    placed = node.placed() if node is not None else ""
    return f" [{name}: {placed}]" if placed else ""


@dataclass(frozen=True)
class Stall:
    """When a stopped rank is a stall, not yet a pause: past the run's `stall_after`, by its document (aged to the
    reading: a live snapshot's documents stop where it was taken) or by the run's own ProgressAge."""

    stall_after: float
    read_at: float  # epoch seconds
    progress_age: float | None  # the run's, from its heartbeat; None: not read

    def not_yet(self, document: RankProgress) -> bool:
        aged = document.progress_age + max(0.0, self.read_at - document.wall_time)
        return aged <= self.stall_after and (self.progress_age is None or self.progress_age <= self.stall_after)


def _slow_not_placed(share: float) -> Verdict:
    """The heartbeat says a rank is slow, but no document in S3 says which yet (its snapshot is on its way)."""
    return Verdict(
        "rank", WARN, "slow",
        f"the ranks wait for one of them {share:.0%} of each step (its heartbeat's StragglerWaitShare), but no "
        "document in S3 places it yet",
        "rank 0 and the node leaders upload the ranks' documents once a rank is slow: run the doctor again",
    )  # fmt: skip


def _spool(evidence: RunEvidence) -> Verdict:
    preflight = evidence.preflight
    if preflight is None:
        return Verdict("spool", INFO, "unknown", "no preflight record")
    if not preflight.get("spool_persistent", True):
        return Verdict(
            "spool",
            FAIL,
            "not persistent",
            f"{preflight['spool_dir']} is on {preflight['spool_filesystem']}",
            "mount the artifact volume (PVC beacon-artifacts) at the spool path",
        )
    return Verdict("spool", OK, "persistent", f"{preflight['spool_dir']} on {preflight['spool_filesystem']}")


def _divergence(inputs: DoctorInputs, dims: dict[str, str], now: datetime) -> Verdict:
    """A NaN or infinite loss never reaches CloudWatch (it would fail the heartbeat's request too):
    the job counts them instead, and this says so, so a diverging run does not pass for a quiet one."""
    counts = [s for s in _samples(inputs, contract.NON_FINITE_LOSS, dims, "Sum", now) if s.value > 0]
    if not counts:
        return Verdict("loss", OK, "finite", "no NaN or infinite loss value reported")
    total = int(sum(s.value for s in counts))
    return Verdict(
        "loss",
        WARN,
        "diverging",
        f"{total} NaN or infinite loss value(s), the last reported at {counts[-1].at:%H:%M:%S} UTC; "
        "the job itself runs on",
        "lower the learning rate or check the inputs around the first bad step: the run's records in S3 "
        "keep every value as it was",
    )


def _pace(ratios: Sequence[Any], now: datetime, gap_s: float, documents: Sequence[RankProgress]) -> Verdict:
    """The run's step time against its own baseline, as its heartbeat sent it (StepTimeRatio, while it steps and no
    rank stands out): slowed by the contract's rule (`contract.pace.run_slowed`), the one its slowed alarm keeps.
    Whether no rank stands out is known only where the ranks timed their waits (`run.watch`)."""
    if not ratios:
        return Verdict(
            "pace", INFO, "no ratio", "no StepTimeRatio: no baseline yet (its first full window after warm-up), or a "
            "rank stands out (the rank check's)",
        )  # fmt: skip
    last = ratios[-1].value
    slowed = run_slowed([(s.at.timestamp(), s.value) for s in ratios], now.timestamp(), gap_s=gap_s)
    if slowed is None:
        if last >= RUN_SLOWED_RATIO:
            return Verdict("pace", OK, "slowing", f"its steps take {last:.2f}x its baseline, not yet for "
                           f"{RUN_SLOWED_FOR_S / 60:.0f} minutes")  # fmt: skip
        return Verdict("pace", OK, "at its baseline", f"its steps take {last:.2f}x its baseline")
    untimed = len(documents) > 1 and any(math.isnan(d.pace.wait_s) for d in documents)
    alike = (
        "its ranks' waits are not timed (run.watch): whether one rank is the cause is not known"
        if untimed
        else "no rank stands out (each waits for the others alike)"
    )
    return Verdict(
        "pace",
        WARN,
        "slowed",
        f"every step takes {slowed:.2f}x the run's baseline or more, for {RUN_SLOWED_FOR_S / 60:.0f} minutes, and "
        f"{alike}",
        SLOWED_RUN_FIX,
    )


def _checkpoints(inputs: DoctorInputs, evidence: RunEvidence, dims: dict[str, str], now: datetime) -> Verdict:
    """A checkpoint skipped because the one before was still being written (S3 away, a slow disk) is by design,
    but a crash then resumes further back: the job counts the skips and says how far, and this says so."""
    skips = [s for s in _samples(inputs, contract.CHECKPOINTS_SKIPPED, dims, "Sum", now) if s.value > 0]
    ended = (evidence.final or {}).get("checkpoints_skipped") or []
    if not skips and not ended:
        return Verdict("checkpoints", OK, "on time", "no checkpoint was skipped")
    if ended:
        text = f"{len(ended)} checkpoint(s) skipped (steps {', '.join(map(str, ended[:8]))}"
        text += ", ...)" if len(ended) > 8 else ")"
    else:
        text = f"{int(sum(s.value for s in skips))} checkpoint(s) skipped, the last at {skips[-1].at:%H:%M:%S} UTC"
    lags = _samples(inputs, contract.STEPS_SINCE_CHECKPOINT, dims, "Maximum", now)
    if lags:
        text += f"; a crash then would have redone the last {lags[-1].value:.0f} step(s) since the newest checkpoint"
    return Verdict(
        "checkpoints",
        WARN,
        "skipped",
        text + ": the one before was still being written",
        "checkpoints take longer than the interval between them: see the delivery and endpoint checks (S3 away, "
        "a slow link), or checkpoint less often",
    )


def _set_aside(evidence: RunEvidence) -> Verdict:
    """The run's files that did not validate or contradict the run: left out of every verdict above, and named. The
    run's writer can write anything under its prefix (a bug, another version, a compromised container)."""
    if not evidence.set_aside:
        return Verdict("evidence", OK, "valid", "every file read validates")
    shown = "; ".join(evidence.set_aside[:5]) + (
        f"; and {len(evidence.set_aside) - 5} more" if len(evidence.set_aside) > 5 else ""
    )
    return Verdict(
        "evidence",
        WARN,
        "set aside",
        f"{len(evidence.set_aside)} file(s) or line(s) set aside: {shown}",
        "left out of the verdicts above; the run's writer wrote them (another version of Beacon, a bug or a "
        "compromised container): read them under the run's prefix",
    )


def _alarms(inputs: DoctorInputs) -> Verdict:
    try:
        run_states = alarm_states(
            inputs.cloudwatch,
            contract.run_alarm_name(inputs.team, inputs.experiment, inputs.run, contract.RunAlarm.SILENT).removesuffix(
                contract.RunAlarm.SILENT
            ),
        )
        team_states = {
            name: state
            for name, state in alarm_states(inputs.cloudwatch, f"{contract.ALARM_PREFIX}-{inputs.team}-").items()
            if not name.startswith(contract.run_alarm_prefix(inputs.team))
        }
    except (ClientError, BotoCoreError) as error:
        return Verdict(
            "alarms", INFO, "unreadable", str(error), "the doctor's identity needs cloudwatch:DescribeAlarms"
        )
    states = {**team_states, **run_states}
    firing = sorted(name for name, state in states.items() if state == "ALARM")
    text = ", ".join(f"{n}={s}" for n, s in sorted(states.items())) or "no alarms"
    if firing:
        return Verdict("alarms", WARN, "in alarm", text, "see each alarm's description for its runbook")
    return Verdict("alarms", OK, "quiet", text)
