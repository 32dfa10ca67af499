"""TensorBoard as a view of the records: whole files TensorBoard reads, every record up to the view's
rate, evenly thinned above it (S3 keeps every record; `make bench` measures the rate this buys)."""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path

from beacon.contract import Record
from beacon.sinks.tensorboard_view import SEALED, TensorBoardView, crc32c, event_of, framed, thin_evenly
from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as tensorboard_crc32c
from tensorboard.summary.writer.record_writer import RecordWriter


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


def test_events_are_byte_for_byte_what_tensorboards_protos_and_record_writer_write() -> None:
    """Encoded and framed by hand for speed; every field's edge as TensorBoard's own code writes it."""
    cases = [
        Record("e", "r", 0, {}, 0.0),  # proto3 leaves out a zero step and wall time
        Record("e", "r", -5, {"zero": 0.0, "neg_zero": -0.0, "nan": math.nan, "up": math.inf, "down": -math.inf}, -0.0),
        Record("e", "r", 2**63 - 1, {"huge": 1e300, "-huge": -1e300, "tiny": 1e-50, "": 3.0}, 1_700_000_000.5),
        Record("e", "r", -(2**63), {"a" * 300: 3.4028235e38, "over": 3.4028236e38, "λ/Größe": 0.1}, 2.0),
        *records(range(120, 140), **{f"m{i}": 1.0 / (i + 7) for i in range(10)}),
    ]
    for record in cases:
        values = [summary_pb2.Summary.Value(tag=name, simple_value=value) for name, value in record.metrics.items()]
        summary = summary_pb2.Summary(value=values)
        expected = event_pb2.Event(wall_time=record.wall_time, step=record.step, summary=summary).SerializeToString()
        assert event_of(record) == expected, record
        written = io.BytesIO()
        RecordWriter(written).write(expected)
        assert framed(expected) == written.getvalue(), record


def test_crc32c_is_tensorboards_for_every_length_around_its_eight_byte_steps() -> None:
    for length in [*range(0, 40), 123, 124, 1000, 4099]:
        data = bytes((index * 37 + length) & 0xFF for index in range(length))
        assert crc32c(data) == tensorboard_crc32c(data), length
