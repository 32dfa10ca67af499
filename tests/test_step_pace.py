"""A rank's pace (`beacon.evidence.step_pace`, issue 31): each step's interval and its wait at the step's first
collective, on a scripted clock; then four real gloo ranks, one 1.5x slower in its compute, whose step intervals
are equal while the slow rank is named, for DDP's backward all_reduce and for an explicit `dist.all_reduce`."""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from beacon.contract.pace import (
    BASELINE_MIN_STEPS,
    STALL_FLOOR_S,
    WARMUP_STEPS,
    RankPace,
    run_stall_after,
    straggler_of,
)
from beacon.contract.rank_evidence import RankProgress, stacks_name
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import RankSignal, pace_fields, read_ranks, stall_threshold
from beacon.evidence.step_pace import StepPace

from tests.support.synchronous_ranks import Clock, SynchronousRanks


def test_each_steps_interval_and_its_waits_in_collectives_summed() -> None:
    clock = Clock()
    pace = StepPace(clock)
    pace.step_finished()  # the first step: no interval yet
    for _ in range(10):
        clock.t += 0.5  # this rank's own work
        began = pace.clock()
        clock.t += 0.3  # waiting for a slower peer in the gradients' all_reduce
        pace.waited(began)
        clock.t += 0.1
        began = pace.clock()
        clock.t += 0.1  # ... and in the loss's all_reduce
        pace.waited(began)
        pace.step_finished()
    window = pace.of_rank(3)
    assert (window.rank, window.steps) == (3, 10)
    assert (window.window_s, window.step_s, window.wait_s) == pytest.approx((10.0, 1.0, 0.4))


class GpuEvent:
    """A CUDA event as the signal thread reads it: done or not, and the milliseconds from another."""

    def __init__(self, at_ms: float, done: bool = True) -> None:
        self.at_ms, self.done = at_ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: GpuEvent) -> float:
        return end.at_ms - self.at_ms


def test_a_wait_timed_on_the_gpu_is_read_once_its_events_are_done() -> None:
    clock = Clock()
    pace = StepPace(clock)
    pace.step_finished()
    ends = []
    for step in range(10):
        clock.t += 1.0  # the CPU runs ahead: its own time says nothing of the GPU's wait
        end = GpuEvent(1000.0 * step + 250.0, done=step < 9)  # the last step's collective still runs
        pace.waited_on_gpu(GpuEvent(1000.0 * step), end)
        ends.append(end)
        pace.step_finished()
    assert pace.of_rank(0).wait_s == pytest.approx(0.25), "the steps whose waits are read"
    ends[-1].done = True
    assert pace.of_rank(0).wait_s == pytest.approx(0.25)


def test_untimed_steps_state_no_wait_and_a_watched_step_without_a_collective_waited_none() -> None:
    clock = Clock()
    pace = StepPace(clock)
    for _ in range(5):
        pace.step_finished()
        clock.t += 1.0
    assert math.isnan(pace.of_rank(0).wait_s) and pace.of_rank(0).steps == 4
    pace.timing = True  # `run.watch` was called: a step that made no collective waited for nobody
    for _ in range(10):
        pace.step_finished()
        clock.t += 1.0
    assert pace.of_rank(0).wait_s == 0.0


def test_the_window_keeps_five_minutes_or_a_hundred_steps_whichever_is_longer() -> None:
    clock = Clock()
    pace = StepPace(clock)
    for _ in range(2000):  # 0.5 s steps: five minutes is 600 of them
        pace.step_finished()
        clock.t += 0.5
    window = pace.of_rank(0)
    assert 300.0 <= window.window_s <= 301.0 and window.steps in (600, 601)
    slow = StepPace(clock)
    for _ in range(300):  # 10 s steps: a hundred of them is longer than five minutes
        slow.step_finished()
        clock.t += 10.0
    assert slow.of_rank(0).steps == 100 and slow.of_rank(0).window_s == pytest.approx(1000.0)


def document_of(rank: int) -> RankProgress:
    return RankProgress(rank, rank % 2, 4, 700, "training", 0.1, 1.0, 0.9, 7, "p", "n", "i", 0)


def test_a_ranks_document_carries_its_pace_and_every_reader_gets_it_back() -> None:
    pace = RankPace(rank=2, steps=600, window_s=301.0, step_s=0.5, wait_s=0.01)
    document = {
        "rank": 2, "local_rank": 0, "world_size": 4, "step": 700, "phase": "training", "progress_age": 0.1,
        "wall_time": 1.0, "last_step_wall_time": 0.9, "pid": 7, "pod": "p", "node": "n", "instance": "i",
        "stacks_dumped": 0, **pace_fields(pace),
    }  # fmt: skip
    assert RankProgress.from_document(json.dumps(document).encode()).pace == pace
    untimed = RankPace(rank=2, steps=600, window_s=301.0, step_s=0.5, wait_s=math.nan)
    read = RankProgress.from_document(json.dumps({**document, **pace_fields(untimed)}).encode()).pace
    assert math.isnan(read.wait_s) and asdict(read) | {"wait_s": 0} == asdict(untimed) | {"wait_s": 0}
    older = {k: v for k, v in document.items() if not k.startswith("pace_")}  # a document of the release before
    assert RankProgress.from_document(json.dumps(older).encode()).pace.steps == 0


# Four gloo ranks on this machine. Each rank's own work is a sleep (no CPU: four processes on two cores stay in
# step), rank 2's 1.5x the others'; every rank makes one collective per step, then records its pace.
RANKS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from beacon.evidence.step_pace import StepPace, TimedCollectives, watch_ddp

    mode, out = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    work_s = 0.15 if rank == 2 else 0.10
    pace = StepPace()
    in_model_s = work_s if mode == "ddp" else 0.0
    if mode in ("ddp", "ddp-stop"):
        class SlowBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()
            @staticmethod
            def backward(ctx, grad):
                time.sleep(in_model_s / 2)  # half of this rank's work, between two buckets' gradients
                return grad
        class Slow(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.first, self.last = torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)
            def forward(self, x):
                time.sleep(in_model_s / 2)  # the other half
                return self.last(SlowBackward.apply(self.first(x)))
        # a bucket per layer: the lag grows between the first bucket's gradients and the last's
        model = torch.nn.parallel.DistributedDataParallel(Slow(), bucket_cap_mb=0.001)
        watch_ddp(model, pace)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        timed = TimedCollectives(pace).install()
    stamps = []
    for step in range(30):
        if mode == "ddp-stop":  # Beacon's stop flag first (`Run.should_stop`), the rank's work between two steps
            with pace.waiting():
                c10d.all_reduce(torch.zeros(1, dtype=torch.int32), op=dist.ReduceOp.MAX)
            optimizer.zero_grad()
            model(torch.ones(2, 64)).sum().backward()
            optimizer.step()
            time.sleep(work_s)
        elif mode == "ddp":
            optimizer.zero_grad()
            model(torch.ones(2, 64)).sum().backward()  # the all_reduce runs inside, from DDP's C++ hooks
            optimizer.step()
        else:
            time.sleep(work_s)
            dist.all_reduce(torch.ones(1))
        pace.step_finished()
        stamps.append(time.monotonic())
    if mode == "explicit":
        timed.remove()
    intervals = [b - a for a, b in zip(stamps[5:], stamps[6:])]
    p = pace.of_rank(rank)
    with open(f"{out}/rank-{rank}.json", "w") as f:
        json.dump({"intervals": intervals, "steps": p.steps, "window_s": p.window_s, "step_s": p.step_s,
                   "wait_s": p.wait_s}, f)
    dist.barrier()  # a rank that tears its group down while a peer still finishes the last all_reduce aborts it
    dist.destroy_process_group()
    """
)


@pytest.mark.parametrize("mode", ["ddp", "explicit", "ddp-stop"])
def test_four_gloo_ranks_step_together_and_the_one_the_others_wait_for_is_named(mode: str, tmp_path: Path) -> None:
    """`ddp-stop`: the loop asks Beacon whether to stop at each step's start (a CPU collective of Beacon's own) and the
    slow rank's work lies between steps: the others wait for it there, not in DDP's all_reduce, and it counts."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BEACON_", "TORCHELASTIC_"))}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", "--master-port=0",
               "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", str(script), mode, str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    medians = [statistics.median(r["intervals"]) for r in ranks]
    assert max(medians) - min(medians) < 0.02 * max(medians), medians  # the slow rank's pace is everyone's
    assert all(m >= 0.15 for m in medians)
    paces = [RankPace(rank=r, steps=d["steps"], window_s=d["window_s"], step_s=d["step_s"], wait_s=d["wait_s"])
             for r, d in enumerate(ranks)]  # fmt: skip
    straggler = straggler_of(paces)
    assert straggler is not None and straggler.rank == 2, paces
    assert 1.3 <= straggler.step_ratio <= 1.8 and straggler.waited_share >= 0.25, straggler
    assert all(d["wait_s"] >= 0.03 for r, d in enumerate(ranks) if r != 2) and ranks[2]["wait_s"] < 0.02


def test_one_rank_of_four_slower_in_its_work_is_named_within_six_minutes_while_every_interval_is_equal() -> None:
    job = SynchronousRanks(4)
    noise = random.Random(3)
    while job.clock.t < 1000.0 + 600:  # ten healthy minutes: the window is full
        job.step([noise.uniform(0.7, 1.3) for _ in range(4)])
        assert (straggler := job.straggler()) is None or not straggler.is_slow()
    slowed_at, named_at = job.clock.t, 0.0
    while not named_at and job.clock.t < slowed_at + 900:
        job.step([noise.uniform(0.7, 1.3) * (1.5 if rank == 2 else 1.0) for rank in range(4)])
        if (straggler := job.straggler()) is not None and straggler.is_slow():
            named_at = job.clock.t
            assert straggler.rank == 2 and straggler.step_ratio >= 1.3, straggler
    assert named_at and named_at - slowed_at <= 360, named_at - slowed_at
    # Every rank's own clock saw the same step intervals: the slowest rank's.
    spans = {round(pace.of_rank(0).step_s, 9) for pace in job.paces}
    assert len(spans) == 1


def test_an_hour_of_a_healthy_run_with_jitter_a_long_checkpoint_an_evaluation_and_a_pause_is_never_slow() -> None:
    job = SynchronousRanks(4)
    noise = random.Random(11)
    events = {600: ("checkpoint on rank 0", [150.0, 0, 0, 0]), 1200: ("evaluation", [30.0] * 4),
              1800: ("an unwrapped pause", [60.0] * 4), 2400: ("checkpoint on rank 3", [0, 0, 0, 150.0])}  # fmt: skip
    step = 0
    while job.clock.t < 1000.0 + 3600:
        extra = events.get(step, ("", [0.0] * 4))[1]
        job.step([noise.uniform(0.7, 1.3) + extra[rank] for rank in range(4)])  # +-30 % of 1 s steps
        step += 1
        if step % 5 == 0:  # as often as rank 0's heartbeat reads the documents, at 1 s steps
            straggler = job.straggler()
            assert straggler is not None and not straggler.is_slow(), (step, straggler)


def test_the_stall_threshold_follows_the_pace_after_warm_up_with_phases_left_out() -> None:
    clock = Clock()
    progress = ProgressClock(clock)
    progress.step_finished()  # the first step: intervals are counted from it
    for step in range(WARMUP_STEPS + BASELINE_MIN_STEPS):
        assert progress.pace.stall_after() == 0.0, "no baseline yet: the fixed threshold holds"
        clock.t += 20.0 if step < WARMUP_STEPS else 1.0  # compiling, then 1 s steps
        if step == WARMUP_STEPS + 10:
            with progress.phase("checkpoint"):
                clock.t += 150.0  # work, not the pace
        progress.step_finished()
    assert progress.pace.stall_after() == STALL_FLOOR_S  # max(30 s, 20 x 1 s)
    for _ in range(2000):  # the window forgets the warm-up: the baseline keeps to what it holds
        clock.t += 2.0
        progress.step_finished()
    assert progress.pace.stall_after() == 40.0


def test_a_rank_dumps_its_stacks_at_its_paces_threshold_and_states_it_in_its_document(tmp_path: Path) -> None:
    clock = Clock()
    progress = ProgressClock(clock)
    progress.leave("setup")
    for step in range(200):
        clock.t += 1.0
        progress.dispatched_step = step
        progress.step_finished()
    signal = RankSignal(tmp_path, rank=0, local_rank=0, world_size=1, progress=progress, interval=0.05,
                        stall_dump_after=90.0)  # fmt: skip
    signal.start()
    try:
        clock.t += 29.0
        time.sleep(0.3)
        assert "no progress for" not in (tmp_path / stacks_name(0)).read_text()
        clock.t += 2.0  # 31 s without a step at 1 s steps: past max(30 s, 20 x 1 s), long before 90 s
        deadline = time.monotonic() + 10
        while "no progress for" not in (tmp_path / stacks_name(0)).read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "no progress for 31 s after step 199" in (tmp_path / stacks_name(0)).read_text()
        (document,) = read_ranks(tmp_path)
        assert document.stall_after_s == STALL_FLOOR_S
    finally:
        signal.stop()


def test_the_runs_threshold_is_the_longest_its_ranks_state_never_past_stall_dump_after() -> None:
    assert run_stall_after([], 90.0) == 90.0
    assert run_stall_after([0.0, 0.0], 90.0) == 90.0, "no rank has a baseline yet"
    assert run_stall_after([30.0, 40.0, 0.0], 90.0) == 40.0
    assert run_stall_after([30.0], 3.0) == 3.0, "a team's shorter stall_dump_after wins"
    stated = [replace(document_of(rank), stall_after_s=30.0) for rank in range(4)]
    assert stall_threshold(90.0, 15.0, stated) == 35.0, "dumped at 30 s, within one 5 s pass"
    assert stall_threshold(90.0, 15.0) == 95.0
