"""One thread per tracker, replaying what the spool made durable, behind a durable cursor.

The worker reads records in sequence order from what is fsync'd: the spool's open chunk (as soon as
a record is durable, so the lag is the spool's 0.25 s cycle plus one request, not a chunk seal),
its sealed chunks, and for a chunk the uploader already delivered and deleted, S3. The spool is
never held back for a tracker: a long outage costs the tracker its lag, never the disk.

After each successful send the cursor (the last sequence number mirrored, `mirrors/<tracker>.json`
beside the spool) is written atomically. At start the tracker is asked what it holds: a crash
between a send and the cursor write leaves the tracker ahead of the cursor, and the worker resumes
after what the tracker holds, so nothing is sent twice; nothing is skipped, since a record is taken
only when its sequence number follows the last one mirrored. Network calls happen only on this
thread: never on the training thread, nor on the spool, uploader or heartbeat threads.
"""

from __future__ import annotations

import collections
import json
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from beacon import contract, kill_points
from beacon.contract import FinalState, Record
from beacon.files import write_atomically
from beacon.log.spool import OPEN, Spool
from beacon.sinks.mirrors import Mirror, RunInfo

log = logging.getLogger("beacon.mirrors")

MIRRORS_DIR = "mirrors"  # in the run's spool directory: a cursor per tracker, W&B's offline files
POLL_S = 0.25  # the spool's own cycle; a wake-up on each durable batch comes sooner
BATCH_RECORDS = 500
MAX_BACKOFF_S = 30.0
DRAIN_BACKOFF_S = 1.0  # while the run finishes, its budget is short: retry often
CACHED_CHUNKS = 8
LAGS_KEPT = 4096


# --- reading what is durable ----------------------------------------------------------------------
def s3_chunks(s3: Any, bucket: str, experiment: str, run: str) -> Callable[[int], bytes | None]:
    """Chunk `n` of the run as S3 holds it, or None when S3 holds no such chunk."""

    def fetch(number: int) -> bytes | None:
        try:
            body: bytes = s3.get_object(Bucket=bucket, Key=contract.events_key(experiment, run, number))["Body"].read()
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise
        return body

    return fetch


class SpoolReader:
    """The run's durable records from a sequence number on, wherever they are now.

    Records only move one way (open chunk → sealed chunk → S3, deleted locally once S3 has it), and
    are read in that order, so a record moving meanwhile is read twice at worst, never missed; the
    contiguity of sequence numbers decides what is returned.
    """

    def __init__(self, spool: Spool, fetch: Callable[[int], bytes | None]) -> None:
        self.spool = spool
        self._fetch = fetch
        self._chunk: int | None = None  # the lowest chunk that may hold the next record
        self._cache: collections.OrderedDict[int, list[Record]] = collections.OrderedDict()

    def read(self, first: int, limit: int) -> list[Record]:
        """At most `limit` records with consecutive sequence numbers from `first`, all durable."""
        durable = self.spool.durable_seq
        if first > durable:
            return []
        number = self._start(first)
        found: list[Record] = []
        want = first
        while len(found) < limit:
            top = self.spool.next_chunk  # chunks below it are sealed (or being renamed right now)
            records = self._sealed(number) if number < top else self._open_chunk()
            if records is None:  # mid-seal, or a number no chunk has: the sequence numbers decide
                if number + 1 < top:
                    number += 1
                    continue
                break
            for record in records:
                if record.seq < want:
                    continue
                if record.seq != want or record.seq > durable or len(found) == limit:
                    return found
                found.append(record)
                want += 1
            if number >= top:
                break
            number += 1
        return found

    def _start(self, first: int) -> int:
        """The chunk to read from: found once, then moved past chunks wholly before `first`."""
        if self._chunk is None:
            self._chunk = self._find(first)
        while self._chunk < self.spool.next_chunk:
            records = self._sealed(self._chunk)
            if records is None:
                following = self._sealed(self._chunk + 1) if self._chunk + 1 < self.spool.next_chunk else None
                if not following or following[0].seq > first:
                    break
            elif records and records[-1].seq >= first:
                break
            self._cache.pop(self._chunk, None)
            self._chunk += 1
        return self._chunk

    def _find(self, first: int) -> int:
        """The newest chunk starting at or before `first`, looking back from the open one."""
        top = self.spool.next_chunk
        opened = self._open_chunk()
        if first <= 0 or (opened and opened[0].seq <= first):
            return 0 if first <= 0 else top
        for number in range(top - 1, -1, -1):
            records = self._sealed(number)
            if records and records[0].seq <= first:
                return number
        return 0

    def _sealed(self, number: int) -> list[Record] | None:
        if number in self._cache:
            return self._cache[number]
        try:
            body: bytes | None = self.spool.sealed_path(number).read_bytes()
        except FileNotFoundError:  # delivered and deleted: S3 has it
            body = self._fetch(number)
        if body is None:
            return None
        records = contract.records_of(body)
        self._cache[number] = records
        while len(self._cache) > CACHED_CHUNKS:
            self._cache.popitem(last=False)
        return records

    def _open_chunk(self) -> list[Record]:
        try:
            data = (self.spool.directory / OPEN).read_bytes()
        except FileNotFoundError:
            return []
        return contract.records_of(data[: data.rfind(b"\n") + 1])  # a line being written is not a record yet


# --- the cursor ------------------------------------------------------------------------------------
class Cursor:
    """The last sequence number a tracker holds, as this spool knows it; written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = -1
        self.final_state: str | None = None
        if path.exists():
            try:
                saved = json.loads(path.read_bytes())
                self.seq = int(saved.get("seq", -1))
                self.final_state = saved.get("final_state")
            except (ValueError, TypeError, AttributeError) as error:  # torn by a lost machine
                # The tracker is asked what it holds at start and the worker resumes after that; one that cannot
                # say (W&B offline) is sent the run again from its start
                log.warning("mirror cursor %s unreadable (%s): resuming after what the tracker says it holds", path,
                            type(error).__name__)  # fmt: skip
                self.seq, self.final_state = -1, None

    def save(self, seq: int, final_state: str | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, json.dumps({"seq": seq, "final_state": final_state}).encode())
        self.seq, self.final_state = seq, final_state


# --- the worker ------------------------------------------------------------------------------------
@dataclass
class MirrorReport:
    """What one mirror did in this process."""

    name: str
    resumed_after: int = -1  # the last sequence number the tracker held when this process began
    sent: int = 0  # records sent by this process
    failures: int = 0  # failed opens and sends (each retried)
    behind: int = 0  # durable records not mirrored when `finish` returned (the next start sends them)
    closed: bool = False  # the tracker has the final state
    lags_s: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=LAGS_KEPT))

    def lag_summary(self) -> dict[str, float]:
        """Seconds from `run.log` to the tracker holding the point (the oldest of each batch)."""
        lags = sorted(self.lags_s)
        if not lags:
            return {}
        return {"median": statistics.median(lags), "p95": lags[int(0.95 * (len(lags) - 1))], "max": lags[-1]}


class MirrorWorker:
    def __init__(
        self,
        mirror: Mirror,
        *,
        run: RunInfo,
        spool: Spool,
        fetch: Callable[[int], bytes | None],
        wake: threading.Event,
        spool_finished: Callable[[], bool],
    ) -> None:
        self.mirror = mirror
        self.run = run
        self.spool = spool
        self.reader = SpoolReader(spool, fetch)
        self.cursor = Cursor(run.directory / f"{mirror.name}.json")
        self.report = MirrorReport(mirror.name, resumed_after=self.cursor.seq)
        self._wake = wake
        self._spool_finished = spool_finished
        self._final: FinalState | None = None
        self._hurry = threading.Event()  # the run is finishing: a long outage backoff ends now
        self._give_up = threading.Event()  # finish's share of the budget is spent
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"beacon-mirror-{mirror.name}", daemon=True)

    # --- the training thread's side ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def finishing(self, state: FinalState) -> None:
        """The loop is over: send what is left, then the final state. Returns at once."""
        self._final = state
        self._hurry.set()
        self._wake.set()

    def join(self, timeout: float) -> MirrorReport:
        """Wait up to `timeout` s for the mirror to finish; what it has not sent stays behind the cursor."""
        self._thread.join(timeout=max(0.0, timeout))
        if self._thread.is_alive():
            self._give_up.set()
            self._hurry.set()
            log.warning(
                "%s mirror stopped %d records behind (the next start of the run sends them)",
                self.mirror.name,
                self.behind(),
            )
        self.report.behind = self.behind()
        return self.report

    def behind(self) -> int:
        return max(0, self.spool.durable_seq - self.cursor.seq)

    def wait_mirrored(self, seq: int, timeout: float) -> bool:
        """Block (never the loop's business in production; tests and the bench) until `seq` is mirrored."""
        deadline = time.monotonic() + timeout
        with self._progress:
            while self.cursor.seq < seq:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._progress.wait(remaining)
        return True

    # --- the mirror's thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        opened = False
        backoff = 1.0
        while not self._give_up.is_set():
            self._wake.clear()  # before reading: a batch made durable meanwhile sets it again
            try:
                if not opened:
                    self._open()
                    opened = True
                if self._send_next():
                    backoff = 1.0
                    continue
                if self._final is not None and self._spool_finished() and self.behind() == 0:
                    self.mirror.close(self._final)
                    self.cursor.save(self.cursor.seq, self._final.value)
                    self.report.closed = True
                    return
                backoff = 1.0
            except Exception as error:  # a tracker outage, or any error of its client: retry later
                self.report.failures += 1
                first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
                wait = backoff if self._final is None else min(backoff, DRAIN_BACKOFF_S)
                log.warning("%s mirror: %s; retrying in %.0f s", self.mirror.name, first_line[:300], wait)
                # Before the run finishes, `finishing` cuts a long wait short; after, only giving up does.
                (self._hurry if self._final is None else self._give_up).wait(wait)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self._wake.wait(POLL_S)

    def _open(self) -> None:
        held = self.mirror.open(self.run)
        if held is not None and held != self.cursor.seq:
            log.info(
                "%s holds records through seq %d, the cursor says %d: continuing after %d",
                self.mirror.name,
                held,
                self.cursor.seq,
                held,
            )
            self._advance(held)
        self.report.resumed_after = self.cursor.seq
        if self.cursor.seq >= 0 and (last := self.reader.read(self.cursor.seq, 1)):
            self.mirror.held_through(last[0])

    def _send_next(self) -> bool:
        records = self.reader.read(self.cursor.seq + 1, BATCH_RECORDS)
        if not records:
            return False
        self.mirror.send(records)
        kill_points.hit(kill_points.MIRROR_SENT_NOT_RECORDED)
        self._advance(records[-1].seq)
        self.report.sent += len(records)
        self.report.lags_s.append(time.time() - records[0].wall_time)
        return True

    def _advance(self, seq: int) -> None:
        self.cursor.save(seq)
        with self._progress:
            self._progress.notify_all()


class Mirrors:
    """Rank 0's mirror workers, started and finished together."""

    def __init__(self, workers: list[MirrorWorker]) -> None:
        self.workers = workers

    def __iter__(self) -> Iterator[MirrorWorker]:
        return iter(self.workers)

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def finishing(self, state: FinalState) -> None:
        for worker in self.workers:
            worker.finishing(state)

    def join(self, until: float) -> dict[str, MirrorReport]:
        """Wait for every worker until the monotonic time `until` at most."""
        return {w.mirror.name: w.join(until - time.monotonic()) for w in self.workers}
