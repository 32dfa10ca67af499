"""TensorBoard as a view of the records: whole files TensorBoard reads, every record up to the view's
rate, evenly thinned above it (S3 keeps every record; `make bench` measures the rate this buys)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from beacon.contract import Record
from beacon.tensorboard_view import SEALED, TensorBoardView, thin_evenly
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader


def records(steps: range, **extra: float) -> list[Record]:
    return [Record("exp", "run-1", step, {"loss": 1.0 / (step + 1), **extra}, 1_700_000_000.0 + step) for step in steps]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {}
    for event in LegacyEventFileLoader(str(path)).Load():
        for value in event.summary.value:
            found.setdefault(value.tag, []).append((event.step, value.simple_value))
    return found


def test_every_record_under_the_rate_is_one_event_with_every_metric_in_a_whole_sealed_file(tmp_path: Path) -> None:
    view = TensorBoardView(tmp_path / "tb", points_per_s=1000, clock=Clock())
    view.write(records(range(50), lr=0.5, nan_grad=math.nan), part=7)
    assert not view.sealed(), "no file is offered for upload while its part is open"
    view.rotate()
    (sealed,) = view.sealed()
    assert sealed.name.startswith("part-00000007.events.out.tfevents.") and sealed.name.endswith(SEALED)
    found = scalars(sealed)
    assert [step for step, _ in found["loss"]] == list(range(50))
    assert found["loss"][3][1] == 0.25 and all(value == 0.5 for _, value in found["lr"])
    assert all(math.isnan(value) for _, value in found["nan_grad"]), "NaN stays NaN in the view"
    assert view.thinned == 0 and not [p for p in (tmp_path / "tb").glob("part-*") if p.is_dir()]


def test_above_the_rate_the_view_is_thinned_evenly_and_keeps_each_flushs_last_record(tmp_path: Path) -> None:
    clock = Clock()
    view = TensorBoardView(tmp_path / "tb", points_per_s=100, clock=clock)
    view.write(records(range(1000)), part=0)  # one flush, ten times the budget
    clock.now += 0.5  # half a second refills half the budget
    view.write(records(range(1000, 1400)), part=0)
    view.rotate()
    steps = [step for step, _ in scalars(view.sealed()[0])["loss"]]
    first, second = steps[:100], steps[100:]
    assert len(first) == 100 and first[-1] == 999
    assert {b - a for a, b in itertools.pairwise(first)} == {10}, "evenly spaced"
    assert len(second) == 50 and second[-1] == 1399
    assert view.thinned == 1400 - 150


def test_thin_evenly_keeps_at_least_the_last_record() -> None:
    batch = records(range(10))
    assert [r.step for r in thin_evenly(batch, 0)] == [9]
    assert [r.step for r in thin_evenly(batch, 3)] == [3, 6, 9]
    assert thin_evenly(batch, 10) == batch and thin_evenly([], 5) == []


def test_a_part_a_crash_left_open_is_sealed_whole_and_readable(tmp_path: Path) -> None:
    crashed = TensorBoardView(tmp_path / "tb", points_per_s=1000, clock=Clock())
    crashed.write(records(range(5)), part=2)
    assert crashed._file is not None
    crashed._file.flush()  # what the kernel had when the process died
    restarted = TensorBoardView(tmp_path / "tb", points_per_s=1000, clock=Clock())
    restarted.seal_leftovers()
    (sealed,) = restarted.sealed()
    assert [step for step, _ in scalars(sealed)["loss"]] == list(range(5))
