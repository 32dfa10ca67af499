"""Progress as the heartbeat reports it: seconds since the loop last finished a step,
not counting time spent inside a checkpoint (a long checkpoint is not a stall)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ProgressClock:
    """The loop marks steps and checkpoint windows; the heartbeat thread reads the age."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._last_step = now()
        self._excluded = 0.0  # checkpoint seconds since the last step
        self._checkpoint_started: float | None = None
        self.steps = 0

    def step_finished(self) -> None:
        with self._lock:
            self._last_step = self._now()
            self._excluded = 0.0
            self.steps += 1

    def checkpoint_started(self) -> None:
        with self._lock:
            self._checkpoint_started = self._now()

    def checkpoint_finished(self) -> float:
        """End the checkpoint window; return its length in seconds."""
        with self._lock:
            if self._checkpoint_started is None:
                return 0.0
            seconds = self._now() - self._checkpoint_started
            self._excluded += seconds
            self._checkpoint_started = None
            return seconds

    def progress_age(self) -> float:
        with self._lock:
            now = self._now()
            in_checkpoint = now - self._checkpoint_started if self._checkpoint_started is not None else 0.0
            return max(0.0, now - self._last_step - self._excluded - in_checkpoint)

    def checkpoint_seconds(self) -> float:
        """Seconds the current checkpoint has run so far; 0 when none is in flight."""
        with self._lock:
            return self._now() - self._checkpoint_started if self._checkpoint_started is not None else 0.0
