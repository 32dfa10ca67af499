"""The spool thread's cycle (`beacon.spool_writer`), driven by hand: what a flush's seal request covers, and the
memory bound past which steps wait in the journal's backlog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from beacon import spool_writer
from beacon.contract import records_of

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
    assert spool.journal.unspooled() == [], "the spool's fsync marked the backlog's steps too"
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
