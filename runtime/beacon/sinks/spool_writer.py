"""The spool thread: disk only. It takes the steps `run.log` queued (past the memory bound, put in the journal's
backlog), reads their values (a tensor waits for its device here, never on the loop under the bound), appends them to
the spool as records, fsyncs, draws the TensorBoard view and seals a chunk when it is due; the uploader takes sealed
chunks from there."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from beacon import contract
from beacon.contract import Record
from beacon.log.journal import PLAIN, Journal
from beacon.log.spool import FULL, Spool, SpoolDiskError, SpoolFullError, on_spool_disk
from beacon.log.spool_owner import SpoolTakenOverError
from beacon.settings import RunSettings
from beacon.sinks.delivery import DeliveryReport, Lifecycle
from beacon.sinks.metric_window import MetricWindow, metric_value
from beacon.sinks.tensorboard_view import TensorBoardView

log = logging.getLogger("beacon.telemetry")

# A logged step's numbers: (step, wall time, journal entry number or 0); its metrics travel beside it.
# The cyclic garbage collector untracks a tuple of numbers, never one holding a dict: tens of thousands
# of steps waiting for the spool were promoted to its oldest generation, whose collections (100s of ms,
# torch loaded) scan every object of the process. A dict of numbers is never tracked.
Logged = tuple[int, float, int]
# Records made at a time on the spool thread, gone before the collector's first threshold (700 objects).
APPEND_SLICE = 256
POLL_S = 0.25
# The memory bound: metric values logged and waiting in memory for the spool thread (about 30 MB of them). Past it
# (a loop faster than the spool, a volume that stalls), `run.log` appends its step to the journal's backlog on the spool
# volume instead, until the spool thread has read the backlog back: the loop never waits for the spool.
QUEUE_BOUND_VALUES = 250_000
TENSOR_WEIGHT = 7  # a one-element tensor held in memory costs about eight floats' worth (~0.8 KB, CPU)
OVERFLOW_SAID_EVERY_S = 60.0
BACKLOG_READ_BYTES = 4 * 1024 * 1024  # read back a cycle at a time: the backlog's memory is its page cache
# Waits between attempts after a disk error under the spool (EIO, ...), about 30 s in all: a hiccup
# passes, a dead volume stops the job, naming it. Records wait in memory meanwhile; none is dropped.
SPOOL_DISK_RETRY_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)


class SpoolWriter:
    def __init__(
        self,
        config: RunSettings,
        *,
        spool: Spool,
        window: MetricWindow,
        report: DeliveryReport,
        lifecycle: Lifecycle,
        sealed: Callable[[], None],
    ) -> None:
        self.config, self.spool, self.window, self.report, self.lifecycle = config, spool, window, report, lifecycle
        self._sealed = sealed  # the uploader's wake-up: a chunk is sealed, or nothing more will be
        self.attempt = 0
        # Two items a step, its numbers then its metrics (see `Logged`), appended by one call.
        self.queue: collections.deque[Logged | dict[str, Any]] = collections.deque()
        # Values queued and taken: each count written by one thread, their difference bounded (QUEUE_BOUND_VALUES).
        self.values_queued = 0
        self.values_taken = 0
        self.overflowing = False  # steps go to the journal's backlog: set by `log`, cleared by the spool thread alone
        self.overflowed = 0  # steps `log` put in the backlog (a count of the training thread's)
        self.backlog_taken = 0  # ... and the spool thread took from it
        self._said_overflowing = -OVERFLOW_SAID_EVERY_S
        self.in_hand = 0  # steps taken from the queue and not yet spooled
        self._journaled = 0  # the last journal entry drained into the spool
        self.done = threading.Event()  # nothing new will become durable in this process
        self.last_logged = -1  # the step of the last `log`
        self.logged = 0  # `log` calls in this process (the training thread's count; `report.records`: the spooled)
        self._wake = threading.Event()  # a cycle now: the run is closing, or a flush asked for a seal
        self._seal_requested = False
        self._durable = threading.Condition()
        self._durable_watchers: list[threading.Event] = []  # set whenever records become durable
        self._chunk_opened_at: float | None = None
        self._sealed_at = 0.0  # monotonic time of the last seal
        # Appended to the spool, not yet fsync'd: their numbers and their metrics.
        self._awaiting_sync: tuple[list[Logged], list[dict[str, float]]] = ([], [])
        self.tensorboard = TensorBoardView(
            spool.directory / "tensorboard", points_per_s=config.tensorboard_points_per_s
        )
        with on_spool_disk(spool.directory):
            self.tensorboard.seal_leftovers()
        self.thread = threading.Thread(target=self._loop, name="beacon-spool", daemon=True)

    # --- the training thread's side: cheap -------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """A journal entry and a queue append: values (tensors too) are read on the spool thread. Past the memory
        bound (`QUEUE_BOUND_VALUES`), a write to the journal's backlog instead (`_overflow`)."""
        copy, wall_time = dict(metrics), time.time()
        if self.overflowing or self.values_queued - self.values_taken > QUEUE_BOUND_VALUES:
            self._overflow(step, wall_time, copy)
        else:
            journal = self.spool.journal
            # Journaled first (a memory copy into the spool volume's page cache): a SIGKILL now loses nothing.
            journaled = journal.append(step, wall_time, copy)
            # One call: no signal's exception can land between the two, leaving a step without its metrics.
            self.queue.extend(((step, wall_time, journaled), copy))
            self.values_queued += len(copy) + TENSOR_WEIGHT * journal.pending
        self.last_logged = step
        self.logged += 1

    def _overflow(self, step: int, wall_time: float, metrics: dict[str, Any]) -> None:
        """Past the memory bound: the step goes to the journal's backlog, which the spool thread reads back after
        the queue. Its values are read here first, outside the lock (a tensor waits for its device: the loop is
        this far ahead of the spool); one that cannot be read is named as pending, counted set aside."""
        numbers: dict[str, float] = {}
        unread: list[str] = []
        for name, value in metrics.items():
            try:
                numbers[name] = metric_value(value)
            except Exception:  # a device error, an int past a float's range: this value alone, as the spool thread
                unread.append(name)
        journal = self.spool.journal
        with journal.backlog_lock:
            if not self.overflowing:
                if self.values_queued - self.values_taken <= QUEUE_BOUND_VALUES:  # the spool caught up meanwhile
                    journaled = journal.append(step, wall_time, metrics)
                    self.queue.extend(((step, wall_time, journaled), metrics))
                    self.values_queued += len(metrics) + TENSOR_WEIGHT * journal.pending
                    return
                self._say_overflowing(journal)
            try:
                journal.overflow(step, wall_time, numbers, unread)
            except OSError as error:  # the spool thread would stop on this volume too: the run stops now, naming it
                kind = SpoolFullError if error.errno in FULL else SpoolDiskError
                self.lifecycle.fatal = kind(
                    error.errno, f"spool {journal.path.parent}: the journal's backlog could not be written "
                    f"({error.strerror}); step {step} was not recorded. `python -m beacon.sync` delivers what the "
                    "volume holds",
                )  # fmt: skip
                raise self.lifecycle.fatal from error
            self.overflowing = True
            self.overflowed += 1
        if unread:
            log.error("metric(s) %s at step %d could not be read; set aside, the step's other values kept",
                      ", ".join(map(repr, unread)), step)  # fmt: skip

    def _say_overflowing(self, journal: Journal) -> None:
        """Once a minute at most: a loop that hovers at the bound goes in and out of the backlog often."""
        now = time.monotonic()
        if now - self._said_overflowing >= OVERFLOW_SAID_EVERY_S:
            self._said_overflowing = now
            log.warning(
                "the spool is %d values behind the loop (its volume slow or stalled): steps go to the journal's "
                "backlog on %s until it catches up; nothing is dropped", QUEUE_BOUND_VALUES, journal.path.parent,
            )  # fmt: skip

    def wake(self) -> None:
        self._wake.set()

    def seal_soon(self) -> None:
        """Seal the open chunk at the next cycle, due or not (a flush), and start that cycle now."""
        self._seal_requested = True
        self._wake.set()

    def queued(self) -> int:
        """Steps logged and not yet taken by the spool thread (in memory, or in the journal's backlog)."""
        return len(self.queue) // 2 + self.overflowed - self.backlog_taken

    def unspooled(self) -> int:
        """Steps logged and not yet in the spool: queued, or in the spool thread's hands."""
        return self.queued() + self.in_hand

    def wait_durable(self, step: int, timeout: float) -> bool:
        """Block (a checkpoint thread, never the loop) until records through `step` are fsync'd."""
        deadline = time.monotonic() + timeout
        with self._durable:
            while self.spool.durable_step < step:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.done.is_set():
                    return self.spool.durable_step >= step
                self._durable.wait(min(remaining, POLL_S))
        return True

    def watch_durable(self) -> threading.Event:
        """An event set each time records become durable, and once the spool is done (a mirror's wake-up)."""
        event = threading.Event()
        self._durable_watchers.append(event)
        return event

    def _notify_durable(self) -> None:
        with self._durable:
            self._durable.notify_all()
        for event in self._durable_watchers:
            event.set()

    # --- the spool thread -------------------------------------------------------------------
    def _loop(self) -> None:
        disk_failures = 0  # consecutive cycles a disk error (not a full disk) interrupted
        lifecycle = self.lifecycle
        try:
            while True:
                stopping = lifecycle.closing.is_set()
                try:
                    self.persist(final=stopping)
                    disk_failures = 0
                except SpoolFullError as error:
                    lifecycle.fatal = error
                    log.error("%s: the spool is full; stopping before anything acknowledged can be lost", error)
                    return
                except SpoolTakenOverError as error:  # a second writer would renumber the new owner's chunks
                    lifecycle.fatal = error
                    log.error("%s", error)
                    return
                except SpoolDiskError as error:
                    if disk_failures == len(SPOOL_DISK_RETRY_S) or (stopping and lifecycle.remaining() <= 0):
                        lifecycle.fatal = SpoolDiskError(
                            error.errno,
                            f"{error.strerror}, {disk_failures + 1} attempts in a row: records after step "
                            f"{self.spool.durable_step} are not durable; the volume is failing, not full",
                        )
                        log.error("%s", lifecycle.fatal)
                        return
                    wait = SPOOL_DISK_RETRY_S[disk_failures]
                    disk_failures += 1
                    log.warning("%s; retrying in %.2f s, nothing dropped (%d)", error.strerror, wait, disk_failures)
                    if stopping:  # the closing event is set already: it cannot pace the retries
                        time.sleep(max(0.0, min(wait, lifecycle.remaining())))
                    else:
                        lifecycle.closing.wait(wait)
                    continue
                except Exception:  # keep persisting whatever happens (a record is durable only once fsync'd)
                    log.exception("spool cycle failed with %d step(s) in hand; retrying", self.in_hand)
                    if stopping:
                        return
                if stopping:
                    if self.overflowing and lifecycle.remaining() > 0:
                        continue  # the backlog, read back a cycle at a time (whatever is left stays for recovery)
                    return
                if self.queued() < self.config.chunk_records:  # a backlog goes on at once
                    self._wake.wait(POLL_S)
                    self._wake.clear()
        finally:
            self.done.set()
            self._sealed()
            self._notify_durable()

    def _drain(self) -> tuple[list[Logged], list[dict[str, float]]]:
        """The queued steps and their metrics, the values read here rather than on the training thread
        (a tensor's value waits for the device only on this thread)."""
        steps: list[Logged] = []
        metrics_of: list[dict[str, float]] = []
        queue = self.queue
        # Read before the queue: `log` queues nothing while it is set, so the queue holds only older steps then,
        # and a step queued after the loop below waits for the next cycle, as the backlog's newer steps do.
        overflowing = self.overflowing
        while queue:  # whole steps only: `log` appends both items of one in a single call
            self.in_hand += 1  # until spooled, counted as not delivered (first: a reader never sees it nowhere)
            entry, metrics = cast(Logged, queue.popleft()), cast(dict[str, Any], queue.popleft())  # `log`'s own copy
            weight = len(metrics)
            self._journaled = entry[2] or self._journaled
            for value in metrics.values():
                if type(value) is not float:
                    weight += TENSOR_WEIGHT * sum(type(v) not in PLAIN for v in metrics.values())  # as `log` counted
                    metrics = self._numbers(entry[0], metrics)
                    break
            self.values_taken += weight
            steps.append(entry)
            metrics_of.append(metrics)
        if overflowing:
            self._drain_backlog(steps, metrics_of)
        if steps:
            self.window.steps(steps[-1][0], metrics_of)
            for (step, _, _), metrics in zip(steps, metrics_of, strict=True):  # for pod logs and SageMaker's parsers
                if step % contract.PROGRESS_LOG_INTERVAL == 0 and (loss := metrics.get(contract.LOSS_KEY)) is not None:
                    log.info(contract.progress_line(step, loss))
        return steps, metrics_of

    def _drain_backlog(self, steps: list[Logged], metrics_of: list[dict[str, float]]) -> None:
        """The backlog's next steps, a read at a time; once it is read to its end, `log` queues again. A read that
        fails is tried again next cycle, the queue's steps spooled meanwhile."""
        journal = self.spool.journal
        try:
            entries, used = journal.read_backlog(BACKLOG_READ_BYTES)
        except OSError as error:
            log.warning("the journal's backlog could not be read (%s); trying again next cycle", error.strerror)
            return
        with journal.backlog_lock:
            if journal.consumed(used):
                self.overflowing = False
                self.backlog_taken = self.overflowed  # exact: `log` writes the backlog under this lock alone
            else:
                self.backlog_taken += len(entries)
        for number, step, wall_time, metrics, pending in entries:
            self.in_hand += 1
            self._journaled = number
            steps.append((step, wall_time, number))
            metrics_of.append(metrics)
            for name in pending:  # read past the bound by `log`, and that read failed
                aside = self.report.values_set_aside
                aside[name] = aside.get(name, 0) + 1

    def _numbers(self, step: int, metrics: dict[str, Any]) -> dict[str, float]:
        """A step's values as floats, one value at a time: one that cannot be read is set aside and counted,
        never the step with it (nor the steps drained beside it)."""
        numbers: dict[str, float] = {}
        for name, value in metrics.items():
            try:
                numbers[name] = metric_value(value)
            except Exception as error:  # a device error, an overflow: this value alone
                aside = self.report.values_set_aside
                if name not in aside:
                    log.error(
                        "metric %r at step %d: %s: %s; set aside, the step's other values kept (counted in "
                        "finish()'s report and the final state)", name, step, type(error).__name__, error,
                    )  # fmt: skip
                aside[name] = aside.get(name, 0) + 1
        return numbers

    def _records(self, steps: Sequence[Logged], metrics_of: Sequence[dict[str, float]]) -> list[Record]:
        experiment, run, attempt = self.config.experiment, self.config.run, self.attempt
        return [
            Record(experiment, run, step, metrics, wall_time, attempt=attempt)
            for (step, wall_time, _), metrics in zip(steps, metrics_of, strict=True)
        ]

    def persist(self, *, final: bool) -> None:
        """One cycle: drain, append, fsync, draw; seal when due (or `final`, or asked before this cycle drained)."""
        requested, self._seal_requested = self._seal_requested, False  # a request now covers what is queued now
        try:
            self._persist(final=final or requested)
        except BaseException:
            self._seal_requested = self._seal_requested or requested  # not sealed: asked again next cycle
            raise

    def _persist(self, *, final: bool) -> None:
        # A failed cycle's records wait for their fsync first: retries never take more steps into memory.
        steps, metrics_of = ([], []) if self._awaiting_sync[0] else self._drain()
        if steps:
            if self._chunk_opened_at is None:
                self._chunk_opened_at = time.monotonic()
            # A few records at a time, gone before the collector would promote them (see `Logged`).
            for start in range(0, len(steps), APPEND_SLICE):
                end = start + APPEND_SLICE
                self.spool.append(self._records(steps[start:end], metrics_of[start:end]))
            self.in_hand -= len(steps)  # each in the spool now, counted there; a failed cycle's stay counted here
            self._awaiting_sync[0].extend(steps)
            self._awaiting_sync[1].extend(metrics_of)
        self.spool.sync()  # also writes again what a failed attempt left unsynced
        self.spool.journal.durable_through(self._journaled)
        if not self.overflowing:
            with on_spool_disk(self.spool.directory):
                self.spool.journal.reclaim_backlog()  # read back and fsync'd: its disk is free again
        if self._awaiting_sync[0]:
            (synced, synced_metrics), self._awaiting_sync = self._awaiting_sync, ([], [])
            self.report.records += len(synced)
            self._notify_durable()
            drawn = self.tensorboard.within_budget(range(len(synced)))  # records made only for these
            with on_spool_disk(self.spool.directory):
                # A view of the records: a disk error here loses no record.
                self.tensorboard.draw(
                    self._records([synced[i] for i in drawn], [synced_metrics[i] for i in drawn]),
                    part=self.spool.next_chunk,
                )
        now = time.monotonic()
        # At most one full chunk per poll interval: a fast loop's chunks grow rather than its PUTs multiply.
        due = self._chunk_opened_at is not None and (
            now - self._chunk_opened_at >= self.config.flush_interval
            or (self.spool.open_records >= self.config.chunk_records and now - self._sealed_at >= POLL_S)
        )
        if due or final:
            if self.spool.seal() is not None:
                self._sealed_at = now
                self._sealed()
            self._chunk_opened_at = None
            with on_spool_disk(self.spool.directory):
                self.tensorboard.rotate()
