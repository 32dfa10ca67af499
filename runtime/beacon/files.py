"""Files on the volumes a run writes (the spool, the checkpoints, the mirrors' cursors): the one atomic write, the
directory fsync that makes a rename durable, and what to do about a volume mounted read-only (said by the launcher
and by preflight alike). A foundation: it imports nothing of Beacon's."""

from __future__ import annotations

import os
from pathlib import Path

READ_ONLY_FIX = "mount it read-write (the pod's volumeMount without readOnly, a ReadWriteMany claim)"


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, data: bytes) -> None:
    """Write, fsync, rename: readers see the old content or the new, never half of it."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)  # a full volume: the old content stays, no half-written file beside it
        raise
    fsync_directory(path.parent)
