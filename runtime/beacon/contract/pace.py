"""A run's own pace (issue 31): the step-time baseline after warm-up, the stall threshold that follows it, and the
rank the others wait for. Pure, in the contract, so rank 0, the node leaders, the doctor and the alarm's function
read one rule; every default of it is here.

A rank is stalled once its progress is older than max(STALL_FLOOR_S, STALL_STEPS x the run's p99 step time), never
later than today's `STALL_THRESHOLD_S`. Before the run has a baseline (setup, warm-up) the fixed threshold holds.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from beacon.contract.alarms import STALL_THRESHOLD_S

# Warm-up: the first steps (compile, cache warming, the first collective's setup) are not the run's pace.
WARMUP_STEPS = 50
BASELINE_MIN_STEPS = 50  # step times after warm-up before a baseline is stated
STALL_FLOOR_S = 30.0  # never sooner than this: a checkpoint-free pause of a fast run is not a hang
STALL_STEPS = 20  # ... nor sooner than this many of the run's slowest (p99) steps
# The slow verdicts' defaults (issue 31): one rank the others wait for, or the whole run slower than its baseline.
SLOW_RANK_SHARE = 0.25  # of the step, waited for one rank: a rank 1.33x slower (the team file may set it)
# The shares a team may set: under the least a healthy run's jitter names a rank; from the most on, only a hang is slow.
SLOW_RANK_SHARES = (0.1, 0.9)
SLOW_RANK_FOR_S = 300.0  # ... for this long, or SLOW_RANK_FOR_STEPS, whichever is longer
SLOW_RANK_FOR_STEPS = 100
# Rank 0's heartbeat sends StragglerWaitShare, the window's medians: it passes SLOW_RANK_SHARE some 3 minutes into a
# slowdown (once more than half the window is slowed), so 2 more minutes of every share sent at it or above make the
# 5 of SLOW_RANK_FOR_S (`rank_slow`; the slow alarm's periods).
SLOW_RANK_SUSTAINED_S = 120.0
RUN_SLOWED_RATIO = 1.5  # the run's step time over its baseline median
RUN_SLOWED_FOR_S = 600.0
SLOW_REFRESH_BEATS = 40  # rank 0 snapshots the ranks' documents once a slow episode begins, then this rarely


@dataclass(frozen=True)
class Baseline:
    """The run's step time after warm-up: its median and its 99th percentile, from `steps` step times."""

    median_s: float
    p99_s: float
    steps: int


def baseline(step_times: Sequence[float], *, warmup: int = WARMUP_STEPS) -> Baseline | None:
    """The baseline of a run's step times in the order taken (seconds each), its first `warmup` left out (fewer when
    the sequence is a window that no longer holds them all); None until there are `BASELINE_MIN_STEPS` after it. A
    non-finite or negative time (a clock stepped back) is left out too."""
    kept = sorted(t for t in step_times[max(0, warmup) :] if math.isfinite(t) and t >= 0)
    if len(kept) < BASELINE_MIN_STEPS:
        return None
    p99 = kept[min(len(kept) - 1, math.ceil(0.99 * len(kept)) - 1)]
    return Baseline(statistics.median(kept), p99, len(kept))


def run_stall_after(stated: Iterable[float], fixed: float) -> float:
    """The run's stall threshold from what its ranks' documents state (`RankProgress.stall_after_s`; 0: none yet),
    the longest of them, never later than `fixed` (the run's `stall_dump_after`); `fixed` while none states one."""
    return min(fixed, max((s for s in stated if s > 0), default=fixed))


def stall_threshold_for(pace: Baseline | None, ceiling: float = STALL_THRESHOLD_S) -> float:
    """Seconds of progress age past which a rank is stalled, for a run at this pace, never later than `ceiling` (the
    run's `stall_dump_after`: a team that raised it for 60 s steps keeps it); `ceiling` without a pace."""
    if pace is None:
        return float(ceiling)
    return min(float(ceiling), max(STALL_FLOOR_S, STALL_STEPS * pace.p99_s))


# A rank's pace as its document states it (`RankProgress.pace_*`): a window of its last steps, at least
# SLOW_RANK_FOR_S and SLOW_RANK_FOR_STEPS long once the run has been stepping that long.
PACE_WINDOW_MAX_STEPS = 20_000  # the most step samples a rank keeps (two floats each)


@dataclass(frozen=True)
class RankPace:
    """One rank's window of steps: how many, how long, its median step interval, and its median wait at each
    step's first collective (NaN where it timed none: `run.watch` was not called)."""

    rank: int
    steps: int
    window_s: float
    step_s: float
    wait_s: float

    @property
    def busy_s(self) -> float:
        """The time this rank's own work took of a step: the interval less what it waited for its peers."""
        return self.step_s - self.wait_s


@dataclass(frozen=True)
class Straggler:
    """The rank the others wait for. In synchronous training every rank's step interval is the slowest rank's, so
    it is named by what it does *not* wait for: it arrives last at each step's first collective and waits least.
    `waited_share` is how much of a step the others (their median) wait for it beyond its own wait;
    `step_ratio` is its busy time over the others' median (`SlowestRankStepRatio`)."""

    rank: int
    step_ratio: float
    waited_share: float
    window_s: float
    steps: int

    @property
    def window_full(self) -> bool:
        """Every rank's window is full (`window_full`): what the slow verdict and its metric wait for, so a run's
        first minutes raise nothing."""
        return window_full(self.window_s, self.steps)

    def is_slow(self, *, share: float = SLOW_RANK_SHARE) -> bool:
        """Slow for the verdict: waited for by `share` of the step or more (the window's medians: most of it), over
        a window that reaches back SLOW_RANK_FOR_S and SLOW_RANK_FOR_STEPS of its steps (whichever is longer)."""
        return self.window_full and self.waited_share >= share


WINDOW_SLACK = 0.95  # a window written a pass before its span reached the mark still counts


def window_full(window_s: float, steps: int) -> bool:
    """A window of `steps` steps spanning `window_s` reaches back SLOW_RANK_FOR_S and SLOW_RANK_FOR_STEPS (whichever
    is longer), or holds all the steps a rank keeps (a run of steps under 15 ms)."""
    long_enough = window_s >= SLOW_RANK_FOR_S * WINDOW_SLACK or steps >= PACE_WINDOW_MAX_STEPS
    return steps >= SLOW_RANK_FOR_STEPS and long_enough


def straggler_of(paces: Sequence[RankPace]) -> Straggler | None:
    """The rank the others wait for most, from two or more ranks that timed their collectives; None otherwise
    (one rank, or waits not timed)."""
    timed = [p for p in paces if p.steps and math.isfinite(p.wait_s) and math.isfinite(p.step_s) and p.step_s > 0]
    if len(timed) < 2:
        return None
    slowest = max(timed, key=lambda p: (p.busy_s, -p.wait_s))
    others = [p for p in timed if p.rank != slowest.rank]
    others_busy = statistics.median(p.busy_s for p in others)
    others_wait = statistics.median(p.wait_s for p in others)
    step_s = statistics.median(p.step_s for p in timed)
    return Straggler(
        rank=slowest.rank,
        step_ratio=slowest.busy_s / others_busy if others_busy > 0 else math.inf,
        waited_share=max(0.0, others_wait - slowest.wait_s) / step_s,
        window_s=min(p.window_s for p in timed),
        steps=min(p.steps for p in timed),
    )


# The run slowed: its heartbeat sends StepTimeRatio, its window's median step interval over the baseline kept from
# its first full window after warm-up (`StepPace.step_time_ratio`), while it steps and no rank stands out. The
# window's median passes RUN_SLOWED_RATIO some 3 minutes into a slowdown (once more than half its 5 minutes are
# slowed), so 7 more minutes of every ratio sent at it or above make the 10 of RUN_SLOWED_FOR_S.
RUN_SLOWED_SUSTAINED_S = 420.0


def step_time_ratio(step_s: float, baseline_s: float) -> float:
    """A window's median step interval over the run's baseline median: 1 at the run's own pace."""
    return step_s / baseline_s if baseline_s > 0 else math.inf


def sustained(
    samples: Sequence[tuple[float, float]], now: float, *, span_s: float, at_least: float, gap_s: float
) -> float | None:
    """The least of `samples` (epoch seconds, value) over the last `span_s` when every one is `at_least` or more, the
    first of them that long ago and the last one fresh (both within `gap_s`: a few heartbeats); else None. What an
    alarm of that span's periods, every one breaching, says too."""
    recent = [(at, value) for at, value in samples if now - span_s - gap_s <= at <= now]
    if not recent or now - recent[-1][0] > gap_s or recent[0][0] > now - span_s + gap_s:
        return None
    least = min(value for _, value in recent)
    return least if least >= at_least else None


def rank_slow(
    shares: Sequence[tuple[float, float]], now: float, *, gap_s: float, share: float = SLOW_RANK_SHARE
) -> float | None:
    """The share of each step the ranks wait for the straggler when it is slow for the verdict: each StragglerWaitShare
    of the last SLOW_RANK_SUSTAINED_S at the run's `share` or more (`sustained`); the least of them, else None."""
    return sustained(shares, now, span_s=SLOW_RANK_SUSTAINED_S, at_least=share, gap_s=gap_s)


def slow_share_hold_s(step_s: float) -> float:
    """How far back rank 0 holds the share it sends to the least of the values it saw, so that a rank is named only
    once slow for SLOW_RANK_FOR_STEPS steps where they outlast SLOW_RANK_FOR_S (steps over 2.7 s). The window's
    medians pass the share once half its span is slowed, and the verdict asks SLOW_RANK_SUSTAINED_S more: at 6 s
    steps, 300 s + 120 s is 70 steps, so the share is held 180 s. 0 at shorter steps, where the verdict is as it was."""
    window_s = max(SLOW_RANK_FOR_S, SLOW_RANK_FOR_STEPS * step_s)
    return max(0.0, SLOW_RANK_FOR_STEPS * step_s - window_s / 2 - SLOW_RANK_SUSTAINED_S)


class SentShare:
    """What rank 0's heartbeat sends as StragglerWaitShare, beat by beat: the straggler's waited share (its window's
    medians), held to the least of those sent over the last `slow_share_hold_s` while the same rank is the straggler
    (a new straggler starts the hold again; a stall, which sends none, does not: a slow rank that hangs a while is
    not named sooner after). One rule for the runtime and the project's own alarm evaluator."""

    def __init__(self) -> None:
        self._rank: int | None = None
        self._seen: deque[tuple[float, float]] = deque()

    def sent(self, straggler: Straggler, now: float) -> float:
        if straggler.rank != self._rank:
            self._rank, self._seen = straggler.rank, deque()
        self._seen.append((now, straggler.waited_share))
        hold_s = slow_share_hold_s(straggler.window_s / straggler.steps if straggler.steps else 0.0)
        while self._seen[0][0] < now - hold_s:
            self._seen.popleft()
        return min(share for _, share in self._seen)


def stands_out(straggler: Straggler | None, share: float) -> bool:
    """Whether a rank stands out enough that the run must not be said slowed as a whole (its StepTimeRatio is then not
    sent): slow at the run's `share`, or at the default where a team raised it. A rank waited for 37 % of each step is
    not slow for a team at 40 %, but the run's 1.6x is still that rank's, not its data's."""
    return straggler is not None and straggler.is_slow(share=min(share, SLOW_RANK_SHARE))


def slow_rank_share_problem(share: object) -> str | None:
    """Why `share` cannot be a run's slow-rank share (`SLOW_RANK_SHARES`), or None: one rule for the team file, the
    run's settings and its preflight record."""
    least, most = SLOW_RANK_SHARES
    if isinstance(share, bool) or not isinstance(share, int | float) or not least <= share <= most:
        return f"must be a share of the step from {least} to {most}, got {share!r}"
    return None


def run_slowed(ratios: Sequence[tuple[float, float]], now: float, *, gap_s: float) -> float | None:
    """The run's step time over its baseline when the run as a whole has slowed (every rank alike: its data, storage
    or network): each StepTimeRatio of the last RUN_SLOWED_SUSTAINED_S at RUN_SLOWED_RATIO or more (`sustained`);
    the least of them, else None."""
    return sustained(ratios, now, span_s=RUN_SLOWED_SUSTAINED_S, at_least=RUN_SLOWED_RATIO, gap_s=gap_s)
