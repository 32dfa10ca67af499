"""The steps logged since the spool's last fsync, kept where a SIGKILL cannot take them.

`run.log` writes each step into this file-backed ring on the spool volume (a memory copy: the kernel
keeps a killed process's dirty pages and writes them back), and the spool thread marks each fsync.
A restart, or `beacon.sync`, appends the steps past that mark to the spool before anything else.

Every step is journaled, with its plain numbers; a tensor's value exists only once the spool thread reads it
(reading it here would wait for the device), so the entry names it as pending: a kill before the spool's fsync
loses that value alone, and recovery says which.
Not a defence against a lost machine: the page cache goes with it (the spool's fsync is that defence).

Past the memory bound (`spool_writer.QUEUE_BOUND_VALUES`: the spool cannot keep up, or its volume stalls), a step
goes to the backlog instead: a file beside the ring, written (not mapped) so it costs the process no memory, its
entries numbered in the ring's sequence. The spool thread reads it back in order; the spool's fsync marks both.
"""

from __future__ import annotations

import errno
import heapq
import logging
import marshal
import mmap
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("beacon.journal")

JOURNAL = "journal"
BACKLOG = "backlog"
BACKLOG_SLICE = 16 * 1024 * 1024  # recovery reads the backlog this much at a time
CAPACITY = 8 * 1024 * 1024  # ~40,000 steps of 10 metrics: far more than a spool thread's 0.25 s cycle
MIN_CAPACITY = 16 * 1024
MAGIC = b"BJRNL001"
HEADER = struct.Struct("<8sIqq")  # magic, epoch, durable_through, attempt
DATA_START = 64
ENTRY = struct.Struct("<IIIQ")  # payload length, payload crc32, epoch, entry number
PLAIN = (float, int, bool)  # what is journaled: values `float()` reads back as they were logged
# An entry read back: its number, step, wall time, plain values and the names of the values that were pending.
Entry = tuple[int, int, float, dict[str, float], list[str]]


class Journal:
    def __init__(self, directory: Path, *, capacity: int = CAPACITY) -> None:
        self.path = directory / JOURNAL
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(descriptor).st_size
            if size < DATA_START + ENTRY.size:
                # At most an eighth of what the volume has free: the spool's records come first.
                volume = os.statvfs(directory)
                size = min(capacity, max(MIN_CAPACITY, volume.f_bavail * volume.f_frsize // 8))
                # Allocated, not sparse: a page first touched on a full disk would kill the loop with
                # SIGBUS; taken here, a full disk is an OSError at start (the spool's SpoolFullError).
                os.posix_fallocate(descriptor, 0, size)
            self.capacity = size
            self._map = mmap.mmap(descriptor, self.capacity)
        finally:
            os.close(descriptor)
        magic, self._epoch, self._durable, self.attempt = HEADER.unpack_from(self._map, 0)
        if magic != MAGIC:
            self._epoch, self._durable, self.attempt = 0, 0, 0
        self._number = 0  # the last entry written in this epoch (in the ring or the backlog)
        self._ring_last = 0  # ... in the ring
        self._position = DATA_START
        # Steps not journaled: the ring was full of steps the spool had not yet fsync'd, or one step is larger.
        self.skipped = 0
        self.unreadable = 0  # entries recovery could not read back as numbers
        self.pending = 0  # the values of the last step appended that were not plain numbers (tensors)
        # The backlog: appended by the training thread, read by the spool thread, one lock between them.
        self.backlog_lock = threading.Lock()
        try:
            self._backlog = os.open(directory / BACKLOG, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            self._map.close()
            raise
        self._backlog_written = os.fstat(self._backlog).st_size  # bytes; a killed process's entries stay to recovery
        self._backlog_read = self._backlog_written  # the spool thread's offset (recovery reads from the start)
        self._backlog_last = 0  # the number of the last entry it holds

    # --- the training thread -----------------------------------------------------------------------
    def append(self, step: int, wall_time: float, metrics: dict[str, Any]) -> int:
        """The step's entry number, or 0 when it is not journaled (a full ring, a step larger than it)."""
        for value in metrics.values():
            if type(value) not in PLAIN:  # a tensor, a numpy scalar: the spool thread reads it; named as pending
                plain = {name: v for name, v in metrics.items() if type(v) in PLAIN}
                pending = [n for n in metrics if n not in plain]
                payload = marshal.dumps((step, wall_time, plain, pending))
                self.pending = len(pending)
                break
        else:
            payload = marshal.dumps((step, wall_time, metrics))
            self.pending = 0
        position, size = self._position, ENTRY.size + len(payload)
        if size > self.capacity - DATA_START:  # larger than the whole ring: left to the spool's fsync
            self.skipped += 1
            return 0
        if position + size > self.capacity:
            if self._durable < self._ring_last:  # wrapping now would overwrite steps not yet fsync'd
                self.skipped += 1
                return 0
            position = DATA_START
        number = self._number + 1
        self._map[position + ENTRY.size : position + size] = payload
        ENTRY.pack_into(self._map, position, len(payload), zlib.crc32(payload), self._epoch, number)  # last: commits
        self._number = self._ring_last = number
        self._position = position + size
        return number

    def overflow(self, step: int, wall_time: float, plain: dict[str, float], pending: list[str]) -> int:
        """Append a step to the backlog (the caller holds `backlog_lock`); its entry number. A failed write is cut
        back (the entries before it stay readable) and raised."""
        number = self._number + 1
        payload = marshal.dumps((step, wall_time, plain, pending))
        entry = ENTRY.pack(len(payload), zlib.crc32(payload), self._epoch, number) + payload
        try:
            written = os.write(self._backlog, entry)
            if written != len(entry):
                raise OSError(errno.ENOSPC, f"{written} of {len(entry)} bytes written")
        except OSError:
            os.ftruncate(self._backlog, self._backlog_written)  # if this fails too, the caller stops the run
            raise
        self._backlog_written += len(entry)
        self._number = self._backlog_last = number
        return number

    # --- the spool thread --------------------------------------------------------------------------
    def read_backlog(self, limit: int) -> tuple[list[Entry], int]:
        """The backlog's next entries, about `limit` bytes of them, and the bytes they take (`consumed` moves past
        them). Read outside `backlog_lock`: bytes below the written end never change until the backlog is emptied,
        which waits for this reader to reach that end; the lock guards the offsets alone."""
        with self.backlog_lock:
            start, available = self._backlog_read, self._backlog_written - self._backlog_read
        if not available:
            return [], 0
        data = self._whole_entries(start, min(available, max(limit, ENTRY.size)), available)
        entries, used = self._entries(data)
        if not used:  # never written so by `overflow`: a damaged disk. Never a spool thread stuck on it
            length = ENTRY.unpack_from(data)[0] if len(data) >= ENTRY.size else available
            used = ENTRY.size + length if 0 < ENTRY.size + length <= available else available
            log.error("the journal's backlog at byte %d does not read: %d bytes of it set aside", start, used)
            self.unreadable += 1
        return entries, used

    def consumed(self, used: int) -> bool:
        """Move the spool thread's offset past `used` bytes (the caller holds `backlog_lock`); whether it has read
        everything written so far."""
        self._backlog_read += used
        return self._backlog_read == self._backlog_written

    def reclaim_backlog(self) -> None:
        """Empty the backlog once every entry in it is read and fsync'd in the spool (after `durable_through`)."""
        with self.backlog_lock:
            written = self._backlog_written
            if written and self._backlog_read == written and self._durable >= self._backlog_last:
                os.ftruncate(self._backlog, 0)
                self._backlog_written = self._backlog_read = 0

    def _whole_entries(self, start: int, size: int, available: int) -> bytes:
        """`size` bytes from `start`, or more when they end inside the first entry: one entry is always read whole."""
        data = os.pread(self._backlog, size, start)
        if len(data) >= ENTRY.size and (whole := ENTRY.size + ENTRY.unpack_from(data)[0]) > len(data):
            data = os.pread(self._backlog, min(available, whole), start)
        return data

    def _entries(self, data: bytes) -> tuple[list[Entry], int]:
        """The entries of this epoch at the start of `data`, and the bytes they take: up to the first one cut (by a
        read's limit, or torn by a kill: never returned to the caller of `log`) or of an earlier epoch."""
        entries: list[Entry] = []
        position = 0
        while position + ENTRY.size <= len(data):
            length, crc, epoch, number = ENTRY.unpack_from(data, position)
            end = position + ENTRY.size + length
            payload = data[position + ENTRY.size : end]
            if length == 0 or end > len(data) or epoch != self._epoch or number == 0 or zlib.crc32(payload) != crc:
                break
            if (entry := self._read_entry(number, payload)) is not None:
                entries.append(entry)
            position = end
        return entries, position

    def _read_entry(self, number: int, payload: bytes) -> Entry | None:
        try:
            step, wall_time, metrics, *pending = marshal.loads(payload)  # a release before: no pending
            names = [str(n) for n in (pending or [[]])[0]]
            numbers: dict[str, float] = {}
            for name, value in metrics.items():
                try:
                    numbers[str(name)] = float(value)
                except (ValueError, TypeError, OverflowError):  # an int past a float's range: this value alone
                    names.append(str(name))
            return number, int(step), float(wall_time), numbers, names
        except (ValueError, TypeError, OverflowError, EOFError, AttributeError):
            self.unreadable += 1  # never blocks a start: the spool thread would have refused it too
            return None

    def durable_through(self, number: int) -> None:
        """Every entry through `number` is in the spool, fsync'd."""
        if number > self._durable:
            self._durable = number
            HEADER.pack_into(self._map, 0, MAGIC, self._epoch, number, self.attempt)

    # --- start-up: the spool, before anything is appended ----------------------------------------------
    def unspooled(self) -> Iterator[tuple[int, float, dict[str, float], list[str]]]:
        """The steps a killed process journaled past its spool's last fsync, in the order logged (the ring's and the
        backlog's, by entry number): each with its plain values and the names of the values that were pending
        (tensors the spool thread had not read). The backlog is read a slice at a time: it may hold many."""
        ring: list[Entry] = []
        position, previous = DATA_START, 0
        while position + ENTRY.size <= self.capacity:
            length, crc, epoch, number = ENTRY.unpack_from(self._map, position)
            end = position + ENTRY.size + length
            if length == 0 or end > self.capacity or epoch != self._epoch or number == 0:
                break
            if number <= previous:
                break  # the chain ends: what follows is older, already fsync'd (the backlog took the numbers between)
            payload = bytes(self._map[position + ENTRY.size : end])
            if zlib.crc32(payload) != crc:
                break  # torn by a kill: never returned to the caller of `log`
            if number > self._durable and (entry := self._read_entry(number, payload)) is not None:
                ring.append(entry)
            position, previous = end, number
        backlog = (entry for entry in self._backlog_from_start() if entry[0] > self._durable)
        for entry in heapq.merge(ring, backlog, key=lambda entry: entry[0]):
            yield entry[1:]

    def _backlog_from_start(self) -> Iterator[Entry]:
        size, offset = os.fstat(self._backlog).st_size, 0
        while offset < size:
            entries, used = self._entries(self._whole_entries(offset, min(BACKLOG_SLICE, size - offset), size - offset))
            yield from entries
            if not used:
                return  # torn by the kill, or an earlier epoch's: the end
            offset += used

    def restart(self, attempt: int) -> None:
        """A new epoch for `attempt`: entries of the old one are never read again."""
        self._epoch = (self._epoch + 1) % 2**32
        self._durable, self._number, self._position, self.attempt = 0, 0, DATA_START, attempt
        ENTRY.pack_into(self._map, DATA_START, 0, 0, 0, 0)
        HEADER.pack_into(self._map, 0, MAGIC, self._epoch, 0, attempt)
        with self.backlog_lock:
            os.ftruncate(self._backlog, 0)
            self._backlog_written = self._backlog_read = self._backlog_last = self._ring_last = 0

    def close(self) -> None:
        self._map.close()
        os.close(self._backlog)
