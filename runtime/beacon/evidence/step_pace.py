"""This rank's pace: each step's interval, and how long it waited for its peers in the step's collectives (issue 31).

In synchronous training every rank's step interval is the slowest rank's: DDP's gradient all_reduce, run from C++
hooks inside `backward`, holds each rank until the last one arrives. So the interval alone cannot name a straggler;
what it does not wait for does. `run.watch` times, in each step:
- a DDP model's *last* gradient bucket, through a communication hook wrapped around the model's own (the default
  all_reduce over the model's process group unless the team registered another): the last bucket is where a rank
  slower anywhere in forward or backward is waited for, the lag of every bucket before it included;
- and every synchronous collective the loop calls through `torch.distributed` (`dist.all_reduce(...)`), summed.
On CPU tensors (gloo) a collective's wait is wall time from its call to its end. On CUDA tensors the CPU runs ahead
and nccl completes a collective's future once it is queued, so the wait is taken on the GPU: a CUDA event on the
current stream where the rank arrives, another where the collective is done (the future's callback runs on a stream
that waits for it), read by the signal thread once both are done.

The training thread stores a few numbers per step; this rank's signal thread summarises the window into its document
(`RankProgress.pace_*`), and every reader names the straggler with `contract.pace.straggler_of`.

torch is imported only by `run.watch`: `beacon.sync` reads the same evidence package without it.
Beacon's own collectives (the stop flag, the run id) call `torch.distributed.distributed_c10d` directly and are
never timed. A collective imported by name before `run.watch` (`from torch.distributed import all_reduce`) is not
seen: call it through the module. Collectives made inside other libraries' C++ (FSDP's, DDP's buffer broadcast) are
not timed.
"""

from __future__ import annotations

import functools
import inspect
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from beacon.contract.alarms import STALL_THRESHOLD_S
from beacon.contract.pace import (
    PACE_WINDOW_MAX_STEPS,
    SLOW_RANK_FOR_S,
    SLOW_RANK_FOR_STEPS,
    WARMUP_STEPS,
    Baseline,
    RankPace,
    baseline,
    stall_threshold_for,
    step_time_ratio,
    window_full,
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


class _Step:
    """One step's sample: when it ended, its interval (named phases left out), what it waited (CPU-timed), and the
    CUDA event pairs of the waits timed on the GPU, until the signal thread reads them."""

    __slots__ = ("ended", "interval", "on_gpu", "wait")

    def __init__(self, ended: float, interval: float, wait: float, on_gpu: list[tuple[Any, Any]] | None) -> None:
        self.ended, self.interval, self.wait, self.on_gpu = ended, interval, wait, on_gpu

    def settled_wait(self) -> float | None:
        """The step's wait, once every GPU-timed part of it is done (None before); NaN where none was timed."""
        if self.on_gpu:
            if not all(end.query() for _, end in self.on_gpu):
                return None
            gpu = sum(start.elapsed_time(end) for start, end in self.on_gpu) / 1000.0
            self.wait, self.on_gpu = (0.0 if math.isnan(self.wait) else self.wait) + gpu, None
        return self.wait


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
        self._samples: deque[_Step] = deque(maxlen=max_steps)
        self._last_step: float | None = None
        self._wait = math.nan  # this step's waits so far, CPU-timed (NaN: none timed yet)
        self._on_gpu: list[tuple[Any, Any]] = []  # ... and GPU-timed
        self._forgotten = 0  # samples the window no longer holds: the warm-up among them is behind it
        self.timing = False  # `run.watch` was called: a step without a collective waited 0 s
        self._baseline: Baseline | None = None  # the run's, kept from its first full window after warm-up

    def step_finished(self, *, in_phases_s: float = 0.0) -> None:
        """The loop finished a step (`Run.mark_step`): the interval since the previous one, less `in_phases_s` spent
        in named phases (a checkpoint is work, not the pace), and this step's waits."""
        now = self._now()
        with self._lock:
            if self._last_step is not None:
                wait = self._wait if not math.isnan(self._wait) or self._on_gpu else (0.0 if self.timing else math.nan)
                if len(self._samples) == self._samples.maxlen:
                    self._forgotten += 1  # the deque drops its oldest itself
                interval = max(0.0, now - self._last_step - in_phases_s)
                self._samples.append(_Step(now, interval, wait, self._on_gpu or None))
                self._forget_old(now)
            self._last_step = now
            self._wait, self._on_gpu = math.nan, []

    def clock(self) -> float:
        return self._now()

    def waited(self, began: float) -> None:
        """A CPU-timed collective of this step, from `began` (`clock()`) until now."""
        ended = self._now()
        with self._lock:
            self._wait = (0.0 if math.isnan(self._wait) else self._wait) + (ended - began)

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait for the peers made outside `run.watch`'s wrappers, counted once it was called: Beacon's own stop flag
        (`Run.should_stop`, a CPU collective every step). A slow rank is waited for at the step's first collective;
        where a loop asks every step whether to stop, that is this one, and DDP's all_reduce then waits for no one."""
        began = self._now()
        try:
            yield
        finally:
            if self.timing:
                self.waited(began)

    def waited_on_gpu(self, start: Any, end: Any) -> None:
        """A GPU-timed collective of this step, between two recorded CUDA events."""
        with self._lock:
            self._on_gpu.append((start, end))

    def of_rank(self, rank: int) -> RankPace:
        """This rank's window: its steps, their span, the median interval and the median wait (of the steps whose
        waits are read: a GPU's last few may still be running)."""
        with self._lock:
            samples = list(self._samples)
        if not samples:
            return RankPace(rank=rank, steps=0, window_s=0.0, step_s=math.nan, wait_s=math.nan)
        settled = [sample.settled_wait() for sample in samples]
        waits = [wait for wait in settled if wait is not None and not math.isnan(wait)]
        return RankPace(
            rank=rank,
            steps=len(samples),
            window_s=samples[-1].ended - samples[0].ended + samples[0].interval,
            step_s=statistics.median(sample.interval for sample in samples),
            wait_s=statistics.median(waits) if len(waits) * 2 > len(samples) else math.nan,
        )

    def stall_after(self, ceiling: float = STALL_THRESHOLD_S) -> float:
        """The stall threshold this rank's pace gives (`contract.pace.stall_threshold_for`), never later than
        `ceiling` (the run's `stall_dump_after`); 0 before it has a baseline (setup, warm-up): readers then keep the
        fixed one."""
        with self._lock:
            intervals, forgotten = [sample.interval for sample in self._samples], self._forgotten
        pace = baseline(intervals, warmup=WARMUP_STEPS - forgotten)
        return 0.0 if pace is None else stall_threshold_for(pace, ceiling)

    def step_time_ratio(self) -> float | None:
        """The window's median step interval over the run's baseline (`contract.pace.step_time_ratio`): the median of
        the first full window after warm-up, kept for the run from then on; None before."""
        with self._lock:
            samples, forgotten = list(self._samples), self._forgotten
        if not samples:
            return None
        span = samples[-1].ended - samples[0].ended + samples[0].interval
        intervals = [sample.interval for sample in samples]
        if self._baseline is None and window_full(span, len(samples)):
            self._baseline = baseline(intervals, warmup=WARMUP_STEPS - forgotten)
        if self._baseline is None:
            return None
        return step_time_ratio(statistics.median(intervals), self._baseline.median_s)

    def _forget_old(self, now: float) -> None:
        """Keep at least `window_s` and `window_steps`, whichever is longer (bounded by the deque's maxlen)."""
        samples = self._samples
        while len(samples) > self.window_steps and now - samples[1].ended + samples[1].interval >= self.window_s:
            samples.popleft()
            self._forgotten += 1


def watch_ddp(model: Any, pace: StepPace, *, hook: Callable[..., Any] | None = None, state: Any = None) -> None:
    """Time each step's last gradient bucket of `model` (a DistributedDataParallel) from the moment it is ready (this
    rank's arrival, every earlier bucket's lag included) until its all_reduce is done. `hook`/`state`: the
    communication hook the team would register itself (DDP takes one); else the default all_reduce over the model's
    own process group (a data-parallel subgroup stays one)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.futures import Future

    inner = hook or default_hooks.allreduce_hook
    if hook is None:
        state = model.process_group

    def timed(hook_state: Any, bucket: Any) -> Any:
        if not bucket.is_last():
            return inner(hook_state, bucket)
        on_gpu = bucket.buffer().is_cuda
        start = _recorded_event(torch) if on_gpu else None
        began = pace.clock()
        future = inner(hook_state, bucket)

        def ended(done: Any) -> Any:
            if start is not None:  # on the stream that waits for the collective: its end, on the GPU
                pace.waited_on_gpu(start, _recorded_event(torch))
            else:
                pace.waited(began)
            return done.value()

        return future.then(ended)

    # DDP reads the hook's annotations as objects; this module's are strings (`from __future__ import annotations`).
    bucket_type = dist.GradBucket  # type: ignore[attr-defined]  # exported by torch, undeclared
    timed.__annotations__ = {"hook_state": object, "bucket": bucket_type, "return": Future[torch.Tensor]}
    model.register_comm_hook(state, timed)
    pace.timing = True


def _recorded_event(torch: Any) -> Any:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _on_cuda(args: tuple[Any, ...]) -> bool:
    """Whether a collective's first argument (a tensor, or a list of them) is on a GPU."""
    first = args[0] if args else None
    if isinstance(first, list | tuple):
        first = first[0] if first else None
    return bool(getattr(first, "is_cuda", False))


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
        """The originals back, where they are still this object's wrappers (another's installed since stays)."""
        import torch.distributed as dist

        for name, original in self._originals.items():
            if getattr(getattr(dist, name, None), "__wrapped__", None) is original:
                setattr(dist, name, original)
        self._originals.clear()

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        import torch

        pace = self.pace
        signature = inspect.signature(original)
        async_position = list(signature.parameters).index("async_op") if "async_op" in signature.parameters else -1

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            asynchronous = kwargs.get("async_op") or (0 <= async_position < len(args) and args[async_position])
            if asynchronous:
                return original(*args, **kwargs)  # returns at once: its wait is the Work's, not timed here
            start = _recorded_event(torch) if _on_cuda(args) else None
            began = pace.clock()
            try:
                return original(*args, **kwargs)
            finally:
                if start is not None:
                    pace.waited_on_gpu(start, _recorded_event(torch))
                else:
                    pace.waited(began)

        return timed
