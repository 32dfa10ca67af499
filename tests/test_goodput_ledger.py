"""The goodput ledger's arithmetic (issue 30, its first slice): `beacon.contract.goodput`, on a hand-built timeline."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from beacon.contract.goodput import (
    INSTANCE_PRICES,
    ON_DEMAND,
    PRICES_AS_OF,
    SPOT,
    Attempt,
    Category,
    PhaseInterval,
    cost_of,
    ledger,
)

INSTANCES = 2


def steps(first: int, last: int, at: float, live_through: int) -> list[tuple[float, bool]]:
    """Records of steps first..last, one a second from `at`; live through `live_through`, superseded after."""
    return [(at + (step - first), step <= live_through) for step in range(first, last + 1)]


# Three attempts: a SIGKILL after step 120 with the last checkpoint at 100 (101-120 done again); then an evaluation,
# a checkpoint at 140 and a hang from step 200 until the liveness probe's kill (141-200 done again); then the rest.
TIMELINE = [
    Attempt(0, INSTANCES, pod_created=0, process_start=60, end=225,
            record_times=steps(0, 120, at=100, live_through=100), phases=[PhaseInterval("checkpoint", 150, 152)]),
    Attempt(1, INSTANCES, pod_created=255, process_start=285, end=519,
            record_times=steps(101, 200, at=300, live_through=140),
            phases=[PhaseInterval("evaluation", 320, 330), PhaseInterval("checkpoint", 339, 341)], hang_from=399),
    Attempt(2, INSTANCES, pod_created=549, process_start=569, end=702, record_times=steps(141, 240, at=600,
            live_through=240)),
]  # fmt: skip


def test_every_instance_second_of_a_known_timeline_is_in_its_category_and_they_sum_to_the_run() -> None:
    book = ledger(TIMELINE)
    per_instance = {category: seconds / INSTANCES for category, seconds in book.seconds.items()}
    assert per_instance == {
        Category.START: 60 + 30 + 20,
        Category.SETUP: 40 + 15 + 31,  # to each attempt's first record
        Category.PRODUCTIVE: 98 + 29 + 99,  # live steps, less the phases inside them
        Category.CHECKPOINT: 2 + 2,
        Category.EVALUATION: 10,
        Category.WASTED_PROGRESS: 20 + 58,  # steps 101-120, then 141-200 less the checkpoint inside them
        Category.HANG: 120,
        Category.RESTART_GAP: 30 + 30,
        Category.UNACCOUNTED: 5 + 3,
    }
    assert book.total == 702 * INSTANCES, "the run's instance-seconds, exactly"
    assert book.why == {"after the last step: the drain and the exit": 8 * INSTANCES}
    assert book.goodput() == pytest.approx(226 / 702)


def test_a_rank_hung_inside_a_checkpoint_is_a_hang_from_its_last_progress() -> None:
    attempt = Attempt(0, 1, process_start=0, end=100, record_times=steps(0, 10, at=0, live_through=10),
                      phases=[PhaseInterval("checkpoint", 10, 100)], hang_from=50)  # fmt: skip
    book = ledger([attempt])
    assert (book.seconds[Category.CHECKPOINT], book.seconds[Category.HANG]) == (40, 50)
    assert book.total == 100


def test_a_run_before_pod_times_is_accounted_from_its_process_start() -> None:
    book = ledger([Attempt(0, 4, process_start=10, end=20, record_times=steps(0, 5, at=12, live_through=5))])
    assert book.seconds[Category.START] == 0 and book.seconds[Category.SETUP] == 2 * 4
    assert book.total == 10 * 4


def test_attempts_whose_clocks_overlap_count_no_second_twice() -> None:
    """A pod's clock against a process's: attempt 1 says it began 20 s before attempt 0 ended."""
    book = ledger([
        Attempt(0, 2, process_start=0, end=100, record_times=steps(0, 50, at=10, live_through=50)),
        Attempt(1, 2, pod_created=80, process_start=110, end=150, record_times=steps(51, 70, at=120, live_through=70)),
    ])  # fmt: skip
    assert book.total == 150 * 2 and book.seconds[Category.RESTART_GAP] == 0
    assert book.seconds[Category.START] == 10 * 2, "from attempt 0's end to the process start"


def test_fractional_times_sum_to_the_run_to_the_floats_rounding() -> None:
    attempt = Attempt(0, 8, pod_created=0.1, process_start=3.7, end=91.3,
                      record_times=[(4.2 + 0.37 * n, n < 150) for n in range(200)],
                      phases=[PhaseInterval("checkpoint", 20.05, 21.15), PhaseInterval("evaluation", 60.5, 75.25)],
                      hang_from=80.9)  # fmt: skip
    book = ledger([attempt])
    assert book.total == pytest.approx((91.3 - 0.1) * 8, abs=1e-9)
    assert all(seconds >= 0 for seconds in book.seconds.values())


def test_a_runs_ledger_from_its_evidence_counts_the_steps_a_restart_redid_as_wasted() -> None:
    """`beacon_ops.evidence.goodput`: attempt 0 logs steps 0-9 and is killed; attempt 1 resumes at 5. Each attempt
    begins at its preflight; attempt 0's steps 5-9 are superseded, their time wasted progress."""
    from beacon.contract import Record

    from beacon_ops.evidence.goodput import run_ledger
    from beacon_ops.evidence.reading import RunEvidence

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(seconds, UTC).isoformat()

    records = [Record("e", "r", step, {"loss": 1.0}, 100.0 + step, attempt=0, seq=step) for step in range(10)]
    records += [Record("e", "r", step, {"loss": 1.0}, 205.0 + step, attempt=1, seq=5 + step) for step in range(5, 15)]
    evidence = RunEvidence("e", "r", records=records, preflights=[{"started_at": at(90)}, {"started_at": at(200)}],
                           final={"state": "finished", "attempt": 1, "ended_at": 222.0})  # fmt: skip
    book = run_ledger(evidence)
    assert book.seconds[Category.WASTED_PROGRESS] == 5  # steps 5-9 of attempt 0
    assert book.seconds[Category.PRODUCTIVE] == 4 + 9  # 1-4, then 6-14
    assert book.seconds[Category.SETUP] == 10 + 10  # preflight to the first record
    assert book.seconds[Category.RESTART_GAP] == 200 - 109
    assert book.why == {"after the last step: the drain and the exit": 222 - 219}
    assert book.total == 222 - 90


# --- dollars (issue 30): instance-hours at the instance's hourly price, dated ----------------------------------
def test_instance_hours_are_priced_at_the_dated_list_price_or_the_teams_own_and_spot_only_where_stated() -> None:
    hung = cost_of(14 * 60, instances=8, instance_type="p5.48xlarge", capacity=ON_DEMAND)
    assert hung.instance_hours == pytest.approx(8 * 14 / 60) and hung.dollars == pytest.approx(8 * 14 / 60 * 55.04)
    assert hung.on() == "8 instances of p5.48xlarge"
    assert hung.priced() == f"1.87 instance-hours, $103 at on-demand (list prices of {PRICES_AS_OF})"
    spot = cost_of(3600, instances=2, instance_type="g6.12xlarge", capacity=SPOT)
    assert spot.dollars is None, "spot moves by the hour: no list price for it"
    assert spot.priced() == f"2.00 instance-hours (no spot price for g6.12xlarge in the list prices of {PRICES_AS_OF})"
    negotiated = cost_of(3600, instances=2, instance_type="g6.12xlarge", capacity=SPOT,
                         prices={SPOT: {"g6.12xlarge": 1.5}})  # fmt: skip
    assert negotiated.priced() == "2.00 instance-hours, $3.00 at spot (the team's prices)"
    unrecorded = cost_of(1800, instances=1, instance_type="g6.xlarge")
    assert unrecorded.priced().endswith("at on-demand (capacity type not recorded) (list prices of 2026-12-01)")
    assert cost_of(60, instances=3, instance_type="").priced() == "0.05 instance-hours (no instance type recorded)"
    assert all(p.on_demand_hourly > 0 and p.gpus >= 0 for p in INSTANCE_PRICES.values())
