"""The spool thread's cycle (`beacon.spool_writer`), driven by hand: what a flush's seal request covers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
