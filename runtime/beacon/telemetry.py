"""Telemetry that cannot be lost: spool → S3 (create-only, synchronous), CloudWatch, TensorBoard,
and a heartbeat thread that runs whatever the loop is doing.

The training thread only appends to a queue (`record`), so its cost per step is microseconds.
The uploader thread makes records durable in the spool, seals chunks and uploads each closed chunk
synchronously; the heartbeat thread sends one PutMetricData per interval and touches the liveness
file. Failures never stop training: they count as UploadFailures and grow SpoolBacklog.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from botocore.exceptions import BotoCoreError, ClientError

from beacon import contract, kill_points
from beacon.contract import Record
from beacon.contract.rank_evidence import RankProgress
from beacon.create_only import Written, put_create_only
from beacon.index import IndexWriter
from beacon.progress import ProgressClock
from beacon.rank_board import RankBoard
from beacon.ranks import (
    CrossRankView,
    LiveSnapshots,
    PhaseFollower,
    a_rank_stalled,
    evidence_state,
    read_ranks,
    stall_threshold,
    this_attempts_documents_since,
    upload_rank_evidence,
)
from beacon.reconcile import RunConflictError
from beacon.run_alarms import RunAlarms
from beacon.settings import RunSettings
from beacon.spool import Chunk, Spool, SpoolDiskError, SpoolFullError, on_spool_disk
from beacon.spool_owner import SpoolTakenOverError
from beacon.tensorboard_view import SEALED, TensorBoardView

log = logging.getLogger("beacon.telemetry")

# A logged step's numbers: (step, wall time, journal entry number or 0); its metrics travel beside it.
# The cyclic garbage collector untracks a tuple of numbers, never one holding a dict: tens of thousands
# of steps waiting for the spool were promoted to its oldest generation, whose collections (100s of ms,
# torch loaded) scan every object of the process. A dict of numbers is never tracked.
Logged = tuple[int, float, int]
# Records made at a time on the spool thread, gone before the collector's first threshold (700 objects).
APPEND_SLICE = 256
UPLOAD_POLL_S = 0.25
MAX_BACKOFF_S = 30.0
MAX_DATA_PER_REQUEST = 1000  # PutMetricData's limit
# Waits between attempts after a disk error under the spool (EIO, ...), about 30 s in all: a hiccup
# passes, a dead volume stops the job, naming it. Records wait in memory meanwhile; none is dropped.
SPOOL_DISK_RETRY_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0)


def metric_value(value: Any) -> float:
    """A logged value as a float: a number, or a one-element tensor (read here, off the loop)."""
    if hasattr(value, "item"):
        value = value.detach().item() if hasattr(value, "detach") else value.item()
    return float(value)


def cloudwatch_accepts(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= contract.CLOUDWATCH_VALUE_LIMIT


def datum_is_valid(datum: dict[str, Any]) -> bool:
    """CloudWatch refuses a whole request for one bad value: drop the datum, keep the heartbeat."""
    values = [datum["Value"]] if "Value" in datum else list(datum.get("StatisticValues", {}).values())
    return all(cloudwatch_accepts(float(v)) for v in values)


@dataclass
class WindowStats:
    """Per-step values aggregated between two metric batches."""

    values: dict[str, list[float]] = field(default_factory=dict)  # the loss and the listed metrics
    last_step: int = -1
    upload_latencies_ms: list[float] = field(default_factory=list)
    upload_failures: int = 0
    checkpoint_seconds: list[float] = field(default_factory=list)
    checkpoints_skipped: int = 0
    steps_since_checkpoint: int | None = None  # at the last skip


def statistic_set(values: list[float]) -> dict[str, float]:
    return {"SampleCount": float(len(values)), "Sum": sum(values), "Minimum": min(values), "Maximum": max(values)}


@dataclass
class DeliveryReport:
    records: int = 0
    chunks_uploaded: int = 0
    already_present: int = 0
    upload_failures: int = 0
    metric_batches: int = 0
    metric_failures: int = 0
    tensorboard_files: int = 0
    tensorboard_thinned: int = 0  # records above the view's rate, in S3 but not drawn in TensorBoard
    journal_skipped: int = 0  # steps durable only from the spool's fsync: the journal's ring was full
    pending_chunks: int = 0
    unacknowledged_records: int = 0  # logged, not yet in S3: queued, in the spool thread's hands, or spooled
    # The spool thread was still at work when the shutdown budget ended (a value whose read never returns, a
    # stuck disk): what it holds is counted above, and nothing is reported delivered.
    spool_unfinished: bool = False
    # Values run.log took that the spool thread could not read as a number (a failed CUDA read, a number
    # too large for a float), by metric: each left out of its step alone, the step's other values kept.
    values_set_aside: dict[str, int] = field(default_factory=dict)


class NullTelemetry:
    """What ranks other than 0 get: no sink is ever touched."""

    def start(self) -> None: ...

    attempt = 0

    def begin_attempt(self) -> int:
        return self.attempt

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def checkpoint_finished(self, seconds: float) -> None: ...

    def checkpoint_skipped(self, step: int, resume_point: int) -> None: ...

    def wait_durable(self, step: int, timeout: float) -> bool:
        return True

    def close(self, budget: float) -> DeliveryReport:
        return DeliveryReport()

    def publish_final(self, summary: dict[str, Any]) -> None: ...

    def publish_hyperparams(self, document: bytes) -> None: ...

    def publish_rank_evidence(self, directory: Path, attempt: int) -> None: ...


class Telemetry(NullTelemetry):
    def __init__(
        self,
        config: RunSettings,
        *,
        s3: Any,
        cloudwatch: Any,
        progress: ProgressClock,
        spool: Spool,
        run_alarms: RunAlarms | None,
    ) -> None:
        self.config = config
        self.s3, self.cloudwatch = s3, cloudwatch
        self.progress = progress
        self.spool = spool
        self.run_alarms = run_alarms
        self.report = DeliveryReport()
        # Every rank's progress documents: the cross-rank view, and the live snapshots while a rank stalls.
        self.ranks_dir: Path | None = None
        # Rank 0 of several ranks sends the cross-rank view (two custom metrics); a run of one rank does not,
        # but its own stall is snapshotted alike (its stack, where it hangs, reaches S3 while it hangs).
        self.cross_rank_metrics = False
        self.ranks_since = this_attempts_documents_since()  # an earlier attempt's documents are not this one's
        self.rank_board: RankBoard | None = None  # other nodes' documents, where each node has its own directory
        self._phases_of_other_ranks = PhaseFollower(progress)
        # While a rank stalls, the ranks' evidence goes to S3 at once (not only at the attempt's end), from
        # a thread of its own so that a slow S3 never delays a heartbeat.
        self.live_snapshots = LiveSnapshots()
        self._snapshot_thread: threading.Thread | None = None
        self.index = IndexWriter(s3, bucket=config.bucket, experiment=config.experiment, run=config.run)
        # Two items a step, its numbers then its metrics (see `Logged`), appended by one call.
        self._queue: collections.deque[Logged | dict[str, Any]] = collections.deque()
        self._in_hand = 0  # steps the spool thread took from the queue and has not yet spooled
        self._journaled = 0  # the last journal entry drained into the spool
        self._window = WindowStats()
        self._window_lock = threading.Lock()
        self._cloudwatch_metrics = frozenset(config.cloudwatch_metrics)
        self._window_metrics = (contract.LOSS_KEY, *sorted(self._cloudwatch_metrics - {contract.LOSS_KEY}))
        self._stop = threading.Event()  # the loop is over: seal what is left, then stop
        self._spool_done = threading.Event()  # nothing new will reach the pending set
        self._beats_done = threading.Event()  # uploads are over: the final beat, then stop
        self._upload_wake = threading.Event()
        self._deadline: float | None = None
        self._durable = threading.Condition()
        self._durable_watchers: list[threading.Event] = []  # set whenever records become durable
        self._chunk_opened_at: float | None = None
        self._sealed_at = 0.0  # monotonic time of the last seal
        # Appended to the spool, not yet fsync'd: their numbers and their metrics.
        self._awaiting_sync: tuple[list[Logged], list[dict[str, float]]] = ([], [])
        self._backoff_until = 0.0
        self._backoff = 1.0
        self.tensorboard = TensorBoardView(
            spool.directory / "tensorboard", points_per_s=config.tensorboard_points_per_s
        )
        self._first_beat_at: float | None = None
        self._last_rate_sample = (time.monotonic(), progress.steps)
        self._fatal: BaseException | None = None
        # Disk and network never share a thread: a slow S3 cannot delay durability, and a slow
        # CloudWatch cannot delay an upload.
        self._spool_thread = threading.Thread(target=self._spool_loop, name="beacon-spool", daemon=True)
        self._upload_thread = threading.Thread(target=self._upload_loop, name="beacon-uploader", daemon=True)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop, name="beacon-heartbeat", daemon=True)
        self._threads = [self._spool_thread, self._upload_thread, self._heartbeat_thread]
        with on_spool_disk(spool.directory):
            self.tensorboard.seal_leftovers()

    def begin_attempt(self) -> int:
        """Before `start`: this process's records form the next attempt of the run."""
        self.attempt = self.spool.begin_attempt()
        return self.attempt

    # --- the training thread's side: cheap -------------------------------------------------
    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        if self.rank_board is not None:
            self.rank_board.start()

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """A queue append and nothing else: values (tensors too) are read on the spool thread. A step
        gone through again after a resume is recorded again, under this attempt (`contract.history`)."""
        if self._fatal is not None:
            raise self._fatal
        copy, wall_time = dict(metrics), time.time()
        # Journaled first (a memory copy into the spool volume's page cache): a SIGKILL now loses nothing.
        journaled = self.spool.journal.append(step, wall_time, copy)
        # One call: no signal's exception can land between the two, leaving a step without its metrics.
        self._queue.extend(((step, wall_time, journaled), copy))

    def checkpoint_finished(self, seconds: float) -> None:
        with self._window_lock:
            self._window.checkpoint_seconds.append(seconds)

    def checkpoint_skipped(self, step: int, resume_point: int) -> None:
        """The checkpoint of `step` was skipped: the doctor says how far back a crash now would resume."""
        with self._window_lock:
            self._window.checkpoints_skipped += 1
            self._window.steps_since_checkpoint = step - resume_point

    def wait_durable(self, step: int, timeout: float) -> bool:
        """Block (a checkpoint thread, never the loop) until records through `step` are fsync'd."""
        deadline = time.monotonic() + timeout
        with self._durable:
            while self.spool.durable_step < step:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._spool_done.is_set():
                    return self.spool.durable_step >= step
                self._durable.wait(min(remaining, UPLOAD_POLL_S))
        return True

    def queued(self) -> int:
        """Steps logged and not yet taken by the spool thread."""
        return len(self._queue) // 2

    def watch_durable(self) -> threading.Event:
        """An event set each time records become durable, and once the spool is done (a mirror's wake-up)."""
        event = threading.Event()
        self._durable_watchers.append(event)
        return event

    def spool_finished(self) -> bool:
        """True once nothing more will become durable in this process."""
        return self._spool_done.is_set()

    def _notify_durable(self) -> None:
        with self._durable:
            self._durable.notify_all()
        for event in self._durable_watchers:
            event.set()

    def _remaining(self) -> float:
        return float("inf") if self._deadline is None else self._deadline - time.monotonic()

    # --- the spool thread: disk only ------------------------------------------------------------
    def _spool_loop(self) -> None:
        disk_failures = 0  # consecutive cycles a disk error (not a full disk) interrupted
        try:
            while True:
                stopping = self._stop.is_set()
                try:
                    self._persist(final=stopping)
                    disk_failures = 0
                except SpoolFullError as error:
                    self._fatal = error
                    log.error("%s: the spool is full; stopping before anything acknowledged can be lost", error)
                    return
                except SpoolTakenOverError as error:  # a second writer would renumber the new owner's chunks
                    self._fatal = error
                    log.error("%s", error)
                    return
                except SpoolDiskError as error:
                    if disk_failures == len(SPOOL_DISK_RETRY_S) or (stopping and self._remaining() <= 0):
                        self._fatal = SpoolDiskError(
                            error.errno,
                            f"{error.strerror}, {disk_failures + 1} attempts in a row: records after step "
                            f"{self.spool.durable_step} are not durable; the volume is failing, not full",
                        )
                        log.error("%s", self._fatal)
                        return
                    wait = SPOOL_DISK_RETRY_S[disk_failures]
                    disk_failures += 1
                    log.warning("%s; retrying in %.2f s, nothing dropped (%d)", error.strerror, wait, disk_failures)
                    if stopping:  # the stop event is set already: it cannot pace the retries
                        time.sleep(max(0.0, min(wait, self._remaining())))
                    else:
                        self._stop.wait(wait)
                    continue
                except Exception:  # keep persisting whatever happens (a record is durable only once fsync'd)
                    log.exception("spool cycle failed with %d step(s) in hand; retrying", self._in_hand)
                    if stopping:
                        return
                if stopping:
                    return
                if self.queued() < self.config.chunk_records:  # a backlog goes on at once
                    self._stop.wait(UPLOAD_POLL_S)
        finally:
            self._spool_done.set()
            self._upload_wake.set()
            self._notify_durable()

    def _drain(self) -> tuple[list[Logged], list[dict[str, float]]]:
        """The queued steps and their metrics, the values read here rather than on the training thread
        (a tensor's value waits for the device only on this thread)."""
        steps: list[Logged] = []
        metrics_of: list[dict[str, float]] = []
        queue = self._queue
        while queue:  # whole steps only: `log` appends both items of one in a single call
            entry, metrics = cast(Logged, queue.popleft()), cast(dict[str, Any], queue.popleft())  # `log`'s own copy
            self._in_hand += 1  # until spooled: counted as not delivered, whatever stops this cycle
            self._journaled = entry[2] or self._journaled
            for value in metrics.values():
                if type(value) is not float:
                    metrics = self._numbers(entry[0], metrics)
                    break
            steps.append(entry)
            metrics_of.append(metrics)
        if steps:
            with self._window_lock:
                for name in self._window_metrics:
                    values = [metrics[name] for metrics in metrics_of if name in metrics]
                    if values:
                        self._window.values.setdefault(name, []).extend(values)
                self._window.last_step = max(self._window.last_step, steps[-1][0])
            for (step, _, _), metrics in zip(steps, metrics_of, strict=True):  # for pod logs and SageMaker's parsers
                if step % contract.PROGRESS_LOG_INTERVAL == 0 and (loss := metrics.get(contract.LOSS_KEY)) is not None:
                    log.info(contract.progress_line(step, loss))
        return steps, metrics_of

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

    def _persist(self, *, final: bool) -> None:
        steps, metrics_of = self._drain()
        if steps:
            if self._chunk_opened_at is None:
                self._chunk_opened_at = time.monotonic()
            # A few records at a time, gone before the collector would promote them (see `Logged`).
            for start in range(0, len(steps), APPEND_SLICE):
                end = start + APPEND_SLICE
                self.spool.append(self._records(steps[start:end], metrics_of[start:end]))
            self._in_hand -= len(steps)  # each in the spool now, counted there; a failed cycle's stay counted here
            self._awaiting_sync[0].extend(steps)
            self._awaiting_sync[1].extend(metrics_of)
        self.spool.sync()  # also writes again what a failed attempt left unsynced
        self.spool.journal.durable_through(self._journaled)
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
            or (self.spool.open_records >= self.config.chunk_records and now - self._sealed_at >= UPLOAD_POLL_S)
        )
        if due or final:
            if self.spool.seal() is not None:
                self._sealed_at = now
                self._upload_wake.set()
            self._chunk_opened_at = None
            with on_spool_disk(self.spool.directory):
                self.tensorboard.rotate()

    # --- the uploader thread: S3 only -------------------------------------------------------------
    def _upload_loop(self) -> None:
        while self._fatal is None or not isinstance(self._fatal, RunConflictError):
            draining = self._spool_done.is_set()
            if time.monotonic() >= self._backoff_until:
                try:
                    self._upload_pending()
                except Exception:  # keep delivering whatever happens; the spool keeps the chunks
                    log.exception("upload cycle failed; retrying")
            if draining and not self._has_pending():
                return
            if self._remaining() <= 0:
                return
            self._upload_wake.wait(min(UPLOAD_POLL_S, max(0.0, self._remaining())))
            self._upload_wake.clear()

    def _has_pending(self) -> bool:
        return bool(self.spool.pending() or self.tensorboard.sealed())

    def _upload_pending(self) -> None:
        for chunk in self.spool.pending():
            if self._remaining() <= 0:
                return
            if not self._upload_chunk(chunk):
                self._back_off()
                return
            self._backoff = 1.0
        for path in self.tensorboard.sealed():
            if self._remaining() <= 0 or not self._upload_tensorboard(path):
                return

    def _back_off(self) -> None:
        # While draining, retry often: the shutdown budget is short.
        ceiling = 1.0 if self._deadline is not None else MAX_BACKOFF_S
        self._backoff_until = time.monotonic() + min(self._backoff, ceiling)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _upload_chunk(self, chunk: Chunk) -> bool:
        key = contract.events_key(self.config.experiment, self.config.run, chunk.sequence)
        try:
            body = chunk.body()
        except FileNotFoundError:  # acknowledged meanwhile (a drain's last pass): nothing to send
            return True
        started = time.monotonic()
        outcome = put_create_only(self.s3, bucket=self.config.bucket, key=key, body=body)
        if outcome.written is Written.CONFLICT:
            # Durable bytes disagree: no retry can fix it. Stop the job (it drains, exits non-zero,
            # and its restart is refused by the start-up reconciliation, naming the run).
            conflict = RunConflictError(
                f"run {self.config.run!r}: s3://{self.config.bucket}/{key} holds another chunk than "
                f"{chunk.path}: another job writes this run id"
            )
            self._fatal = conflict
            return self._upload_failed(key, conflict)
        if outcome.retry:  # the PUT failed, or its 412 could not be compared (a lost answer, then throttled reads)
            return self._upload_failed(key, outcome.error or RuntimeError(outcome.written.value))
        if outcome.written is Written.SAME:
            self.report.already_present += 1  # a retry of an upload S3 had already taken
        kill_points.hit(kill_points.UPLOADED_NOT_ACKNOWLEDGED)
        with self._window_lock:
            self._window.upload_latencies_ms.append((time.monotonic() - started) * 1000)
        self.spool.acknowledge(chunk)
        self.report.chunks_uploaded += 1
        try:
            self.index.acknowledged(chunk.summary(body))
        except Exception:  # the index helps readers of long runs; it never holds up delivery
            log.exception("index of chunk %d not updated", chunk.sequence)
        return True

    def _upload_failed(self, key: str, error: BaseException) -> bool:
        log.warning("upload of s3://%s/%s failed after retries: %s", self.config.bucket, key, error)
        self.report.upload_failures += 1
        with self._window_lock:
            self._window.upload_failures += 1
        return False

    # --- TensorBoard: one whole file per flush, never a growing one (`beacon.tensorboard_view`) ---
    def _upload_tensorboard(self, path: Path) -> bool:
        name = path.name.removesuffix(SEALED)
        key = contract.tensorboard_key(self.config.experiment, self.config.run, name)
        try:
            body = path.read_bytes()
        except OSError as error:
            return self._upload_failed(key, error)
        outcome = put_create_only(self.s3, bucket=self.config.bucket, key=key, body=body, compare=False)
        if not outcome.held:  # an earlier copy of this part is the one kept: it is a view of the records
            return self._upload_failed(key, outcome.error or RuntimeError(outcome.written.value))
        path.unlink()
        self.report.tensorboard_files += 1
        return True

    # --- the heartbeat thread: CloudWatch only -----------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while True:
            try:
                self.beat()
            except Exception:  # a heartbeat thread that dies makes a live job look silent
                log.exception("heartbeat failed; the next one follows")
            if self._beats_done.wait(self.config.heartbeat_interval):
                break
        if self._remaining() > 0:
            try:
                self.beat(final=True)
            except Exception:
                log.exception("final heartbeat failed")

    def beat(self, *, final: bool = False) -> None:
        now = time.time()
        ranks = read_ranks(self.ranks_dir, since=self.ranks_since) if self.ranks_dir is not None else []
        # With the other nodes' ranks where this directory holds its own node's alone: what the view counts.
        everyone = self.rank_board.merged(ranks) if self.rank_board is not None else ranks
        data, window = self._metric_batch(now, everyone)
        if not final:  # whatever CloudWatch answers: the evidence does not go through it
            self._snapshot_if_stalled(ranks, now, everyone)
        try:
            for start in range(0, len(data), MAX_DATA_PER_REQUEST):
                self.cloudwatch.put_metric_data(
                    Namespace=self.config.namespace, MetricData=data[start : start + MAX_DATA_PER_REQUEST]
                )
            self.report.metric_batches += 1
        except (ClientError, BotoCoreError, OSError) as error:
            self.report.metric_failures += 1
            self._restore_window(window)  # counted in the next batch rather than lost
            log.warning("PutMetricData to %s failed: %s", self.config.namespace, error)
            return
        if self._first_beat_at is None:
            self._first_beat_at = now
        if (
            not final
            and self.run_alarms is not None
            and not self.run_alarms.armed
            and now >= contract.run_alarms_arm_at(self._first_beat_at)
        ):
            try:
                self.run_alarms.arm()
            except (ClientError, BotoCoreError) as error:
                log.error("cannot create this run's alarms: %s", error)

    def _snapshot_if_stalled(self, ranks: list[RankProgress], now: float, everyone: list[RankProgress]) -> None:
        """Upload a live snapshot of the ranks' evidence when a rank stalls (`LiveSnapshots` says when):
        the alarm's function then names the rank while the job still hangs. A rank in a named phase (a
        150 s checkpoint) is working: rank 0's clock follows the other ranks' phases, so while any rank is
        in one (or rank 0 itself), nothing is stalled. `everyone` adds the other nodes' ranks from the board
        (`beacon.rank_board`) to this directory's `ranks`; what is uploaded stays this directory's."""
        if self.ranks_dir is None:
            return
        view = CrossRankView.of(everyone, now)
        threshold = stall_threshold(self.config.stall_dump_after, self.config.heartbeat_interval)
        stalled = a_rank_stalled(
            everyone, now, threshold=threshold, in_own_phase=self.progress.in_phase_work(),
            phase_limit=self.config.phase_limit,
        )  # fmt: skip
        busy = self._snapshot_thread is not None and self._snapshot_thread.is_alive()
        state = evidence_state(self.ranks_dir, ranks) if stalled else None
        snapshot = self.live_snapshots.due(stalled=stalled, state=state, busy=busy)
        if snapshot is None or view is None:
            return
        log.warning(
            "rank %d: no progress for %.0f s; live snapshot %d of the ranks' evidence to s3://%s/%s",
            view.slowest_rank,
            view.slowest_progress_age,
            snapshot,
            self.config.bucket,
            contract.live_rank_evidence_key(self.config.experiment, self.config.run, self.attempt, snapshot, ""),
        )
        self._snapshot_thread = threading.Thread(
            target=self._upload_snapshot,
            args=(self.ranks_dir, snapshot, frozenset(r.rank for r in ranks)),  # this attempt's ranks' files
            name="beacon-rank-snapshot",
            daemon=True,
        )
        self._snapshot_thread.start()

    def _upload_snapshot(self, directory: Path, snapshot: int, ranks: frozenset[int]) -> None:
        try:
            upload_rank_evidence(
                self.s3, bucket=self.config.bucket, experiment=self.config.experiment, run=self.config.run,
                attempt=self.attempt, directory=directory, live=snapshot, ranks=ranks,
            )  # fmt: skip
        except Exception:  # evidence helps; it never stops the heartbeat or training
            log.exception("live snapshot %d of the ranks' evidence failed", snapshot)

    def wait_live_snapshot(self, timeout: float) -> bool:
        """True once no live snapshot is uploading."""
        thread = self._snapshot_thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def _restore_window(self, sent: WindowStats) -> None:
        with self._window_lock:
            current = self._window
            for name, values in sent.values.items():
                current.values.setdefault(name, [])[:0] = values
            current.last_step = max(current.last_step, sent.last_step)
            current.upload_latencies_ms[:0] = sent.upload_latencies_ms
            current.upload_failures += sent.upload_failures
            current.checkpoint_seconds[:0] = sent.checkpoint_seconds

    def _metric_batch(self, now: float, ranks: list[RankProgress]) -> tuple[list[dict[str, Any]], WindowStats]:
        with self._window_lock:
            window, self._window = self._window, WindowStats()
        timestamp = datetime.fromtimestamp(now, UTC)
        run_dims = contract.run_dimensions(self.config.team, self.config.experiment, self.config.run)
        team_dims = contract.team_dimensions(self.config.team)

        def datum(metric: contract.Metric, dims: dict[str, str], **value: Any) -> dict[str, Any]:
            return {
                "MetricName": metric.name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Timestamp": timestamp,
                "Unit": metric.unit.value,
                "StorageResolution": metric.storage_resolution,
                **value,
            }

        self._phases_of_other_ranks.follow(ranks, now)  # before ProgressAge: their phases are work too
        mono, steps = time.monotonic(), self.progress.steps
        last_mono, last_steps = self._last_rate_sample
        self._last_rate_sample = (mono, steps)
        backlog = float(self.spool.unacknowledged_records() + self.queued() + self._in_hand)
        data = [
            datum(contract.HEARTBEAT, run_dims, Value=1.0),
            datum(contract.PROGRESS_AGE, run_dims, Value=self.progress.progress_age()),
            datum(contract.STEPS_PER_SECOND, run_dims, Value=(steps - last_steps) / max(mono - last_mono, 1e-6)),
        ]
        phase = self.progress.current_phase()  # setup, evaluation, checkpoint: work, not a stall
        if self.cross_rank_metrics and self.ranks_dir is not None and (view := CrossRankView.of(ranks, now)):
            data.append(datum(contract.SLOWEST_RANK_PROGRESS_AGE, run_dims, Value=view.slowest_progress_age))
            data.append(datum(contract.RANK_STEP_SPREAD, run_dims, Value=float(view.step_spread)))
        if phase is not None:
            phase_dims = contract.phase_dimensions(self.config.team, self.config.experiment, self.config.run, phase[0])
            data.append(datum(contract.PHASE_SECONDS, phase_dims, Value=phase[1]))
        for dims in (run_dims, team_dims):
            data.append(datum(contract.SPOOL_BACKLOG, dims, Value=backlog))
            data.append(datum(contract.UPLOAD_FAILURES, dims, Value=float(window.upload_failures)))
        losses = window.values.get(contract.LOSS_KEY, [])
        sendable = [v for v in losses if cloudwatch_accepts(v)]
        if sendable:
            data.append(datum(contract.LOSS, run_dims, StatisticValues=statistic_set(sendable)))
        if len(sendable) < len(losses):
            data.append(datum(contract.NON_FINITE_LOSS, run_dims, Value=float(len(losses) - len(sendable))))
        for name in self._cloudwatch_metrics:  # the team's own, at their cost; only what CloudWatch accepts
            accepted = [v for v in window.values.get(name, []) if cloudwatch_accepts(v)]
            if accepted and name != contract.LOSS_KEY:
                data.append(datum(contract.team_metric(name), run_dims, StatisticValues=statistic_set(accepted)))
        if window.last_step >= 0:
            data.append(datum(contract.STEP, run_dims, Value=float(window.last_step)))
        if window.upload_latencies_ms:
            data.append(
                datum(contract.UPLOAD_LATENCY, run_dims, StatisticValues=statistic_set(window.upload_latencies_ms))
            )
        if window.checkpoint_seconds:
            data.append(
                datum(contract.CHECKPOINT_SECONDS, run_dims, StatisticValues=statistic_set(window.checkpoint_seconds))
            )
        if window.checkpoints_skipped:
            data.append(datum(contract.CHECKPOINTS_SKIPPED, run_dims, Value=float(window.checkpoints_skipped)))
            data.append(
                datum(contract.STEPS_SINCE_CHECKPOINT, run_dims, Value=float(window.steps_since_checkpoint or 0))
            )
        return [d for d in data if datum_is_valid(d)], window

    def publish_final(self, summary: dict[str, Any]) -> None:
        """Tell `beacon doctor` the run finished (rather than went silent)."""
        key = contract.final_status_key(self.config.experiment, self.config.run)
        try:
            self.s3.put_object(Bucket=self.config.bucket, Key=key, Body=json.dumps(summary).encode())
        except (ClientError, BotoCoreError) as error:
            log.warning("cannot write s3://%s/%s: %s", self.config.bucket, key, error)

    def publish_rank_evidence(self, directory: Path, attempt: int) -> None:
        """Every rank's last word, stack dumps and flight-recorder dumps, from the run's ranks directory
        to S3, create-only under the attempt. When rank 0 is the rank that stopped, or the directory is
        node-local (SageMaker), the other nodes' leaders upload theirs (`beacon.node_leader`)."""
        kill_points.hit(kill_points.RANK_EVIDENCE_DUE)
        ranks = frozenset(r.rank for r in read_ranks(directory, since=self.ranks_since))  # not a restore's
        upload_rank_evidence(
            self.s3, bucket=self.config.bucket, experiment=self.config.experiment, run=self.config.run,
            attempt=attempt, directory=directory, ranks=ranks,
        )  # fmt: skip

    def publish_hyperparams(self, document: bytes) -> None:
        """Create-only, like the records: an attempt that finds other values there keeps them."""
        key = contract.hyperparams_key(self.config.experiment, self.config.run)
        outcome = put_create_only(self.s3, bucket=self.config.bucket, key=key, body=document)
        if outcome.written is Written.CONFLICT:
            log.warning(
                "s3://%s/%s holds other hyperparameters (an earlier attempt of this run): kept, these not written",
                self.config.bucket,
                key,
            )
        elif outcome.retry:
            log.warning("cannot write s3://%s/%s: %s", self.config.bucket, key, outcome.error)

    # --- shutdown ---------------------------------------------------------------------------------
    def close(self, budget: float) -> DeliveryReport:
        """Drain: make every record durable, upload every chunk and the last TensorBoard file, send a
        final metric batch and remove this run's alarms (a clean exit). Bounded by `budget` seconds.

        Each thread finishes its own work; nothing here drives the spool or S3 from this thread, so
        a call still in flight when the budget ends can never be repeated beside it."""
        self._deadline = time.monotonic() + budget
        self._backoff_until, self._backoff = 0.0, 1.0  # an outage's long backoff must not eat the budget
        self._stop.set()
        self._spool_thread.join(timeout=max(0.0, self._remaining()))
        if self._spool_thread.is_alive():
            log.error("the spool did not finish within the shutdown budget (a stuck disk?)")
        self._upload_wake.set()
        self._upload_thread.join(timeout=max(0.0, self._remaining()))
        self._beats_done.set()
        self._heartbeat_thread.join(timeout=max(0.0, self._remaining()))
        if self.rank_board is not None:
            self.rank_board.stop()
        pending = self.spool.pending()
        self.report.pending_chunks = len(pending)
        self.report.tensorboard_thinned = self.tensorboard.thinned
        self.report.journal_skipped = self.spool.journal.skipped
        self.report.spool_unfinished = self._spool_thread.is_alive()
        self.report.unacknowledged_records = self.spool.unacknowledged_records() + self.queued() + self._in_hand
        if self.run_alarms is not None and self.run_alarms.armed and not self.report.unacknowledged_records:
            try:
                self.run_alarms.disarm()
            except (ClientError, BotoCoreError) as error:
                log.error("cannot delete this run's alarms (they will fire): %s", error)
        if not self._spool_thread.is_alive():
            self.spool.close()
        return self.report
