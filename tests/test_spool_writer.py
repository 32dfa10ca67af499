"""The spool thread's cycle (`beacon.sinks.spool_writer`), driven by hand: what a flush's seal request covers, and the
memory bound past which steps wait in the journal's backlog."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
import torch
from beacon.contract import records_of
from beacon.log.spool import SpoolDiskError, SpoolFullError
from beacon.sinks import spool_writer

from tests.test_hot_path import telemetry


def test_a_seal_asked_for_while_a_cycle_runs_seals_the_steps_logged_meanwhile_in_the_next(tmp_path: Path) -> None:
    """`run.flush` asks for a seal while the spool thread is past its drain (here, inside its fsync): that cycle
    seals what it drained, and the request stands for the next, which seals the rest; none waits for the flush
    interval (an hour here)."""
    sink = telemetry(tmp_path, flush_interval=3600.0)
    writer, spool = sink.spool_writer, sink.spool
    for step in range(13):
        writer.log(step, {"loss": 1.0})
    real_sync = spool.sync

    def sync_while_a_flush_asks(*args: Any) -> None:
        spool.sync = real_sync  # type: ignore[method-assign]
        for step in range(13, 25):
            writer.log(step, {"loss": 1.0})
        writer.seal_soon()
        real_sync(*args)

    spool.sync = sync_while_a_flush_asks  # type: ignore[method-assign]
    writer.seal_soon()
    writer.persist(final=False)
    assert [c.records for c in spool.pending()] == [13] and writer.queued() == 12
    writer.persist(final=False)
    assert [c.records for c in spool.pending()] == [13, 12] and spool.open_records == 0, "the rest, sealed"
    writer.persist(final=False)
    assert len(spool.pending()) == 2, "no request left: nothing more is sealed"
    spool.close()


def test_past_the_memory_bound_steps_go_to_the_backlog_and_are_spooled_in_the_order_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten values may wait in memory: the sixth step of two goes to the journal's backlog, and so does every step
    after it until the spool thread has read the backlog back (a tensor's value read by `log` meanwhile); then
    steps are queued in memory again. Spooled, every step is there once, in the order logged."""
    monkeypatch.setattr(spool_writer, "QUEUE_BOUND_VALUES", 10)
    sink = telemetry(tmp_path)
    writer, spool = sink.spool_writer, sink.spool
    for step in range(30):
        writer.log(step, {"loss": torch.tensor(0.25) if step == 20 else 1.0, "lr": 0.1})
    assert len(writer.queue) // 2 == 6 and writer.overflowing, "ten values waited: the sixth step is past them"
    assert writer.queued() == 30 and writer.unspooled() == 30
    writer.persist(final=True)
    assert not writer.overflowing and writer.queued() == 0
    writer.log(30, {"loss": 1.0, "lr": 0.1})
    assert len(writer.queue) == 2, "caught up: queued in memory again"
    writer.persist(final=True)
    records = [record for chunk in spool.pending() for record in records_of(chunk.body())]
    assert [r.step for r in records] == list(range(31)) and [r.seq for r in records] == list(range(31))
    assert records[20].metrics == {"loss": 0.25, "lr": 0.1}
    assert list(spool.journal.unspooled()) == [], "the spool's fsync marked the backlog's steps too"
    spool.close()


def test_closing_spools_a_backlog_larger_than_one_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spool_writer, "QUEUE_BOUND_VALUES", 0)
    monkeypatch.setattr(spool_writer, "BACKLOG_READ_BYTES", 100)  # about two steps a cycle
    sink = telemetry(tmp_path)
    writer = sink.spool_writer
    for step in range(40):
        writer.log(step, {"loss": 1.0})
    assert writer.overflowing
    sink.lifecycle.close(budget=30)
    writer.thread.start()
    writer.thread.join(30)
    assert sink.report.records == 40 and writer.unspooled() == 0
    sink.spool.close()


def test_a_tensor_counts_as_the_memory_it_holds_toward_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-element tensor held until the spool reads it costs about eight floats: the bound counts it so."""
    monkeypatch.setattr(spool_writer, "QUEUE_BOUND_VALUES", 20)
    sink = telemetry(tmp_path)
    writer = sink.spool_writer
    for step in range(4):
        writer.log(step, {"loss": torch.tensor(0.5)})
    assert len(writer.queue) // 2 == 3 and writer.overflowing, "three tensors (24) are past 20 values"
    writer.persist(final=True)
    assert writer.values_taken == writer.values_queued == 24, "the spool thread takes off what `log` counted"
    sink.spool.close()


def test_a_backlog_read_that_fails_is_tried_again_and_the_queues_steps_are_spooled_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_writer, "QUEUE_BOUND_VALUES", 3)
    sink = telemetry(tmp_path)
    writer, spool = sink.spool_writer, sink.spool
    for step in range(10):
        writer.log(step, {"loss": 1.0})
    real_read = spool.journal.read_backlog

    def fails_once(limit: int) -> Any:
        monkeypatch.setattr(spool.journal, "read_backlog", real_read)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(spool.journal, "read_backlog", fails_once)
    writer.persist(final=True)
    assert spool.durable_step == 3 and writer.overflowing and writer.queued() == 6
    writer.persist(final=True)
    records = [record for chunk in spool.pending() for record in records_of(chunk.body())]
    assert [r.step for r in records] == list(range(10)) and not writer.overflowing
    spool.close()


def test_a_backlog_write_the_volume_refuses_stops_the_run_naming_the_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spool_writer, "QUEUE_BOUND_VALUES", 0)
    sink = telemetry(tmp_path)

    def full(*args: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sink.spool.journal, "overflow", full)
    sink.log(0, {"loss": 1.0})  # under the bound: queued
    with pytest.raises(SpoolFullError, match=f"spool {sink.spool.directory}: the journal's backlog"):
        sink.log(1, {"loss": 1.0})
    with pytest.raises(SpoolFullError):
        sink.log(2, {"loss": 1.0})  # the run is stopped: finish() reports it
    assert sink.lifecycle.fatal is not None
    sink.spool.close()


def test_a_cycle_retried_after_a_disk_error_takes_no_more_steps_into_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = telemetry(tmp_path)
    writer, spool = sink.spool_writer, sink.spool
    for step in range(5):
        writer.log(step, {"loss": 1.0})
    real_sync = spool.sync
    failures = iter([True, True])

    def failing(*args: Any) -> None:
        if next(failures, False):
            raise SpoolDiskError(errno.EIO, "Input/output error")
        real_sync(*args)

    monkeypatch.setattr(spool, "sync", failing)
    with pytest.raises(SpoolDiskError):
        writer.persist(final=False)
    for step in range(5, 9):
        writer.log(step, {"loss": 1.0})
    with pytest.raises(SpoolDiskError):
        writer.persist(final=False)
    assert writer.queued() == 4, "the retry took none of the steps logged since"
    writer.persist(final=False)
    assert spool.durable_step == 4 and writer.queued() == 4
    writer.persist(final=True)
    assert spool.durable_step == 8
    spool.close()
