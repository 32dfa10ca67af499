"""Telemetry that cannot be lost: the composer of the writer's threads, one role each.

- `beacon.sinks.spool_writer.SpoolWriter`, the spool thread (disk only): `run.log`'s queue into the spool, fsync'd;
- `beacon.sinks.chunk_uploader.ChunkUploader`, the uploader thread (S3 only): sealed chunks, create-only, and the index;
- `beacon.sinks.heartbeat.Heartbeat`, the heartbeat thread (CloudWatch only), with `beacon.evidence.live_evidence`
  while a rank stalls.

The training thread only appends to a queue (`log`), so its cost per step is microseconds. Failures never stop
training: they count as UploadFailures and grow SpoolBacklog. `NullTelemetry`, what ranks other than 0 get, is the
do-nothing sibling behind the same `TelemetrySink` protocol.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from beacon import contract, kill_points
from beacon.create_only import Written, put_create_only
from beacon.evidence.live_evidence import LiveEvidence, RanksDirectory, StallWatch
from beacon.evidence.progress import ProgressClock
from beacon.evidence.rank_board import RankBoard
from beacon.evidence.ranks import rank_signal_interval, read_ranks, this_attempts_documents_since, upload_rank_evidence
from beacon.log.spool import Spool
from beacon.settings import RunSettings
from beacon.sinks.chunk_uploader import ChunkUploader
from beacon.sinks.delivery import DeliveryReport, Lifecycle
from beacon.sinks.heartbeat import Heartbeat
from beacon.sinks.metric_window import MetricWindow
from beacon.sinks.run_alarms import RunAlarms
from beacon.sinks.spool_writer import SpoolWriter

log = logging.getLogger("beacon.telemetry")

FLUSH_POLL_S = 0.05

__all__ = ["DeliveryReport", "Flushed", "NullTelemetry", "Telemetry", "TelemetrySink"]


@dataclass(frozen=True)
class Flushed:
    """What `flush` found, and where: the last step logged before it, the last step fsync'd in the spool (a SIGKILL
    or a lost pod cannot take it; a lost volume can), the records not yet in S3, and whether every record logged
    before the flush is in S3 (false where nothing is sent: other ranks, telemetry off)."""

    logged_step: int
    durable_step: int
    not_in_s3: int
    in_s3: bool


class TelemetrySink(Protocol):
    """What the run asks of its telemetry, rank 0's or the do-nothing sibling's."""

    attempt: int

    def begin_attempt(self) -> int: ...

    def start(self) -> None: ...

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def checkpoint_finished(self, seconds: float) -> None: ...

    def checkpoint_skipped(self, step: int, resume_point: int) -> None: ...

    def wait_durable(self, step: int, timeout: float) -> bool: ...

    def flush(self, timeout: float) -> Flushed: ...

    def close(self, budget: float) -> DeliveryReport: ...

    def publish_final(self, summary: dict[str, Any]) -> None: ...

    def publish_hyperparams(self, document: bytes) -> None: ...

    def publish_rank_evidence(self, directory: Path, attempt: int) -> None: ...


class NullTelemetry:
    """What ranks other than 0 get: no sink is ever touched."""

    attempt = 0

    def begin_attempt(self) -> int:
        return self.attempt

    def start(self) -> None: ...

    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def checkpoint_finished(self, seconds: float) -> None: ...

    def checkpoint_skipped(self, step: int, resume_point: int) -> None: ...

    def wait_durable(self, step: int, timeout: float) -> bool:
        return True

    def flush(self, timeout: float) -> Flushed:
        return Flushed(-1, -1, 0, in_s3=False)

    def close(self, budget: float) -> DeliveryReport:
        return DeliveryReport()

    def publish_final(self, summary: dict[str, Any]) -> None: ...

    def publish_hyperparams(self, document: bytes) -> None: ...

    def publish_rank_evidence(self, directory: Path, attempt: int) -> None: ...


class Telemetry:
    """Rank 0's telemetry: builds its three threads and their shared state, starts them, and closes them in order.
    `ranks_dir`: the run's ranks directory, whose documents the heartbeat reads (its cross-rank view and live
    snapshots); `world_size` > 1 sends the cross-rank metrics and, with `node_rank`, reads other nodes' documents
    from the board."""

    def __init__(
        self,
        config: RunSettings,
        *,
        s3: Any,
        cloudwatch: Any,
        progress: ProgressClock,
        spool: Spool,
        run_alarms: RunAlarms | None,
        ranks_dir: Path | None = None,
        world_size: int = 1,
        node_rank: int = -1,
    ) -> None:
        self.config, self.s3, self.spool, self.progress = config, s3, spool, progress
        self.run_alarms = run_alarms
        self.attempt = 0
        self.report = DeliveryReport()
        self.lifecycle = Lifecycle()
        self.window = MetricWindow((contract.LOSS_KEY, *sorted(set(config.cloudwatch_metrics) - {contract.LOSS_KEY})))
        self.ranks_since = this_attempts_documents_since()  # an earlier attempt's documents are not this one's
        # Other nodes' documents, where each node has its own directory; started with the threads
        board = (
            RankBoard(ranks_dir, node_rank=node_rank, since=self.ranks_since,
                      interval=rank_signal_interval(config.heartbeat_interval))
            if ranks_dir is not None and world_size > 1 else None
        )  # fmt: skip
        self.ranks = RanksDirectory(ranks_dir, self.ranks_since, board) if ranks_dir is not None else None
        self.evidence = LiveEvidence(s3, config, progress=progress) if ranks_dir is not None else None
        self.stall_watch: StallWatch | None = None
        # Disk and network never share a thread: a slow S3 cannot delay durability, and a slow
        # CloudWatch cannot delay an upload.
        window, report, lifecycle = self.window, self.report, self.lifecycle  # shared by the threads
        self.spool_writer = SpoolWriter(
            config, spool=spool, sealed=lambda: self.uploader.wake(), window=window, report=report, lifecycle=lifecycle
        )
        self.tensorboard = self.spool_writer.tensorboard
        self.uploader = ChunkUploader(
            config, s3=s3, spool=spool, tensorboard=self.tensorboard, spool_done=self.spool_writer.done,
            window=window, report=report, lifecycle=lifecycle,
        )  # fmt: skip
        self.heartbeat = Heartbeat(
            config, cloudwatch=cloudwatch, progress=progress, backlog=self.unacknowledged_records,
            attempt=lambda: self.attempt, run_alarms=run_alarms, ranks=self.ranks,
            cross_rank_metrics=world_size > 1, evidence=self.evidence, window=window, report=report,
            lifecycle=lifecycle,
        )  # fmt: skip
        self._threads = [self.spool_writer.thread, self.uploader.thread, self.heartbeat.thread]

    def begin_attempt(self) -> int:
        """Before `start`: this process's records form the next attempt of the run."""
        self.attempt = self.spool_writer.attempt = self.spool.begin_attempt()
        return self.attempt

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        if self.ranks is not None and self.ranks.board is not None:
            self.ranks.board.start()
        if self.ranks is not None and self.evidence is not None:  # a hang looked for between heartbeats too
            self.stall_watch = StallWatch(self.evidence, self.ranks, lambda: self.attempt).start()

    # --- the training thread's side: cheap -------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """A queue append and nothing else: values (tensors too) are read on the spool thread. A step
        gone through again after a resume is recorded again, under this attempt (`contract.history`)."""
        if self.lifecycle.fatal is not None:
            raise self.lifecycle.fatal
        self.spool_writer.log(step, metrics)

    def checkpoint_finished(self, seconds: float) -> None:
        self.window.checkpoint_finished(seconds)

    def checkpoint_skipped(self, step: int, resume_point: int) -> None:
        """The checkpoint of `step` was skipped: the doctor says how far back a crash now would resume."""
        self.window.checkpoint_skipped(step, resume_point)

    def wait_durable(self, step: int, timeout: float) -> bool:
        """Block (a checkpoint thread, never the loop) until records through `step` are fsync'd."""
        return self.spool_writer.wait_durable(step, timeout)

    def flush(self, timeout: float) -> Flushed:
        """Block until every record logged so far is fsync'd in the spool and, its chunk sealed at once, in S3; or
        until `timeout`. What it found, either way. Counted in records, not steps: a step logged twice (train,
        then evaluation) is two records."""
        if self.lifecycle.fatal is not None:
            raise self.lifecycle.fatal
        writer, logged = self.spool_writer, self.spool_writer.logged
        deadline = time.monotonic() + timeout
        writer.seal_soon()
        self.uploader.retry_now()  # an outage's backoff is not this flush's wait
        delivered = False
        while not delivered and time.monotonic() < deadline and not writer.done.is_set():
            time.sleep(FLUSH_POLL_S)
            delivered = self.report.records >= logged and self.unacknowledged_records() == 0
        delivered = delivered or (self.report.records >= logged and self.unacknowledged_records() == 0)
        return Flushed(writer.last_logged, self.spool.durable_step, self.unacknowledged_records(), in_s3=delivered)

    def unacknowledged_records(self) -> int:
        """Logged, not yet in S3: queued, in the spool thread's hands, or spooled."""
        unspooled = self.spool_writer.unspooled()  # first: a record the spool takes meanwhile is counted there
        return unspooled + self.spool.unacknowledged_records()

    def watch_durable(self) -> Any:
        return self.spool_writer.watch_durable()

    def spool_finished(self) -> bool:
        """True once nothing more will become durable in this process."""
        return self.spool_writer.done.is_set()

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
        node-local (SageMaker), the other nodes' leaders upload theirs (`beacon.evidence.node_leader`)."""
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

        Each thread finishes its own work, in order (spool, uploader, heartbeat); nothing here drives the spool or
        S3 from this thread, so a call still in flight when the budget ends can never be repeated beside it."""
        lifecycle = self.lifecycle
        lifecycle.close(budget)
        if self.stall_watch is not None:
            self.stall_watch.stop()
        self.uploader.closing()
        self.spool_writer.wake()
        self.spool_writer.thread.join(timeout=max(0.0, lifecycle.remaining()))
        if self.spool_writer.thread.is_alive():
            log.error("the spool did not finish within the shutdown budget (a stuck disk?)")
        self.uploader.wake()
        self.uploader.thread.join(timeout=max(0.0, lifecycle.remaining()))
        self.heartbeat.done.set()
        self.heartbeat.thread.join(timeout=max(0.0, lifecycle.remaining()))
        if self.ranks is not None and self.ranks.board is not None:
            self.ranks.board.stop()
        self.report.pending_chunks = len(self.spool.pending())
        self.report.tensorboard_thinned = self.tensorboard.thinned
        self.report.journal_skipped = self.spool.journal.skipped
        self.report.spool_unfinished = self.spool_writer.thread.is_alive()
        self.report.unacknowledged_records = self.unacknowledged_records()
        if self.run_alarms is not None and self.run_alarms.armed and not self.report.unacknowledged_records:
            try:
                self.run_alarms.disarm()
            except (ClientError, BotoCoreError) as error:
                log.error("cannot delete this run's alarms (they will fire): %s", error)
        if not self.spool_writer.thread.is_alive():
            self.spool.close()
        return self.report
