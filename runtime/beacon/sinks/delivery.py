"""What the telemetry's threads share: their lifecycle and the delivery report.

Each thread (the spool writer, the uploader, the heartbeat) finishes its own work once the lifecycle closes;
nothing drives the spool or S3 from another thread, so a call still in flight when the budget ends is never
repeated beside it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


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


class Lifecycle:
    """Running until `close(budget)`; then closing, each thread bounded by the deadline. `fatal`: an error that
    stops the run (a full spool, a second writer), raised to the loop at its next `run.log`."""

    def __init__(self) -> None:
        self.closing = threading.Event()  # the loop is over: seal what is left, deliver it, then stop
        self.deadline: float | None = None
        self.fatal: BaseException | None = None

    def close(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget
        self.closing.set()

    def remaining(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()
