"""What the path from `log` to the spool leaves to Python's cyclic garbage collector. Steps waiting for
the spool thread (tens of thousands under a fast loop) must not be objects it tracks: survivors are
promoted to its oldest generation, and each collection of that scans every object of the process
(hundreds of milliseconds with torch loaded), on whichever thread, the training loop's included."""

from __future__ import annotations

import gc
import math
from pathlib import Path

import torch
from beacon.contract import ChunkSummary, records_of
from beacon.evidence.progress import ProgressClock
from beacon.log.spool import Spool
from beacon.settings import RunSettings
from beacon.sinks.spool_writer import APPEND_SLICE
from beacon.telemetry import Telemetry

from tests.test_tensorboard_view import scalars


def telemetry(tmp_path: Path, **settings: float) -> Telemetry:
    config = RunSettings(experiment="e", run="r", bucket="b", spool_dir=tmp_path, alarms=False, **settings)  # type: ignore[arg-type]
    spool = Spool(tmp_path / "e" / "r")
    sink = Telemetry(config, s3=None, cloudwatch=None, progress=ProgressClock(), spool=spool, run_alarms=None)
    sink.begin_attempt()
    return sink


def test_queued_steps_are_nothing_the_collector_tracks_once_it_has_looked(tmp_path: Path) -> None:
    sink = telemetry(tmp_path)
    for step in range(1000):
        sink.log(step, {"loss": 1.0 / (step + 1), "lr": 0.1, "ok": True, "nan": math.nan})
    gc.collect(0)  # untracks what holds only numbers: it promotes nothing of ours to older generations
    assert sink.spool_writer.queued() == 1000 and len(sink.spool_writer.queue) == 2000, "numbers, then metrics"
    assert not any(gc.is_tracked(item) for item in sink.spool_writer.queue)
    sink.spool.close()


def test_a_cycle_of_many_steps_spools_each_once_in_order_across_record_slices(tmp_path: Path) -> None:
    """More steps than one slice of records (`APPEND_SLICE`), a tensor among them: every step is
    spooled once, numbered in order, its values as logged; TensorBoard draws records of the same steps."""
    sink = telemetry(tmp_path, tensorboard_points_per_s=50.0)
    count = 3 * APPEND_SLICE + 7
    for step in range(count):
        sink.log(step, {"loss": torch.tensor(0.5) if step == 300 else float(step), "step_inf": math.inf})
    sink.spool_writer.persist(final=True)
    (chunk,) = sink.spool.pending()
    records = records_of(chunk.body())
    assert [(r.seq, r.step) for r in records] == [(n, n) for n in range(count)]
    assert [r.metrics["loss"] for r in records] == [0.5 if n == 300 else float(n) for n in range(count)]
    assert all(r.metrics["step_inf"] == math.inf and r.attempt == sink.attempt for r in records)
    assert sink.report.records == count and sink.spool.durable_step == count - 1
    assert chunk.summary() == ChunkSummary.of(chunk.sequence, records), "the running summary agrees"
    (event_file,) = sink.tensorboard.sealed()
    drawn = [step for step, _ in scalars(event_file)["loss"]]
    assert len(drawn) == 50 and drawn[-1] == count - 1 and drawn == sorted(set(drawn)), "thinned evenly, the last kept"
    assert sink.tensorboard.thinned == count - 50
    sink.spool.close()


def test_log_reads_no_value_on_the_training_thread_only_the_spool_thread_does(tmp_path: Path) -> None:
    """A CUDA tensor's value is a host-device synchronisation to read: `run.log` must leave it to the spool
    thread. Here a value that records which thread reads it (`make gpu-check` proves the same with sync-debug
    mode "error" on a GPU)."""
    import threading

    reads: list[str] = []

    class OnTheDevice:
        """A one-element tensor as Beacon sees it: `numel`, `detach`, `item`."""

        def numel(self) -> int:
            return 1

        def detach(self) -> OnTheDevice:
            return self

        def item(self) -> float:
            reads.append(threading.current_thread().name)
            return 0.5

        def __float__(self) -> float:
            return self.item()

    sink = telemetry(tmp_path)
    for step in range(3):
        sink.log(step, {"loss": OnTheDevice(), "lr": 0.1})
    assert reads == [], "log appends to a queue and reads nothing"
    spool_thread = threading.Thread(target=sink.spool_writer.persist, kwargs={"final": True}, name="beacon-spool")
    spool_thread.start()
    spool_thread.join(timeout=60)
    assert reads and set(reads) == {"beacon-spool"}, reads
    (chunk,) = sink.spool.pending()
    assert [r.metrics["loss"] for r in records_of(chunk.body())] == [0.5, 0.5, 0.5]
    sink.spool.close()
