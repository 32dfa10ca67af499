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
import io
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from beacon import kill_points
from beacon.contract import ChunkSummary, Record, records_of
from beacon.files import fsync_directory, write_atomically
from beacon.log.journal import Journal

if TYPE_CHECKING:
    from beacon.log.spool_owner import SpoolOwner

log = logging.getLogger("beacon.spool")

OPEN = "open.jsonl"
SEALED = "sealed"
STATE = "state.json"


@dataclass(frozen=True)
class Chunk:
    sequence: int
    path: Path
    records: int
    # Kept while the records were appended; a chunk found on disk after a restart has none yet.
    known_summary: ChunkSummary | None = None

    def body(self) -> bytes:
        return self.path.read_bytes()

    def summary(self, body: bytes | None = None) -> ChunkSummary:
        if self.known_summary is not None:
            return self.known_summary
        return ChunkSummary.of(self.sequence, records_of(self.body() if body is None else body))


class RunningSummary:
    """The open chunk's summary, kept up to date as records are appended (no re-reading at seal)."""

    def __init__(self) -> None:
        self.count = 0
        self.first_seq = self.last_seq = -1
        self.low_step = self.high_step = 0
        self.attempts: set[int] = set()
        self.low_wall = self.high_wall = 0.0

    def add(self, record: Record, seq: int) -> None:
        """`record` under sequence number `seq` (the spool numbers records as it appends them)."""
        if self.count == 0:
            self.first_seq = seq
            self.low_step = self.high_step = record.step
            self.low_wall = self.high_wall = record.wall_time
        else:
            if record.step < self.low_step:
                self.low_step = record.step
            elif record.step > self.high_step:
                self.high_step = record.step
            if record.wall_time < self.low_wall:
                self.low_wall = record.wall_time
            elif record.wall_time > self.high_wall:
                self.high_wall = record.wall_time
        self.last_seq = seq
        self.count += 1
        self.attempts.add(record.attempt)

    def of(self, chunk: int) -> ChunkSummary | None:
        if self.count == 0:
            return None
        return ChunkSummary(
            chunk=chunk,
            records=self.count,
            first_seq=self.first_seq,
            last_seq=self.last_seq,
            first_step=self.low_step,
            last_step=self.high_step,
            attempts=tuple(sorted(self.attempts)),
            first_wall_time=self.low_wall,
            last_wall_time=self.high_wall,
        )


def lost_values(values: dict[str, int]) -> str:
    """`loss x180, acc x3`: the values a kill took, by metric."""
    return ", ".join(f"{name} x{count}" for name, count in sorted(values.items()))


class SpoolFullError(OSError):
    """The spool's filesystem is full: nothing more can be made durable."""


class SpoolDiskError(OSError):
    """The spool's disk failed a write, an fsync or a rename for another reason than being full (EIO,
    a stale NFS handle, ...): often transient, so the spool thread retries; nothing is dropped."""


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def describe(directory: Path, error: OSError) -> str:
    code = errno.errorcode.get(error.errno or 0, str(error.errno))
    return f"spool {directory}: {error.strerror or error} ({code})"


@contextmanager
def on_spool_disk(directory: Path) -> Iterator[None]:
    """Name what failed under the spool, whatever wrote to it: a full disk (SpoolFullError) or any
    other disk error (SpoolDiskError)."""
    try:
        yield
    except (SpoolFullError, SpoolDiskError):
        raise
    except OSError as error:
        kind = SpoolFullError if error.errno in FULL else SpoolDiskError
        raise kind(error.errno, describe(directory, error)) from error


class Spool:
    def __init__(self, directory: Path, *, owner: SpoolOwner | None = None) -> None:
        """`owner`, claimed before (`spool_owner`): renewed as the spool syncs, released at close."""
        self.directory = directory
        self.owner = owner
        self.sealed_dir = directory / SEALED
        self.sealed_dir.mkdir(parents=True, exist_ok=True)
        # The uploader lists and acknowledges chunks while the spool thread seals them.
        self._lock = threading.Lock()
        # Until the journal is recovered: the records of the newest sealed chunk, the open one and S3's last chunk, by
        # what they are (attempt, step, wall time): a kill between an fsync and the journal's mark leaves that fsync's
        # steps journaled and in the open chunk both, recognised so whatever the clock did.
        self._spooled: set[tuple[int, int, float]] | None = set()
        # What recovery found damaged (a torn page after a lost machine), named: the file, and each line it set
        # aside; every readable record is kept. `repaired`: the chunks rewritten without their unreadable lines.
        self.damage: list[str] = []
        self.lines_set_aside = 0
        self.repaired: set[int] = set()
        self.values_lost: dict[str, int] = {}  # by metric: pending values a kill took (`recover_journal`)
        self.local_attempt = -1  # the highest attempt of the records this volume holds (S3's aside)
        self._state_lost = False  # state.json did not read: a recovered open chunk's number is a guess
        self._numbered_blind: set[int] = set()  # ... those chunks, renumbered after what S3 holds (`after_s3`)
        state = self._read_state()
        # Chunk numbers are never reused, so the state's count is a floor. The sequence and the last
        # step come from records actually present (here, then in S3 by `reconcile`): a restore that
        # brings back the state file but not the chunks it counts must not skip their steps.
        self.next_chunk: int = state["next_chunk"]
        self._state_seq: int = state["next_seq"]
        self.next_seq = 0
        self.last_step = -1
        self.last_attempt = -1  # the highest attempt of any record here (or in S3, after `continue_after`)
        # Per attempt: the (seq, wall time, step) of its last record spooled here or in S3, by sequence number (the
        # wall clock may step back: wall time is data, not an order)
        self._newest: dict[int, tuple[int, float, int]] = {}
        self.recovered_records = 0
        self._sealed: dict[int, Chunk] = {}
        for sequence in self._sealed_sequences():
            self._index_sealed(sequence)
        self._recover_open_chunk()
        with on_spool_disk(directory):
            self.journal = Journal(directory)  # its space taken now: a full disk is a SpoolFullError here
        self._journal_recovered = False
        self._open = self._open_chunk()
        self._reopen = False  # a seal renamed the chunk but could not open the next one yet
        self.open_records = 0
        # The open chunk's summary; it covers only what this process appended: a chunk reopened after a
        # restart holds no records (recovery seals it), so the two always agree.
        self._open_summary = RunningSummary()
        # Records appended since the last fsync, and the open chunk's size at that fsync: after a failed
        # write or fsync the tail is cut back and these bytes are written again, until one fsync
        # succeeds. An fsync that failed once may report success later for pages it dropped.
        self._unsynced = bytearray()
        self._synced_size = os.fstat(self._open.fileno()).st_size
        self._tail_suspect = False
        self._sealing_as: int | None = None  # a seal that failed half-way keeps its chunk number
        self.durable_step: int = self.last_step
        # The last sequence number fsync'd (here, or in S3 after `continue_after`): what a mirror may read.
        self.durable_seq: int = self.next_seq - 1

    def _open_chunk(self) -> io.FileIO:
        # Unbuffered: every byte goes through os.write, so nothing sits in a buffer a failure would
        # leave half-flushed.
        return io.FileIO(self.directory / OPEN, "ab")

    # --- recovery ----------------------------------------------------------------------
    def _read_state(self) -> dict[str, int]:
        """The chunk and sequence numbers given so far: a floor, since the chunks say what they hold. A state file
        that does not read (torn by a lost machine) is named and left out: the chunks alone then decide."""
        path = self.directory / STATE
        state = {"next_chunk": 0, "next_seq": 0}
        if not path.exists():
            return state
        try:
            saved = json.loads(path.read_bytes())
            return {name: int(saved.get(name, 0)) for name in state}
        except (ValueError, TypeError, AttributeError) as error:
            self._damaged(f"{path}: unreadable ({type(error).__name__}), left out: the chunks say what they hold")
            self._state_lost = True
            return state

    def _damaged(self, what: str) -> None:
        self.damage.append(what)
        log.warning("spool damaged: %s", what)

    def _readable(self, path: Path) -> tuple[list[Record], bool]:
        """The records of a chunk file; a line that is not one (zeroed or torn by a lost machine) is set aside,
        named, and the file rewritten without it (the second value: it was), so what is uploaded reads whole."""
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
        records, kept, bad, bad_lines = [], [], [], []
        for number, line in enumerate(lines, start=1):
            try:
                records.append(Record.from_line(line))
                kept.append(line)
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                bad_lines.append(line)
                bad.append(f"{path.relative_to(self.directory)} line {number}: not a record ({error})"[:300])
        if bad:
            self.lines_set_aside += len(bad)
            for what in bad:
                self._damaged(f"{what}; set aside")
            # The bytes kept aside, for whoever wants to look; the chunk, without them
            aside = self.directory / "damaged" / f"{path.name}.lines"
            aside.parent.mkdir(exist_ok=True)
            with open(aside, "ab") as kept_aside:
                kept_aside.write(b"".join(line + b"\n" for line in bad_lines))
            write_atomically(path, b"".join(line + b"\n" for line in kept))
        return records, bool(bad)

    def _sealed_sequences(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.sealed_dir.glob("chunk-*.jsonl"))

    def _index_sealed(self, sequence: int) -> None:
        """Count a sealed chunk found on disk, and move the position past what it holds."""
        path = self.sealed_path(sequence)
        records, repaired = self._readable(path)
        self.next_chunk = max(self.next_chunk, sequence + 1)
        if not records:  # every line set aside: nothing of it to deliver, its number never reused
            path.unlink()
            return
        if repaired:
            self.repaired.add(sequence)
        self._sealed[sequence] = Chunk(sequence, path, len(records))
        self.next_chunk = max(self.next_chunk, sequence + 1)
        if self._spooled is not None:  # sealed chunks come in order: the newest one's records are all it keeps
            self._spooled.clear()
        self._advance_past(records)

    def _advance_past(self, records: list[Record]) -> None:
        """Records this volume holds (its chunks, or recovered from its journal)."""
        self.remember(records)
        for record in records:
            self.local_attempt = max(self.local_attempt, record.attempt)
            self.next_seq = max(self.next_seq, record.seq + 1)
            self.last_step = max(self.last_step, record.step)
            self.last_attempt = max(self.last_attempt, record.attempt)

    def newest(self, attempt: int) -> tuple[float, int] | None:
        """The (wall time, step) of the last record of `attempt`, by sequence number, spooled here or known in S3."""
        newest = self._newest.get(attempt)
        return (newest[1], newest[2]) if newest is not None else None

    def remember(self, records: list[Record]) -> None:
        """Records spooled here or delivered to S3: the journal's recovery skips what they cover."""
        for record in records:
            newest = self._newest.get(record.attempt)
            if newest is None or record.seq > newest[0]:
                self._newest[record.attempt] = (record.seq, record.wall_time, record.step)
        if self._spooled is not None:
            self._spooled.update((r.attempt, r.step, r.wall_time) for r in records)

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
        records, repaired = self._readable(path)
        if not records:
            path.unlink()
            return
        first_seq = records[0].seq
        state_seq = self._state_seq
        self._advance_past(records)
        self.recovered_records = len(records)
        # A seal writes the state (next chunk = N + 1) before renaming the open chunk into N: an open
        # chunk whose records the state already counts is that chunk N, caught between the two.
        sequence = self.next_chunk - 1 if first_seq < state_seq and self.next_chunk > 0 else self.next_chunk
        sequence = max(sequence, max(self._sealed, default=-1) + 1)
        if repaired:
            self.repaired.add(sequence)
        if self._state_lost:  # S3 may hold chunks numbered past every local one: renumbered once it is read
            self._numbered_blind.add(sequence)
        self._seal_path(path, len(records), sequence)

    def recover_journal(self) -> int:
        """Spool the steps a killed process journaled past its last fsync (`beacon.log.journal`), as a chunk
        of their own, once; the number recovered. Called after `reconcile` (numbered after what S3
        holds, and skipping what it holds), before anything new is appended."""
        if self._journal_recovered:
            return 0
        attempt, experiment, run = self.journal.attempt, self.directory.parent.name, self.directory.name
        # A kill between an fsync and the journal's mark leaves steps journaled and spooled both: recognised by what
        # they are, never by the wall clock's order (chrony may step it back between two steps).
        spooled = self._spooled or set()
        records = []
        for step, wall_time, metrics, pending in self.journal.unspooled():
            if (attempt, step, wall_time) in spooled:
                continue
            records.append(Record(experiment, run, step, metrics, wall_time, attempt=attempt))
            for name in pending:  # a tensor the spool thread had not read when the process was killed
                self.values_lost[name] = self.values_lost.get(name, 0) + 1
        if self.values_lost:
            log.warning(
                "a kill took %s before the spool thread read them (tensors); their steps are kept",
                lost_values(self.values_lost),
            )
        self._spooled = None  # from here on, nothing reads it
        if records:
            with on_spool_disk(self.directory):
                path = self.directory / OPEN
                lines = b"".join(record.to_line(self.next_seq + n) for n, record in enumerate(records))
                with open(path, "ab") as chunk:
                    chunk.write(lines)
                    chunk.flush()
                    os.fsync(chunk.fileno())
                # The journal lets go of them at once: a kill from here on finds them in the open chunk alone, and
                # seals them as that (never journaled and spooled both, which only the newest chunk would tell)
                self.journal.restart(attempt)
                self._advance_past([Record.from_line(line) for line in lines.splitlines()])
                self.durable_seq = max(self.durable_seq, self.next_seq - 1)  # fsync'd above: a mirror may read them
                self.recovered_records += len(records)
                self._open.close()
                self._seal_path(path, len(records), max(self.next_chunk, max(self._sealed, default=-1) + 1))
                self._open = self._open_chunk()
                self._synced_size = 0
        self.journal.restart(attempt)
        self._journal_recovered = True
        return len(records)

    def after_s3(self, last_in_s3: int) -> None:
        """Renumber the chunks recovery numbered without a state file (torn), if S3 holds that number already: they
        follow what S3 holds. Before anything compares pending chunks with S3 (`reconcile`)."""
        for sequence in sorted(self._numbered_blind):
            if sequence > last_in_s3:
                continue
            chunk = self._sealed.pop(sequence)
            number = max(last_in_s3, max(self._sealed, default=-1), self.next_chunk - 1) + 1
            target = self.sealed_path(number)
            with on_spool_disk(self.directory):
                os.rename(chunk.path, target)
                fsync_directory(self.sealed_dir)
            self._sealed[number] = Chunk(number, target, chunk.records)
            if sequence in self.repaired:
                self.repaired.discard(sequence)
                self.repaired.add(number)
            self.next_chunk = max(self.next_chunk, number + 1)
            log.warning("chunk %d, numbered without the spool's state, is chunk %d: S3 holds %d already",
                        sequence, number, sequence)  # fmt: skip
        self._numbered_blind.clear()

    def continue_after(self, *, chunk: int, seq: int, step: int, attempt: int) -> None:
        """Continue after what S3 already holds (a new volume under an existing run)."""
        with self._lock:
            self.next_chunk = max(self.next_chunk, chunk + 1)
            self.next_seq = max(self.next_seq, seq + 1)
            self.last_step = max(self.last_step, step)
            self.last_attempt = max(self.last_attempt, attempt)
            self.durable_step = max(self.durable_step, self.last_step)
            self.durable_seq = max(self.durable_seq, self.next_seq - 1)
            self._write_state()

    def begin_attempt(self) -> int:
        """Start the next attempt of the run: 0 on a fresh run, one more than any attempt whose records
        are here or in S3 otherwise. From here on `last_step` and `durable_step` are this attempt's, so
        a checkpoint waits for its own records, not for those of an attempt that went further."""
        self.recover_journal()  # a caller that skipped `reconcile`: the journal's steps first
        with self._lock:
            attempt = self.last_attempt + 1 if self.last_step >= 0 else 0
            self.last_attempt = attempt
            self.last_step = self.durable_step = -1
            self.journal.restart(attempt)
            return attempt

    # --- writing (the spool thread) -------------------------------------------------------
    def _refuse_if_unusable(self) -> None:
        if self._open.closed and not self._reopen:
            raise SpoolFullError(errno.ENOSPC, f"spool {self.directory}: unusable since the disk filled up")

    def append(self, records: list[Record]) -> None:
        """Assign sequence numbers and queue the records for the open chunk; `sync` writes them and
        makes them durable. No disk I/O here, so a disk error can never lose a record already taken."""
        if not records:
            return
        self._refuse_if_unusable()
        for record in records:
            self._unsynced += record.to_line(self.next_seq)
            self._open_summary.add(record, self.next_seq)
            self.next_seq += 1
            if record.step > self.last_step:
                self.last_step = record.step
        self.open_records += len(records)

    def sync(self) -> None:
        """Write what `append` queued and fsync it. On any error nothing is lost: the same bytes are
        written again, from the last durable size, by the next call. SpoolTakenOverError where another
        process took the directory over: this one stops writing."""
        self._refuse_if_unusable()
        if self.owner is not None:
            self.owner.renew()
        with on_spool_disk(self.directory):
            if self._reopen:
                self._open = self._open_chunk()
                self._synced_size, self._reopen = 0, False
            if not self._unsynced and not self._tail_suspect:
                return
            descriptor = self._open.fileno()
            if self._tail_suspect:
                os.ftruncate(descriptor, self._synced_size)  # a torn or unsynced tail: written again below
            self._tail_suspect = True
            data, written = bytes(self._unsynced), 0
            while written < len(data):
                written += os.write(descriptor, data[written:])
            os.fsync(descriptor)
        self._synced_size += len(self._unsynced)
        self._unsynced.clear()
        self._tail_suspect = False
        self.durable_step = self.last_step
        self.durable_seq = self.next_seq - 1

    def seal(self) -> Chunk | None:
        """Close the open chunk into an immutable, numbered one; None if it is empty. A seal that
        failed half-way is repeated by the next call, under the same chunk number."""
        if self.open_records == 0:
            return None
        self.sync()
        with on_spool_disk(self.directory):
            if self._sealing_as is None:
                self._sealing_as = self.next_chunk
            summary = self._open_summary.of(self._sealing_as)
            chunk = self._seal_path(self.directory / OPEN, self.open_records, self._sealing_as, summary)
            self._sealing_as = None
            self.open_records, self._synced_size = 0, 0
            self._open_summary = RunningSummary()
            self._reopen = True  # set first: a failing close or open is retried by the next sync
            self._open.close()
            self._open = self._open_chunk()
            self._reopen = False
        return chunk

    def _seal_path(self, path: Path, records: int, sequence: int, summary: ChunkSummary | None = None) -> Chunk:
        target = self.sealed_path(sequence)
        with self._lock:
            self.next_chunk = max(self.next_chunk, sequence + 1)
            self._write_state()  # first: the state counts this chunk before it can be acknowledged
        kill_points.hit(kill_points.SEAL_STATE_WRITTEN)
        if path.exists() or not target.exists():  # a repeated seal may have renamed it already
            os.replace(path, target)
        kill_points.hit(kill_points.SEAL_RENAMED)
        fsync_directory(self.sealed_dir)
        chunk = Chunk(sequence, target, records, summary)
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
            self.journal.close()
            try:
                self._open.close()
            except OSError as error:  # a full disk: what it could not flush was never durable
                if error.errno not in FULL:
                    raise
        finally:
            if self.owner is not None:
                self.owner.release()
