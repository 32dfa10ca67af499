"""The uploader thread: S3 only. Each sealed chunk goes up create-only and synchronously, then is acknowledged in
the spool and summarised in the run's index; each sealed TensorBoard part follows. A failure backs off and
retries; the spool keeps every chunk until S3 holds it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.create_only import Written, put_create_only
from beacon.log.reconcile import RunConflictError
from beacon.log.spool import Chunk, Spool
from beacon.settings import RunSettings
from beacon.sinks.chunk_delivery import deliver_chunk
from beacon.sinks.delivery import DeliveryReport, Lifecycle
from beacon.sinks.index import IndexWriter
from beacon.sinks.metric_window import MetricWindow
from beacon.sinks.tensorboard_view import SEALED, TensorBoardView

log = logging.getLogger("beacon.telemetry")

POLL_S = 0.25
MAX_BACKOFF_S = 30.0


class ChunkUploader:
    def __init__(
        self,
        config: RunSettings,
        *,
        s3: Any,
        spool: Spool,
        tensorboard: TensorBoardView,
        window: MetricWindow,
        report: DeliveryReport,
        lifecycle: Lifecycle,
        spool_done: threading.Event,
    ) -> None:
        self.config, self.s3, self.spool, self.tensorboard = config, s3, spool, tensorboard
        self.window, self.report, self.lifecycle = window, report, lifecycle
        self._spool_done = spool_done  # set once nothing new will be sealed
        self.index = IndexWriter(s3, bucket=config.bucket, experiment=config.experiment, run=config.run)
        self._wake = threading.Event()
        self._backoff_until = 0.0
        self._backoff = 1.0
        self.thread = threading.Thread(target=self._loop, name="beacon-uploader", daemon=True)

    def wake(self) -> None:
        self._wake.set()

    def retry_now(self) -> None:
        """Try at once, whatever the backoff says (a flush is waiting)."""
        self._backoff_until = 0.0
        self._wake.set()

    def closing(self) -> None:
        """The shutdown budget starts: an outage's long backoff must not eat it."""
        self._backoff_until, self._backoff = 0.0, 1.0
        self._wake.set()

    def _loop(self) -> None:
        remaining: Callable[[], float] = self.lifecycle.remaining
        while not isinstance(self.lifecycle.fatal, RunConflictError):
            draining = self._spool_done.is_set()
            if time.monotonic() >= self._backoff_until:
                try:
                    self.upload_pending()
                except Exception:  # keep delivering whatever happens; the spool keeps the chunks
                    log.exception("upload cycle failed; retrying")
            if draining and not self._has_pending():
                return
            if remaining() <= 0:
                return
            self._wake.wait(min(POLL_S, max(0.0, remaining())))
            self._wake.clear()

    def _has_pending(self) -> bool:
        return bool(self.spool.pending() or self.tensorboard.sealed())

    def upload_pending(self) -> None:
        """One pass: every sealed chunk, then every sealed TensorBoard part, until one fails."""
        for chunk in self.spool.pending():
            if self.lifecycle.remaining() <= 0:
                return
            if not self._upload_chunk(chunk):
                self._back_off()
                return
            self._backoff = 1.0
        for path in self.tensorboard.sealed():
            if self.lifecycle.remaining() <= 0 or not self._upload_tensorboard(path):
                return

    def _back_off(self) -> None:
        # While draining, retry often: the shutdown budget is short.
        ceiling = 1.0 if self.lifecycle.deadline is not None else MAX_BACKOFF_S
        self._backoff_until = time.monotonic() + min(self._backoff, ceiling)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)

    def _upload_chunk(self, chunk: Chunk) -> bool:
        try:
            body = chunk.body()
        except FileNotFoundError:  # acknowledged meanwhile (a drain's last pass): nothing to send
            return True
        key = contract.events_key(self.config.experiment, self.config.run, chunk.sequence)
        try:
            delivered = deliver_chunk(
                self.s3, bucket=self.config.bucket, spool=self.spool, index=self.index, chunk=chunk, body=body
            )
        except RunConflictError as conflict:
            # Durable bytes disagree: no retry can fix it. Stop the job (it drains, exits non-zero,
            # and its restart is refused by the start-up reconciliation, naming the run).
            self.lifecycle.fatal = conflict
            return self._upload_failed(key, conflict)
        outcome = delivered.outcome
        if outcome.retry:  # the PUT failed, or its 412 could not be compared (a lost answer, then throttled reads)
            return self._upload_failed(key, outcome.error or RuntimeError(outcome.written.value))
        if outcome.written is Written.SAME:
            self.report.already_present += 1  # a retry of an upload S3 had already taken
        self.window.uploaded(delivered.put_s * 1000)  # the PUT's own time, not the acknowledgement's or the index's
        self.report.chunks_uploaded += 1
        return True

    def _upload_failed(self, key: str, error: BaseException) -> bool:
        log.warning("upload of s3://%s/%s failed after retries: %s", self.config.bucket, key, error)
        self.report.upload_failures += 1
        self.window.upload_failed()
        return False

    # --- TensorBoard: one whole file per flush, never a growing one (`beacon.sinks.tensorboard_view`) ---
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
