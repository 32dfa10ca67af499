"""One owner per spool directory: a second writer is refused at start, naming the first.

A replacement pod may start a run while the old pod, cut off from the API server, still writes the same
`<spool>/<experiment>/<run>` on a shared volume: two writers renumber each other's chunks and each loses
records. The owner writes `owner.json` (host, pod, pid, started, renewed) and renews it while it writes;
a claim refuses a live owner, takes over a dead or expired one, and the old owner, at its next renewal,
finds it was taken over and stops (told, never a silent gap). `owner.lock`, flocked, makes each read and
write of the record one step; on EFS that lock is NFSv4's (the real-account check in docs/proven.md).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from beacon.files import write_atomically

OWNER = "owner.json"
LOCK = "owner.lock"
# An owner that has not renewed for this long is gone (its node lost, its process frozen): taken over.
OWNER_LEASE_S = 60.0
OWNER_RENEW_S = 10.0


class SpoolOwnedError(Exception):
    """A live process owns the spool directory: one line naming the run and the owner."""


class SpoolTakenOverError(Exception):
    """Another process took the spool directory over (this one's lease had expired): this one stops writing."""


@dataclass(frozen=True)
class OwnerRecord:
    host: str
    pod: str
    pid: int
    started: float
    renewed: float
    released_at: float | None = None

    def same_process(self, other: OwnerRecord) -> bool:
        return (self.host, self.pid, self.started) == (other.host, other.pid, other.started)

    def describe(self, now: float) -> str:
        pod = f"pod {self.pod}, " if self.pod and self.pod != self.host else ""
        return f"host {self.host}, {pod}pid {self.pid}, renewed {max(0.0, now - self.renewed):.0f} s ago"

    @classmethod
    def parse(cls, body: bytes) -> OwnerRecord | None:
        """The record, or None where it is torn or not one (an owner that died mid-write owns nothing)."""
        try:
            value: Any = json.loads(body)
            released = value.get("released_at")
            return cls(
                host=str(value["host"]),
                pod=str(value.get("pod", "")),
                pid=int(value["pid"]),
                started=float(value["started"]),
                renewed=float(value["renewed"]),
                released_at=None if released is None else float(released),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_owner(directory: Path) -> OwnerRecord | None:
    try:
        return OwnerRecord.parse((directory / OWNER).read_bytes())
    except FileNotFoundError:
        return None


class SpoolOwner:
    """This process's ownership of one spool directory: `claim`, then `renew` as it writes, `release` at the end."""

    def __init__(self, directory: Path, record: OwnerRecord, clock: Callable[[], float]) -> None:
        self.directory = directory
        self.record = record
        self._clock = clock

    @classmethod
    def claim(
        cls,
        directory: Path,
        *,
        run: str,
        clock: Callable[[], float] = time.time,
        lease_s: float = OWNER_LEASE_S,
        pid: int | None = None,
    ) -> SpoolOwner:
        """Own `directory`, or raise SpoolOwnedError naming the live owner (host, pod, pid, age)."""
        directory.mkdir(parents=True, exist_ok=True)
        now = clock()
        host = socket.gethostname()
        mine = OwnerRecord(
            host,
            os.environ.get("BEACON_POD_NAME", os.environ.get("POD_NAME", host)),
            os.getpid() if pid is None else pid,
            now,
            now,
        )
        with _locked(directory):
            current = read_owner(directory)
            if current is not None and _is_live(current, mine, now, lease_s):
                raise SpoolOwnedError(
                    f"run {run!r}: spool {directory} is owned by a live writer ({current.describe(now)}); "
                    f"stop it, or wait {lease_s:.0f} s after it stopped renewing"
                )
            _write(directory, mine)
        return cls(directory, mine, clock)

    def renew(self) -> None:
        """Renew the lease (at most every OWNER_RENEW_S); SpoolTakenOverError where another process owns it now.
        A renewal that cannot be written (a full volume) is tried again later: the lease outlasts it."""
        now = self._clock()
        if now - self.record.renewed < OWNER_RENEW_S:
            return
        try:
            with _locked(self.directory):
                current = read_owner(self.directory)
                if current is not None and not current.same_process(self.record):
                    raise SpoolTakenOverError(
                        f"spool {self.directory}: taken over by {current.describe(now)} after this process's "
                        f"lease expired; it stops writing (what it spooled stays for the new owner)"
                    )
                renewed = replace(self.record, renewed=now)
                _write(self.directory, renewed)
                self.record = renewed
        except OSError:
            pass

    def release(self) -> None:
        """Mark the directory free (a `beacon.sync` or the next start need not wait). Never raises: on a full
        volume the record is removed instead, which frees it too."""
        try:
            with _locked(self.directory):
                current = read_owner(self.directory)
                if current is not None and not current.same_process(self.record):
                    return  # taken over: the new owner's record stays
                released = replace(self.record, released_at=self._clock())
                try:
                    _write(self.directory, released)
                except OSError as error:
                    if error.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    (self.directory / OWNER).unlink(missing_ok=True)
        except OSError:
            pass


def _is_live(current: OwnerRecord, mine: OwnerRecord, now: float, lease_s: float) -> bool:
    if current.released_at is not None:
        return False
    if current.host == mine.host and (current.pid == mine.pid or not _process_alive(current.pid)):
        return False  # this very process again, or one that died on this host: nothing writes
    return now - current.renewed < lease_s


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    descriptor = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _write(directory: Path, record: OwnerRecord) -> None:
    write_atomically(directory / OWNER, json.dumps(asdict(record)).encode())
