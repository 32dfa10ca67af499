"""The durable spool: append-only records on the persistent volume, sealed into immutable chunks.

The spool is the source of truth. A record is durable once fsync'd into the open chunk; a chunk
leaves the pending set only after S3 acknowledged it. After a crash the open chunk is sealed
(dropping a torn last line), and the position (next chunk, next sequence number, last step) is
derived from what is durable: the state file, the sealed chunks and the open chunk, whichever is
furthest. The state file is written before a chunk is sealed, so a chunk S3 acknowledged and the
spool deleted is always counted in it: a kill at any point of a seal never reuses a chunk number.
Sequence numbers and the last recorded step come from records present here or in S3 (`reconcile`),
never from the state alone: a partial restore cannot make the job skip steps nobody holds.
"""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beacon import kill_points
from beacon.contract import Record

OPEN = "open.jsonl"
SEALED = "sealed"
STATE = "state.json"


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, data: bytes) -> None:
    """Write, fsync, rename: readers see the old content or the new, never half of it."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


@dataclass(frozen=True)
class Chunk:
    sequence: int
    path: Path
    records: int

    def body(self) -> bytes:
        return self.path.read_bytes()


class SpoolFullError(OSError):
    """The spool's filesystem is full: nothing more can be made durable."""


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextmanager
def on_spool_disk(directory: Path) -> Iterator[None]:
    """Turn a full disk under the spool into SpoolFullError, whatever wrote to it."""
    try:
        yield
    except SpoolFullError:
        raise
    except OSError as error:
        if error.errno in FULL:
            raise SpoolFullError(error.errno, f"spool {directory}: {error.strerror}") from error
        raise


class Spool:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.sealed_dir = directory / SEALED
        self.sealed_dir.mkdir(parents=True, exist_ok=True)
        # The uploader lists and acknowledges chunks while the spool thread seals them.
        self._lock = threading.Lock()
        state = self._read_state()
        # Chunk numbers are never reused, so the state's count is a floor. The sequence and the last
        # step come from records actually present (here, then in S3 by `reconcile`): a restore that
        # brings back the state file but not the chunks it counts must not skip their steps.
        self.next_chunk: int = state.get("next_chunk", 0)
        self._state_seq: int = state.get("next_seq", 0)
        self.next_seq = 0
        self.last_step = -1
        self.recovered_records = 0
        self._sealed: dict[int, Chunk] = {}
        for sequence in self._sealed_sequences():
            self._index_sealed(sequence)
        self._recover_open_chunk()
        self._open = open(self.directory / OPEN, "ab")  # noqa: SIM115 - held for the spool's life
        self.open_records = 0
        self.durable_step: int = self.last_step
        # The last sequence number fsync'd (here, or in S3 after `continue_after`): what a mirror may read.
        self.durable_seq: int = self.next_seq - 1

    # --- recovery ----------------------------------------------------------------------
    def _read_state(self) -> dict[str, Any]:
        path = self.directory / STATE
        return dict(json.loads(path.read_text())) if path.exists() else {}

    def _sealed_sequences(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.sealed_dir.glob("chunk-*.jsonl"))

    def _index_sealed(self, sequence: int) -> None:
        """Count a sealed chunk found on disk, and move the position past what it holds."""
        path = self.sealed_path(sequence)
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        self._sealed[sequence] = Chunk(sequence, path, len(lines))
        self.next_chunk = max(self.next_chunk, sequence + 1)
        self._advance_past(lines)

    def _advance_past(self, lines: list[bytes]) -> None:
        for line in lines:
            record = Record.from_line(line)
            self.next_seq = max(self.next_seq, record.seq + 1)
            self.last_step = max(self.last_step, record.step)

    def _recover_open_chunk(self) -> None:
        path = self.directory / OPEN
        if not path.exists():
            return
        data = path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # a torn last line was never durable
        lines = [line for line in complete.splitlines() if line.strip()]
        if not lines:
            path.unlink()
            return
        if len(complete) < len(data):
            # Cut the torn tail in place: the complete records are never rewritten, so a second
            # kill here cannot lose them.
            os.truncate(path, len(complete))
        first_seq = Record.from_line(lines[0]).seq
        state_seq = self._state_seq
        self._advance_past(lines)
        self.recovered_records = len(lines)
        # A seal writes the state (next chunk = N + 1) before renaming the open chunk into N: an open
        # chunk whose records the state already counts is that chunk N, caught between the two.
        sequence = self.next_chunk - 1 if first_seq < state_seq and self.next_chunk > 0 else self.next_chunk
        sequence = max(sequence, max(self._sealed, default=-1) + 1)
        self._seal_path(path, len(lines), sequence)

    def continue_after(self, *, chunk: int, seq: int, step: int) -> None:
        """Continue after what S3 already holds (a new volume under an existing run)."""
        with self._lock:
            self.next_chunk = max(self.next_chunk, chunk + 1)
            self.next_seq = max(self.next_seq, seq + 1)
            self.last_step = max(self.last_step, step)
            self.durable_step = max(self.durable_step, self.last_step)
            self.durable_seq = max(self.durable_seq, self.next_seq - 1)
            self._write_state()

    # --- writing (the spool thread) -------------------------------------------------------
    def _usable(self) -> None:
        if self._open.closed:  # a seal failed half-way on a full disk
            raise SpoolFullError(errno.ENOSPC, f"spool {self.directory}: unusable since the disk filled up")

    def append(self, records: list[Record]) -> None:
        """Assign sequence numbers and write records to the open chunk; `sync` makes them durable."""
        if not records:
            return
        self._usable()
        lines = []
        for record in records:
            lines.append(record.with_seq(self.next_seq).to_line())
            self.next_seq += 1
            self.last_step = max(self.last_step, record.step)
        try:
            self._open.write(b"".join(lines))
        except OSError as error:
            raise SpoolFullError(error.errno, f"spool {self.directory}: {error.strerror}") from error
        self.open_records += len(records)

    def sync(self) -> None:
        self._usable()
        try:
            self._open.flush()
            os.fsync(self._open.fileno())
        except OSError as error:
            raise SpoolFullError(error.errno, f"spool {self.directory}: {error.strerror}") from error
        self.durable_step = self.last_step
        self.durable_seq = self.next_seq - 1

    def seal(self) -> Chunk | None:
        """Close the open chunk into an immutable, numbered one; None if it is empty."""
        if self.open_records == 0:
            return None
        with on_spool_disk(self.directory):
            self.sync()
            if not self._open.closed:
                self._open.close()
            chunk = self._seal_path(self.directory / OPEN, self.open_records, self.next_chunk)
            self._open = open(self.directory / OPEN, "ab")  # noqa: SIM115
        self.open_records = 0
        return chunk

    def _seal_path(self, path: Path, records: int, sequence: int) -> Chunk:
        target = self.sealed_path(sequence)
        with self._lock:
            self.next_chunk = max(self.next_chunk, sequence + 1)
            self._write_state()  # first: the state counts this chunk before it can be acknowledged
        kill_points.hit(kill_points.SEAL_STATE_WRITTEN)
        os.replace(path, target)
        kill_points.hit(kill_points.SEAL_RENAMED)
        fsync_directory(self.sealed_dir)
        chunk = Chunk(sequence, target, records)
        with self._lock:
            self._sealed[sequence] = chunk
        return chunk

    def sealed_path(self, sequence: int) -> Path:
        return self.sealed_dir / f"chunk-{sequence:08d}.jsonl"

    def _write_state(self) -> None:
        state = {"next_chunk": self.next_chunk, "next_seq": self.next_seq, "last_step": self.last_step}
        write_atomically(self.directory / STATE, json.dumps(state).encode())

    # --- the pending set (the uploader thread) -----------------------------------------------
    def pending(self) -> list[Chunk]:
        with self._lock:
            return [self._sealed[sequence] for sequence in sorted(self._sealed)]

    def acknowledge(self, chunk: Chunk) -> None:
        """S3 holds the chunk: only now does it leave the spool."""
        with self._lock:
            self._sealed.pop(chunk.sequence, None)
            chunk.path.unlink(missing_ok=True)

    def unacknowledged_records(self) -> int:
        with self._lock:
            return self.open_records + sum(c.records for c in self._sealed.values())

    def close(self) -> None:
        try:
            self._open.close()
        except OSError as error:  # a full disk: what it could not flush was never durable
            if error.errno not in FULL:
                raise
