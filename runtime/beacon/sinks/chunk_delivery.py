"""The one delivery of a sealed chunk, the uploader thread's and `beacon.sync`'s (a module of its own: sync loads
nothing of the uploader's TensorBoard view)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from beacon import contract, kill_points
from beacon.create_only import Outcome, Written, put_create_only
from beacon.log.reconcile import RunConflictError
from beacon.log.spool import Chunk, Spool
from beacon.sinks.index import IndexWriter

log = logging.getLogger("beacon.telemetry")


@dataclass(frozen=True)
class Delivered:
    outcome: Outcome
    put_s: float  # the create-only write's own time (the upload latency the heartbeat reports)


def deliver_chunk(s3: Any, *, bucket: str, spool: Spool, index: IndexWriter, chunk: Chunk, body: bytes) -> Delivered:
    """Create-only under the chunk's events key; once S3 holds these bytes (created now, or already there) the spool
    lets the chunk go and the index counts it. Other bytes under the key raise RunConflictError naming the run (no
    retry can fix it); an outcome to retry is returned as it is, the chunk kept. The run is the index's: one writer
    of its keys."""
    key = contract.events_key(index.experiment, index.run, chunk.sequence)
    started = time.monotonic()
    outcome = put_create_only(s3, bucket=bucket, key=key, body=body)
    put_s = time.monotonic() - started
    if outcome.written is Written.CONFLICT:
        raise RunConflictError(
            f"run {index.run!r}: s3://{bucket}/{key} holds another chunk than {chunk.path}: another job writes this "
            "run id (the spool keeps its records)"
        )
    if outcome.retry:
        return Delivered(outcome, put_s)
    kill_points.hit(kill_points.UPLOADED_NOT_ACKNOWLEDGED)
    spool.acknowledge(chunk)
    try:
        index.acknowledged(chunk.summary(body))
    except Exception:  # the index helps readers of long runs; it never holds up delivery
        log.exception("index of chunk %d not updated", chunk.sequence)
    return Delivered(outcome, put_s)
