"""A record's line: orjson writes it (the spool's hot path), `json` where orjson cannot be faithful or is
missing (the alarm's function bundles the contract with boto3 alone). Both lines read back alike."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy
import orjson
import pytest
import torch
from beacon.contract import Record, records
from beacon.evidence.progress import ProgressClock
from beacon.log.spool import Spool
from beacon.settings import RunSettings
from beacon.telemetry import Telemetry

# The text of these differs between the two writers (`1e-05` or `0.00001`), never the value.
AWKWARD = {
    "tiny": 1e-05,
    "tinier": 1e-07,
    "subnormal": 5e-324,
    "largest": 1.7976931348623157e308,
    "big": 1.2345678901234568e17,
    "third": 1 / 3,
    "negative_zero": -0.0,
    "whole": 3.0,
    "loss": 0.1,
}


def strict(line: bytes) -> dict[str, Any]:
    """The line as a strict JSON reader (jq, Athena) sees it: bare NaN or Infinity is refused."""

    def refuse(constant: str) -> float:
        raise AssertionError(f"bare {constant} is not JSON")

    assert line.endswith(b"\n") and line.count(b"\n") == 1
    return dict(json.loads(line, parse_constant=refuse))


def json_line(record: Record, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The line `json` writes (as before orjson, and wherever it is missing)."""
    with monkeypatch.context() as patch:
        patch.setattr(records, "_orjson", None)
        return record.to_line()


def same_values(a: dict[str, float], b: dict[str, float]) -> bool:
    return list(a) == list(b) and all(
        (math.isnan(x) and math.isnan(y)) or (x == y and math.copysign(1, x) == math.copysign(1, y))
        for x, y in zip(a.values(), b.values(), strict=True)
    )


def test_orjson_writes_plain_floats_and_both_writers_read_back_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    record = Record("e", "r", 7, dict(AWKWARD), 1_700_000_000.123456, seq=3, attempt=2)
    fast, slow = record.to_line(), json_line(record, monkeypatch)
    assert fast == orjson.dumps(strict(fast), option=orjson.OPT_APPEND_NEWLINE), "orjson wrote it"
    assert fast != slow, "its text (here `0.00001`) is what the spool writes"
    assert strict(fast) == strict(slow), "one document either way"
    for line in (fast, slow):
        again = Record.from_line(line)
        assert same_values(again.metrics, record.metrics)
        assert (again.step, again.seq, again.attempt, again.wall_time) == (7, 3, 2, record.wall_time)
    assert Record.from_line(record.to_line(seq=9)).seq == 9


@pytest.mark.parametrize("orjson", [True, False], ids=["orjson", "json"])
def test_non_finite_values_are_written_as_the_contracts_names_by_either_writer(
    orjson: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not orjson:
        monkeypatch.setattr(records, "_orjson", None)
    metrics = {"loss": math.nan, "up": math.inf, "down": -math.inf, "lr": 0.5}
    line = Record("e", "r", 1, metrics, 1.0).to_line()
    assert strict(line)["metrics"] == {"loss": "NaN", "up": "Infinity", "down": "-Infinity", "lr": 0.5}
    assert b"null" not in line, "orjson's own NaN is null: never written"
    assert same_values(Record.from_line(line).metrics, metrics)
    # Finite values whose sum overflows take the `json` path, and stay numbers.
    huge = {"a": 1.7e308, "b": 1.7e308}
    assert strict(Record("e", "r", 1, huge, 1.0).to_line())["metrics"] == huge


def test_unicode_names_ints_and_bools_read_back_as_json_wrote_them(monkeypatch: pytest.MonkeyPatch) -> None:
    record = Record("e", "r", 2, {"verlust/Größe": 0.25, "λ": 1.5, "count": 3, "flag": True}, 2.0)
    fast, slow = record.to_line(), json_line(record, monkeypatch)
    assert "verlust/Größe".encode() in fast and b"\\u00df" in slow, "UTF-8 here, \\u escapes there"
    assert strict(fast) == strict(slow)
    assert strict(fast)["metrics"] == {"verlust/Größe": 0.25, "λ": 1.5, "count": 3, "flag": True}
    assert Record.from_line(fast).metrics == {"verlust/Größe": 0.25, "λ": 1.5, "count": 3.0, "flag": 1.0}


def test_what_orjson_refuses_is_written_by_json() -> None:
    beyond_64_bits = 2**70
    line = Record("e", "r", beyond_64_bits, {"loss": 1.0}, 1.0).to_line()
    assert strict(line)["step"] == beyond_64_bits
    numpy_value = Record("e", "r", 1, {"loss": numpy.float64(0.1)}, 1.0).to_line()
    assert strict(numpy_value)["metrics"] == {"loss": 0.1}
    with pytest.raises(TypeError):  # as before: a record holds numbers, the spool thread reads tensors
        Record("e", "r", 1, {"loss": torch.tensor(0.5)}, 1.0).to_line()  # type: ignore[dict-item]


def test_the_spool_holds_logged_tensors_numbers_and_non_finite_values_as_read_back(tmp_path: Path) -> None:
    """Through `Telemetry.log` and one spool cycle: the line of each record, as a reader finds it."""
    settings = RunSettings(experiment="e", run="r", bucket="b", spool_dir=tmp_path, alarms=False)
    spool = Spool(tmp_path / "e" / "r")
    telemetry = Telemetry(settings, s3=None, cloudwatch=None, progress=ProgressClock(), spool=spool, run_alarms=None)
    telemetry.begin_attempt()
    logged: list[dict[str, Any]] = [
        {"loss": torch.tensor(0.125), "lr": 1e-05},
        {"loss": 2, "ok": True, "grad/norm": math.inf},
        dict(AWKWARD),
    ]
    for step, metrics in enumerate(logged):
        telemetry.log(step, metrics)
    telemetry.spool_writer.persist(final=True)
    (chunk,) = spool.pending()
    lines = chunk.body().splitlines(keepends=True)
    assert [strict(line)["seq"] for line in lines] == [0, 1, 2]
    read = [Record.from_line(line).metrics for line in lines]
    assert read[0] == {"loss": 0.125, "lr": 1e-05}
    assert read[1] == {"loss": 2.0, "ok": 1.0, "grad/norm": math.inf}
    assert strict(lines[1])["metrics"]["grad/norm"] == "Infinity"
    assert same_values(read[2], AWKWARD)
    spool.close()


def test_a_record_made_in_one_write_is_still_the_frozen_dataclass_it_declares() -> None:
    record = Record("e", "r", 3, {"loss": 0.5}, 2.0, seq=4, attempt=1)
    assert list(vars(record)) == [field.name for field in dataclasses.fields(Record)], "every field, in order"
    assert (record.rank, record.seq, Record("e", "r", 3, {}, 2.0).seq) == (0, 4, -1), "defaults as declared"
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.step = 5  # type: ignore[misc]
    assert dataclasses.replace(record, step=5) == Record("e", "r", 5, {"loss": 0.5}, 2.0, seq=4, attempt=1)
    assert record != dataclasses.replace(record, attempt=2)


def test_steps_a_failed_spool_cycle_dropped_stay_counted_as_not_delivered(tmp_path: Path) -> None:
    """A cycle that fails after it took steps from the queue loses them; the next cycle's steps must not wipe the
    count, or finish() would say delivered (review of issue 26, finding 1)."""
    settings = RunSettings(experiment="e", run="r", bucket="b", spool_dir=tmp_path, alarms=False)
    spool = Spool(tmp_path / "e" / "r")
    telemetry = Telemetry(settings, s3=None, cloudwatch=None, progress=ProgressClock(), spool=spool, run_alarms=None)
    telemetry.begin_attempt()
    for step in range(3):
        telemetry.log(step, {"loss": 1.0})
    real_append = spool.append
    spool.append = lambda records: (_ for _ in ()).throw(RuntimeError("a bug in the cycle"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        telemetry.spool_writer.persist(final=False)
    spool.append = real_append  # type: ignore[method-assign]
    telemetry.log(3, {"loss": 1.0})
    telemetry.spool_writer.persist(final=True)
    assert telemetry.spool_writer.in_hand == 3, "the three lost steps are still counted, the spooled one is not"
