"""Simulated metric streams of a training job, as its heartbeat thread would send them.

The progress signal is computed by the job's own ProgressClock on a simulated clock, so what the
alarms see here is what they would see from the real job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from beacon import contract
from beacon.evidence.progress import ProgressClock

from beacon_ops.evidence.alarms import SeriesKey, series_key


@dataclass
class SimulatedJob:
    team: str
    experiment: str
    run: str
    heartbeat_interval: float = 15.0
    step_seconds: float = 0.5
    start: float = 0.0
    frozen_at: float | None = None  # SIGSTOP: everything stops, heartbeat included
    hung_at: float | None = None  # the loop hangs; the heartbeat thread lives on
    finished_at: float | None = None  # clean exit
    checkpoints: list[tuple[float, float]] = field(default_factory=list)  # (start, seconds), loop blocked
    pauses: list[tuple[float, float]] = field(default_factory=list)  # (start, seconds): no step, no phase named
    backlog_records: float = 0.0
    upload_failures_per_beat: float = 0.0

    def samples(self, until: float, tick: float = 0.25) -> dict[SeriesKey, list[tuple[float, float]]]:
        now = self.start
        clock = ProgressClock(now=lambda: now)
        out: dict[SeriesKey, list[tuple[float, float]]] = defaultdict(list)
        run_dims = contract.run_dimensions(self.team, self.experiment, self.run)
        team_dims = contract.team_dimensions(self.team)
        stop = min(t for t in (self.frozen_at, self.finished_at, until) if t is not None)
        next_step = self.start + self.step_seconds
        next_beat = self.start
        in_checkpoint: tuple[float, float] | None = None
        for index in range(math.ceil((stop - self.start) / tick) + 1):
            now = min(self.start + index * tick, stop)
            if in_checkpoint is None:
                for begin, seconds in self.checkpoints:
                    if begin <= now < begin + seconds:
                        in_checkpoint = (begin, seconds)
                        clock.checkpoint_started()
            elif now >= in_checkpoint[0] + in_checkpoint[1]:
                clock.checkpoint_finished()
                next_step = now + self.step_seconds
                in_checkpoint = None
            paused = any(begin <= now < begin + seconds for begin, seconds in self.pauses)
            looping = in_checkpoint is None and not paused and (self.hung_at is None or now < self.hung_at)
            if looping and now >= next_step:
                clock.step_finished()
                next_step = now + self.step_seconds
            if now >= next_beat and now < stop:
                self._beat(out, now, clock, run_dims, team_dims)
                next_beat += self.heartbeat_interval
        return dict(out)

    def _beat(
        self,
        out: dict[SeriesKey, list[tuple[float, float]]],
        now: float,
        clock: ProgressClock,
        run_dims: dict[str, str],
        team_dims: dict[str, str],
    ) -> None:
        def put(metric: contract.Metric, dims: dict[str, str], value: float) -> None:
            out[series_key(contract.metric_namespace(self.team), metric.name, dims)].append((now, value))

        put(contract.HEARTBEAT, run_dims, 1.0)
        put(contract.PROGRESS_AGE, run_dims, clock.progress_age())
        put(contract.STALL_RATIO, run_dims, clock.progress_age() / clock.stall_after(contract.STALL_THRESHOLD_S))
        put(contract.CHECKPOINT_SECONDS, run_dims, clock.checkpoint_seconds())
        for dims in (run_dims, team_dims):
            put(contract.SPOOL_BACKLOG, dims, self.backlog_records)
            put(contract.UPLOAD_FAILURES, dims, self.upload_failures_per_beat)
