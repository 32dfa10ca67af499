"""Progress as the heartbeat reports it: seconds since the loop last finished a step, not counting
time spent in a named phase (setup, evaluation, a checkpoint): a long one is work, not a stall.

The current phase is published too, so the heartbeat can say what a job that takes no steps is
doing: the contract's (`contract.Phase`) or a team's own name (`run.phase("warmup")`).

A phase pauses the clock for `phase_limit` seconds at most (`contract.PHASE_LIMIT_S`): past it, the time
counts again, so a rank hung inside its own checkpoint or evaluation reads as stalled, not as working forever.
Setup is not limited: loading a large model or compiling may take longer, and a run is not yet stepping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from beacon.contract import PHASE_LIMIT_S, Phase
from beacon.contract.pace import run_stall_after
from beacon.evidence.step_pace import StepPace


class ProgressClock:
    """The loop marks steps and enters and leaves phases; the heartbeat thread reads the age."""

    def __init__(self, now: Callable[[], float] = time.monotonic, *, phase_limit: float = PHASE_LIMIT_S) -> None:
        self._now = now
        self.phase_limit = phase_limit
        self._lock = threading.Lock()
        self._last_step = now()
        self._excluded = 0.0  # seconds in phases since the last step
        self._phases: list[tuple[str, float, bool]] = []  # open phases, outermost first: start, followed
        self._paused_since: float | None = None  # when the outermost open phase began
        self.steps = 0
        self.dispatched_step = -1  # the last step the loop dispatched: set by `Run.mark_step`, read by ranks
        self.pace = StepPace(now)  # each step's interval and first collective's wait, for the straggler

    def step_finished(self) -> None:
        with self._lock:
            now = self._now()
            in_phases = self._excluded + (now - self._paused_since if self._paused_since is not None else 0.0)
            self._last_step = now
            self._excluded = 0.0
            self._paused_since = now if self._phases else None
            self.steps += 1
        self.pace.step_finished(in_phases_s=in_phases)

    def enter(self, phase: str, *, followed: bool = False) -> None:
        """Open `phase`; `followed` when it is another rank's (`ranks.PhaseFollower`): its time is
        excluded here too, but it is not this rank's own phase (`own_phase_name`)."""
        with self._lock:
            now = self._now()
            if not self._phases:
                self._paused_since = now
            self._phases.append((phase, now, followed))

    def leave(self, phase: str) -> float:
        """End the innermost open `phase`; return its length in seconds (0 if it was not open)."""
        with self._lock:
            now = self._now()
            limit = self._limit()  # of the stretch that ends if this is its last phase
            for index in range(len(self._phases) - 1, -1, -1):
                if self._phases[index][0] == phase:
                    started = self._phases.pop(index)[1]
                    break
            else:
                return 0.0
            if not self._phases and self._paused_since is not None:
                self._excluded += min(now - self._paused_since, limit)
                self._paused_since = None
            return now - started

    @contextmanager
    def phase(self, phase: str) -> Iterator[None]:
        self.enter(phase)
        try:
            yield
        finally:
            self.leave(phase)

    def phase_name(self) -> str:
        """The innermost open phase; TRAINING when none is."""
        with self._lock:
            return self._phases[-1][0] if self._phases else Phase.TRAINING

    def own_phase_name(self) -> str:
        """The innermost phase this rank itself is in, other ranks' followed phases left out; TRAINING
        when none is. What its progress document says: rank 0 waiting out rank 3's checkpoint is not
        checkpointing, and a stale `rank 3 setup` there would read as work long after rank 0 froze."""
        with self._lock:
            return next((p for p, _, followed in reversed(self._phases) if not followed), Phase.TRAINING)

    def current_phase(self) -> tuple[str, float] | None:
        """(innermost open phase, seconds in it so far); None while the loop is training."""
        with self._lock:
            if not self._phases:
                return None
            phase, started, _ = self._phases[-1]
            return phase, self._now() - started

    def own_phase_seconds(self) -> float:
        """Seconds this rank has been in its innermost own phase; 0 while it trains."""
        with self._lock:
            started = next((s for _, s, followed in reversed(self._phases) if not followed), None)
            return 0.0 if started is None else self._now() - started

    def _limit(self) -> float:
        """How long the open phases may pause the clock: `phase_limit`, unless the outermost is setup."""
        return float("inf") if self._phases and self._phases[0][0] == Phase.SETUP else self.phase_limit

    def in_phase_work(self) -> bool:
        """A phase is open and has paused the clock for less than its limit: the rank is working, not stalled."""
        with self._lock:
            return self._paused_since is not None and self._now() - self._paused_since < self._limit()

    def stall_after(self, ceiling: float) -> float:
        """When this rank's progress is a stall: `ceiling` (the run's `stall_dump_after`), or sooner once its pace
        gives a shorter threshold (`contract.pace`: 30 s at 1 s steps)."""
        return run_stall_after((self.pace.stall_after(ceiling),), ceiling)

    def progress_age(self) -> float:
        with self._lock:
            now = self._now()
            in_phase = min(now - self._paused_since, self._limit()) if self._paused_since is not None else 0.0
            return max(0.0, now - self._last_step - self._excluded - in_phase)

    # The checkpoint window, as the alarm simulation (beacon/simulate.py) drives it.
    def checkpoint_started(self) -> None:
        self.enter(Phase.CHECKPOINT)

    def checkpoint_finished(self) -> float:
        """End the checkpoint window; return its length in seconds."""
        return self.leave(Phase.CHECKPOINT)

    def checkpoint_seconds(self) -> float:
        """Seconds the current checkpoint has run so far; 0 when none is in flight."""
        with self._lock:
            return next((self._now() - s for p, s, _ in reversed(self._phases) if p == Phase.CHECKPOINT), 0.0)
