"""This rank's pace: each step's interval, and how long it waited at the step's first collective (issue 31).

In synchronous training every rank's step interval is the slowest rank's: DDP's gradient all_reduce, run from C++
hooks inside `backward`, holds each rank until the last one arrives. So the interval alone cannot name a straggler;
what it does not wait for does. `run.watch` times the first collective of each step: DDP's buckets through a
communication hook wrapped around the model's own (the default all_reduce unless the team registered another),
and the synchronous collectives a team calls through `torch.distributed` (`dist.all_reduce(...)`). The training
thread stores two numbers per step; this rank's signal thread summarises the window into its document
(`RankProgress.pace_*`), and every reader names the straggler with `contract.pace.straggler_of`.

torch is imported only by `run.watch`: `beacon.sync` reads the same evidence package without it.
Beacon's own collectives (the stop flag, the run id) call `torch.distributed.distributed_c10d` directly and are
never timed. A collective imported by name before `run.watch` (`from torch.distributed import all_reduce`) is not
seen: call it through the module.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from beacon.contract.pace import (
    PACE_WINDOW_MAX_STEPS,
    SLOW_RANK_FOR_S,
    SLOW_RANK_FOR_STEPS,
    WARMUP_STEPS,
    RankPace,
    baseline,
    stall_threshold_for,
)

# The synchronous collectives a team's loop calls through `torch.distributed` that `run.watch` times.
TIMED_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
)


class StepPace:
    """Written by the training thread (`step_finished`) and by the collectives `run.watch` wraps (which may finish
    on a backend's thread); read by the rank's signal thread (`of_rank`)."""

    def __init__(
        self,
        now: Callable[[], float] = time.monotonic,
        *,
        window_s: float = SLOW_RANK_FOR_S,
        window_steps: int = SLOW_RANK_FOR_STEPS,
        max_steps: int = PACE_WINDOW_MAX_STEPS,
    ) -> None:
        self._now = now
        self.window_s, self.window_steps = window_s, window_steps
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=max_steps)  # (ended, interval, wait)
        self._last_step: float | None = None
        self._step_started_collective = False  # the first collective of this step has begun
        self._wait = math.nan  # this step's wait at its first collective, once it ended
        self._forgotten = 0  # samples the window no longer holds: the warm-up among them is behind it
        self.timing = False  # `run.watch` was called: a step without a collective waited 0 s

    def step_finished(self, *, in_phases_s: float = 0.0) -> None:
        """The loop finished a step (`Run.mark_step`): the interval since the previous one, less `in_phases_s` spent
        in named phases (a checkpoint is work, not the pace), and this step's wait."""
        now = self._now()
        with self._lock:
            if self._last_step is not None:
                wait = self._wait if not math.isnan(self._wait) else (0.0 if self.timing else math.nan)
                if len(self._samples) == self._samples.maxlen:
                    self._forgotten += 1  # the deque drops its oldest itself
                self._samples.append((now, max(0.0, now - self._last_step - in_phases_s), wait))
                self._forget_old(now)
            self._last_step = now
            self._step_started_collective = False
            self._wait = math.nan

    def collective_began(self) -> float | None:
        """When this step's first collective began; None for any later one (only the first is timed)."""
        with self._lock:
            if self._step_started_collective:
                return None
            self._step_started_collective = True
            return self._now()

    def collective_ended(self, began: float) -> None:
        ended = self._now()
        with self._lock:
            self._wait = ended - began

    def of_rank(self, rank: int) -> RankPace:
        """This rank's window: its steps, their span, the median interval and the median wait."""
        with self._lock:
            samples = list(self._samples)
        if not samples:
            return RankPace(rank=rank, steps=0, window_s=0.0, step_s=math.nan, wait_s=math.nan)
        intervals = [interval for _, interval, _ in samples]
        waits = [wait for _, _, wait in samples if not math.isnan(wait)]
        return RankPace(
            rank=rank,
            steps=len(samples),
            window_s=samples[-1][0] - samples[0][0] + samples[0][1],
            step_s=statistics.median(intervals),
            wait_s=statistics.median(waits) if len(waits) * 2 > len(samples) else math.nan,
        )

    def stall_after(self) -> float:
        """The stall threshold this rank's pace gives (`contract.pace.stall_threshold_for`), 0 before it has a
        baseline (setup, warm-up): readers then keep the fixed one."""
        with self._lock:
            intervals, forgotten = [interval for _, interval, _ in self._samples], self._forgotten
        pace = baseline(intervals, warmup=WARMUP_STEPS - forgotten)
        return 0.0 if pace is None else stall_threshold_for(pace)

    def _forget_old(self, now: float) -> None:
        """Keep at least `window_s` and `window_steps`, whichever is longer (bounded by the deque's maxlen)."""
        samples = self._samples
        while len(samples) > self.window_steps and now - samples[1][0] + samples[1][1] >= self.window_s:
            samples.popleft()
            self._forgotten += 1


def watch_ddp(model: Any, pace: StepPace, *, hook: Callable[..., Any] | None = None, state: Any = None) -> None:
    """Time each step's first bucket of `model` (a DistributedDataParallel) from the moment its gradients are ready
    (this rank's arrival) until the all_reduce is done. `hook`/`state`: the communication hook the team would
    register itself (DDP takes one); the default all_reduce when None."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.futures import Future

    inner = hook or default_hooks.allreduce_hook

    def timed(hook_state: Any, bucket: Any) -> Any:
        began = pace.collective_began()
        future = inner(hook_state, bucket)
        if began is None:
            return future

        def ended(done: Any) -> Any:
            pace.collective_ended(began)
            return done.value()

        return future.then(ended)

    # DDP reads the hook's annotations as objects; this module's are strings (`from __future__ import annotations`).
    bucket_type = dist.GradBucket  # type: ignore[attr-defined]  # exported by torch, undeclared
    timed.__annotations__ = {"hook_state": object, "bucket": bucket_type, "return": Future[torch.Tensor]}
    model.register_comm_hook(state, timed)
    pace.timing = True


class TimedCollectives:
    """`torch.distributed`'s synchronous collectives, timed while installed; the originals back on `remove`."""

    def __init__(self, pace: StepPace) -> None:
        self.pace = pace
        self._originals: dict[str, Callable[..., Any]] = {}

    def install(self) -> TimedCollectives:
        import torch.distributed as dist

        for name in TIMED_COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None or name in self._originals:
                continue
            self._originals[name] = original
            setattr(dist, name, self._timed(original))
        self.pace.timing = True
        return self

    def remove(self) -> None:
        import torch.distributed as dist

        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        pace = self.pace

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("async_op"):
                return original(*args, **kwargs)  # returns at once: its wait is the Work's, not timed here
            began = pace.collective_began()
            try:
                return original(*args, **kwargs)
            finally:
                if began is not None:
                    pace.collective_ended(began)

        return timed
