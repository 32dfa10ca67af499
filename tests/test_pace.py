"""The run's own pace (issue 31, first slice): `beacon.contract.pace`, its baseline and the stall threshold."""

from __future__ import annotations

import random

import pytest
from beacon.contract.alarms import STALL_THRESHOLD_S
from beacon.contract.pace import (
    BASELINE_MIN_STEPS,
    RUN_SLOWED_RATIO,
    RUN_SLOWED_SUSTAINED_S,
    SLOW_RANK_SHARE,
    STALL_FLOOR_S,
    WARMUP_STEPS,
    Straggler,
    baseline,
    run_slowed,
    stall_threshold_for,
    stands_out,
    step_time_ratio,
)


def test_warm_up_is_left_out_and_no_baseline_is_stated_before_enough_steps() -> None:
    compiling = [30.0] * WARMUP_STEPS  # the first steps compile
    assert baseline([*compiling, *[1.0] * (BASELINE_MIN_STEPS - 1)]) is None
    pace = baseline([*compiling, *[1.0] * BASELINE_MIN_STEPS])
    assert pace is not None and (pace.median_s, pace.p99_s, pace.steps) == (1.0, 1.0, BASELINE_MIN_STEPS)


@pytest.mark.parametrize(
    ("step_s", "threshold"),
    [(0.5, STALL_FLOOR_S), (1.0, STALL_FLOOR_S), (2.0, 40.0), (4.0, 80.0), (10.0, STALL_THRESHOLD_S), (60.0, 90.0)],
)
def test_the_stall_threshold_follows_the_pace_between_its_floor_and_todays_90_s(
    step_s: float, threshold: float
) -> None:
    pace = baseline([step_s] * (WARMUP_STEPS + 200))
    assert stall_threshold_for(pace) == threshold


def test_a_raised_stall_dump_after_is_the_ceiling_for_slow_steps_and_fast_steps_still_get_30_s() -> None:
    assert stall_threshold_for(baseline([60.0] * (WARMUP_STEPS + 200)), 300.0) == 300.0, "60 s steps keep it"
    assert stall_threshold_for(baseline([1.0] * (WARMUP_STEPS + 200)), 300.0) == STALL_FLOOR_S
    assert stall_threshold_for(None, 300.0) == 300.0
    assert stall_threshold_for(baseline([1.0] * (WARMUP_STEPS + 200)), 3.0) == 3.0, "a shorter one wins"


def test_without_a_baseline_the_fixed_threshold_holds_and_jitter_moves_it_by_the_p99() -> None:
    assert stall_threshold_for(None) == STALL_THRESHOLD_S
    noise = random.Random(7)
    jittery = [2.0 * (1 + noise.uniform(-0.3, 0.3)) for _ in range(WARMUP_STEPS + 1000)]  # 2 s steps, +-30 %
    pace = baseline([*jittery, float("nan"), -1.0])  # a clock stepped back: left out
    assert pace is not None and 2.5 <= pace.p99_s <= 2.6 and pace.steps == 1000
    assert stall_threshold_for(pace) == pytest.approx(20 * pace.p99_s)


def test_the_run_slowed_only_when_every_ratio_over_the_sustained_span_is_at_the_ratio_and_the_span_is_covered() -> None:
    now, gap = 10_000.0, 45.0
    beats = [now - t for t in range(int(RUN_SLOWED_SUSTAINED_S) + 60, -1, -15)]
    assert run_slowed([(at, 1.7) for at in beats], now, gap_s=gap) == pytest.approx(1.7)
    one_below = [(at, 1.4 if i == 10 else 1.7) for i, at in enumerate(beats)]
    assert run_slowed(one_below, now, gap_s=gap) is None, "every ratio of the span, as the alarm's periods"
    recent_only = [(at, 1.7) for at in beats if at > now - RUN_SLOWED_SUSTAINED_S / 2]
    assert run_slowed(recent_only, now, gap_s=gap) is None, "slowed for half the span is not yet slowed"
    stale = [(at - 120, 1.7) for at in beats]
    assert run_slowed(stale, now, gap_s=gap) is None, "the heartbeat stopped sending it: a rank stood out, or hung"
    assert run_slowed([(at, RUN_SLOWED_RATIO) for at in beats], now, gap_s=gap) == RUN_SLOWED_RATIO
    assert run_slowed([], now, gap_s=gap) is None
    assert step_time_ratio(1.5, 1.0) == 1.5 and step_time_ratio(1.0, 0.0) == float("inf")


def test_a_rank_under_a_teams_raised_share_still_stands_out_so_the_run_is_not_said_slowed_for_it() -> None:
    """A team at 40 %: a rank 1.6x slower (the others wait 37.5 % of each step) is not slow for its verdict, but its
    run's 1.6x is that rank's, so the heartbeat sends no StepTimeRatio for it (the run-slowed verdict's evidence)."""
    rank_1_6x = Straggler(rank=2, step_ratio=1.6, waited_share=0.375, window_s=301.0, steps=200)
    assert not rank_1_6x.is_slow(share=0.4) and stands_out(rank_1_6x, 0.4)
    assert stands_out(rank_1_6x, SLOW_RANK_SHARE) and stands_out(rank_1_6x, 0.3), "a lowered share: its own"
    assert not stands_out(Straggler(2, 1.1, 0.1, 301.0, 200), 0.4) and not stands_out(None, 0.4)
    assert not stands_out(Straggler(2, 1.6, 0.375, 100.0, 100), 0.4), "a window not yet full says nothing"
