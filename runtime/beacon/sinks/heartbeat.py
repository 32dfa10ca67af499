"""The heartbeat thread: CloudWatch only. Every `heartbeat_interval` one PutMetricData of the run's health (its
heartbeat, progress age, backlog, the window's loss and upload figures, the cross-rank view of several ranks),
whatever the loop is doing; the run's alarms once the first beats are in; and, while a rank stalls, a live
snapshot of the ranks' evidence (`beacon.evidence.live_evidence`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from beacon import contract
from beacon.contract.pace import SentShare, run_stall_after, stands_out, straggler_of
from beacon.contract.rank_evidence import RankProgress
from beacon.evidence.live_evidence import LiveEvidence, RanksDirectory
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import CrossRankView, PhaseFollower
from beacon.settings import RunSettings
from beacon.sinks.delivery import DeliveryReport, Lifecycle
from beacon.sinks.metric_window import MetricWindow, WindowStats, cloudwatch_accepts, datum_is_valid, statistic_set
from beacon.sinks.run_alarms import RunAlarms

log = logging.getLogger("beacon.telemetry")

MAX_DATA_PER_REQUEST = 1000  # PutMetricData's limit


class Heartbeat:
    def __init__(
        self,
        config: RunSettings,
        *,
        cloudwatch: Any,
        progress: ProgressClock,
        window: MetricWindow,
        report: DeliveryReport,
        lifecycle: Lifecycle,
        backlog: Callable[[], int],
        attempt: Callable[[], int],
        run_alarms: RunAlarms | None,
        ranks: RanksDirectory | None,
        cross_rank_metrics: bool,
        evidence: LiveEvidence | None,
    ) -> None:
        self.config, self.cloudwatch, self.progress = config, cloudwatch, progress
        self.window, self.report, self.lifecycle = window, report, lifecycle
        self._backlog, self._attempt = backlog, attempt  # records not yet in S3; the attempt this process writes
        self.run_alarms = run_alarms
        # Every rank's progress documents: the cross-rank view, and the live snapshots while a rank stalls.
        self.ranks = ranks
        # Rank 0 of several ranks sends the cross-rank view (two custom metrics); a run of one rank does not,
        # but its own stall is snapshotted alike (its stack, where it hangs, reaches S3 while it hangs).
        self.cross_rank_metrics = cross_rank_metrics
        self.evidence = evidence
        self._phases_of_other_ranks = PhaseFollower(progress)
        self._sent_share = SentShare()
        self._cloudwatch_metrics = frozenset(config.cloudwatch_metrics)
        self._first_beat_at: float | None = None
        self._last_rate_sample = (time.monotonic(), progress.steps)
        self.done = threading.Event()  # uploads are over: the final beat, then stop
        self.thread = threading.Thread(target=self._loop, name="beacon-heartbeat", daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                self.beat()
            except Exception:  # a heartbeat thread that dies makes a live job look silent
                log.exception("heartbeat failed; the next one follows")
            if self.done.wait(self.config.heartbeat_interval):
                break
        if self.lifecycle.remaining() > 0:
            try:
                self.beat(final=True)
            except Exception:
                log.exception("final heartbeat failed")

    def beat(self, *, final: bool = False) -> None:
        now = time.time()
        # With the other nodes' ranks where this directory holds its own node's alone: what the view counts.
        ranks, everyone = self.ranks.read() if self.ranks is not None else ([], [])
        data, window = self.metric_batch(now, everyone)
        if not final and self.ranks is not None and self.evidence is not None:
            # Whatever CloudWatch answers: the evidence does not go through it
            self.evidence.look_as_rank_zero(self.ranks, ranks, everyone, now, attempt=self._attempt())
        try:
            for start in range(0, len(data), MAX_DATA_PER_REQUEST):
                self.cloudwatch.put_metric_data(
                    Namespace=self.config.namespace, MetricData=data[start : start + MAX_DATA_PER_REQUEST]
                )
            self.report.metric_batches += 1
        except (ClientError, BotoCoreError, OSError) as error:
            self.report.metric_failures += 1
            self.window.restore(window)  # counted in the next batch rather than lost
            log.warning("PutMetricData to %s failed: %s", self.config.namespace, error)
            return
        if self._first_beat_at is None:
            self._first_beat_at = now
        if (
            not final
            and self.run_alarms is not None
            and not self.run_alarms.armed
            and now >= contract.run_alarms_arm_at(self._first_beat_at)
        ):
            try:
                self.run_alarms.arm()
            except (ClientError, BotoCoreError) as error:
                log.error("cannot create this run's alarms: %s", error)

    def stall_after(self, ranks: list[RankProgress]) -> float:
        """The run's stall threshold: this rank's own, and the longest any other rank's document states, never later
        than `stall_dump_after` (`contract.pace.run_stall_after`)."""
        fixed = self.config.stall_dump_after
        return run_stall_after((self.progress.stall_after(fixed), *(r.stall_after_s for r in ranks)), fixed)

    def metric_batch(self, now: float, ranks: list[RankProgress]) -> tuple[list[dict[str, Any]], WindowStats]:
        """The batch to send now, and the window it took (put back if CloudWatch refuses it)."""
        window = self.window.take()
        timestamp = datetime.fromtimestamp(now, UTC)
        run_dims = contract.run_dimensions(self.config.team, self.config.experiment, self.config.run)
        team_dims = contract.team_dimensions(self.config.team)

        def datum(metric: contract.Metric, dims: dict[str, str], **value: Any) -> dict[str, Any]:
            return {
                "MetricName": metric.name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Timestamp": timestamp,
                "Unit": metric.unit.value,
                "StorageResolution": metric.storage_resolution,
                **value,
            }

        self._phases_of_other_ranks.follow(ranks, now)  # before ProgressAge: their phases are work too
        mono, steps = time.monotonic(), self.progress.steps
        last_mono, last_steps = self._last_rate_sample
        self._last_rate_sample = (mono, steps)
        backlog, age, stall_after = float(self._backlog()), self.progress.progress_age(), self.stall_after(ranks)
        data = [
            datum(contract.HEARTBEAT, run_dims, Value=1.0),
            datum(contract.PROGRESS_AGE, run_dims, Value=age),
            datum(contract.STALL_RATIO, run_dims, Value=age / stall_after),
            datum(contract.STEPS_PER_SECOND, run_dims, Value=(steps - last_steps) / max(mono - last_mono, 1e-6)),
        ]
        phase = self.progress.current_phase()  # setup, evaluation, checkpoint: work, not a stall
        standing_out = None
        if self.cross_rank_metrics and self.ranks is not None and (view := CrossRankView.of(ranks, now)):
            data.append(datum(contract.SLOWEST_RANK_PROGRESS_AGE, run_dims, Value=view.slowest_progress_age))
            data.append(datum(contract.RANK_STEP_SPREAD, run_dims, Value=float(view.step_spread)))
            straggler = straggler_of([r.pace for r in ranks if not r.ended])
            # Not while a rank is stalled: the frozen windows would go on saying slow, and hide the hang
            stalled = self.evidence is not None and self.evidence.stalled(ranks, now)
            if straggler is not None and straggler.window_full and not stalled:
                share = self._sent_share.sent(straggler, now)  # held where steps are long (`contract.pace`)
                data.append(datum(contract.STRAGGLER_WAIT_SHARE, run_dims, Value=share))
            standing_out = straggler if stands_out(straggler, self.config.slow_rank_share) else None
        # The run's pace against its baseline, while it steps (a hang's frozen window says nothing of its pace) and no
        # rank stands out (that is the slow rank's alarm)
        ratio = self.progress.pace.step_time_ratio()
        if ratio is not None and age < stall_after and standing_out is None:
            data.append(datum(contract.STEP_TIME_RATIO, run_dims, Value=ratio))
        if phase is not None:
            phase_dims = contract.phase_dimensions(self.config.team, self.config.experiment, self.config.run, phase[0])
            data.append(datum(contract.PHASE_SECONDS, phase_dims, Value=phase[1]))
        for dims in (run_dims, team_dims):
            data.append(datum(contract.SPOOL_BACKLOG, dims, Value=backlog))
            data.append(datum(contract.UPLOAD_FAILURES, dims, Value=float(window.upload_failures)))
        losses = window.values.get(contract.LOSS_KEY, [])
        sendable = [v for v in losses if cloudwatch_accepts(v)]
        if sendable:
            data.append(datum(contract.LOSS, run_dims, StatisticValues=statistic_set(sendable)))
        if len(sendable) < len(losses):
            data.append(datum(contract.NON_FINITE_LOSS, run_dims, Value=float(len(losses) - len(sendable))))
        for name in self._cloudwatch_metrics:  # the team's own, at their cost; only what CloudWatch accepts
            accepted = [v for v in window.values.get(name, []) if cloudwatch_accepts(v)]
            if accepted and name != contract.LOSS_KEY:
                data.append(datum(contract.team_metric(name), run_dims, StatisticValues=statistic_set(accepted)))
        if window.last_step >= 0:
            data.append(datum(contract.STEP, run_dims, Value=float(window.last_step)))
        if window.upload_latencies_ms:
            data.append(
                datum(contract.UPLOAD_LATENCY, run_dims, StatisticValues=statistic_set(window.upload_latencies_ms))
            )
        if window.checkpoint_seconds:
            data.append(
                datum(contract.CHECKPOINT_SECONDS, run_dims, StatisticValues=statistic_set(window.checkpoint_seconds))
            )
        if window.checkpoints_skipped:
            data.append(datum(contract.CHECKPOINTS_SKIPPED, run_dims, Value=float(window.checkpoints_skipped)))
            data.append(
                datum(contract.STEPS_SINCE_CHECKPOINT, run_dims, Value=float(window.steps_since_checkpoint or 0))
            )
        return [d for d in data if datum_is_valid(d)], window
