"""A run's own pace (issue 31, its first slice): the step-time baseline after warm-up and the stall threshold that
follows it. Pure, in the contract, so rank 0, the node leaders, the doctor and the alarm's function can read one
rule; every default of it is here.

A rank is stalled once its progress is older than max(STALL_FLOOR_S, STALL_STEPS x the run's p99 step time), never
later than today's `STALL_THRESHOLD_S`. Before the run has a baseline (setup, warm-up) the fixed threshold holds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from beacon.contract.alarms import STALL_THRESHOLD_S

# Warm-up: the first steps (compile, cache warming, the first collective's setup) are not the run's pace.
WARMUP_STEPS = 50
BASELINE_MIN_STEPS = 50  # step times after warm-up before a baseline is stated
STALL_FLOOR_S = 30.0  # never sooner than this: a checkpoint-free pause of a fast run is not a hang
STALL_STEPS = 20  # ... nor sooner than this many of the run's slowest (p99) steps
# The slow verdicts' defaults (issue 31): one rank the others wait for, or the whole run slower than its baseline.
SLOW_RANK_SHARE = 0.25  # of the step, waited for one rank
SLOW_RANK_FOR_S = 300.0  # ... for this long, or SLOW_RANK_FOR_STEPS, whichever is longer
SLOW_RANK_FOR_STEPS = 100
RUN_SLOWED_RATIO = 1.5  # the run's step time over its baseline median
RUN_SLOWED_FOR_S = 600.0


@dataclass(frozen=True)
class Baseline:
    """The run's step time after warm-up: its median and its 99th percentile, from `steps` step times."""

    median_s: float
    p99_s: float
    steps: int


def baseline(step_times: Sequence[float]) -> Baseline | None:
    """The baseline of a run's step times in the order taken (seconds each), warm-up left out; None until there are
    `BASELINE_MIN_STEPS` after it. A non-finite or negative time (a clock stepped back) is left out too."""
    kept = sorted(t for t in step_times[WARMUP_STEPS:] if math.isfinite(t) and t >= 0)
    if len(kept) < BASELINE_MIN_STEPS:
        return None
    p99 = kept[min(len(kept) - 1, math.ceil(0.99 * len(kept)) - 1)]
    return Baseline(statistics.median(kept), p99, len(kept))


def stall_threshold_for(pace: Baseline | None) -> float:
    """Seconds of progress age past which a rank is stalled, for a run at this pace (the fixed threshold without
    one)."""
    if pace is None:
        return float(STALL_THRESHOLD_S)
    return min(float(STALL_THRESHOLD_S), max(STALL_FLOOR_S, STALL_STEPS * pace.p99_s))
