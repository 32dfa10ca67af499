"""Named durable-state transitions, where a kill-point test stops the process on purpose.

In production `hit` does nothing. A test installs a function that SIGKILLs the process at the n-th
hit of one name, the way a debugger breakpoint would: no sleep, no luck.
"""

from __future__ import annotations

from collections.abc import Callable

SEAL_STATE_WRITTEN = "seal:state-written"  # the state counts the chunk; the open file is not renamed yet
SEAL_RENAMED = "seal:renamed"  # the chunk is sealed; its directory entry not yet fsync'd
UPLOADED_NOT_ACKNOWLEDGED = "upload:acknowledged-by-s3"  # S3 holds the chunk; the spool still does too
CHECKPOINT_WRITTEN = "checkpoint:file-written"  # the checkpoint file is durable; latest not yet moved
CHECKPOINT_PROMOTED = "checkpoint:latest-moved"  # latest points at it; older ones not yet pruned
MIRROR_SENT_NOT_RECORDED = "mirror:sent-not-recorded"  # the tracker holds a batch; the cursor does not say so yet
RANK_EVIDENCE_DUE = "ranks:last-words-written"  # the ranks finished together; rank 0 has not uploaded their evidence
ALL = (
    SEAL_STATE_WRITTEN,
    SEAL_RENAMED,
    UPLOADED_NOT_ACKNOWLEDGED,
    CHECKPOINT_WRITTEN,
    CHECKPOINT_PROMOTED,
    MIRROR_SENT_NOT_RECORDED,
    RANK_EVIDENCE_DUE,
)


def _nothing(_name: str) -> None: ...


_handler: Callable[[str], None] = _nothing


def hit(name: str) -> None:
    _handler(name)


def install(handler: Callable[[str], None]) -> None:
    global _handler
    _handler = handler
