"""Every rank's progress and, when it stops, its stacks: the evidence that names the rank.

When one rank of a distributed job hangs, every other rank blocks in its next collective and rank 0's
heartbeat goes on; only a per-rank view says which rank stopped. Each rank writes a small document
(`rank-<r>.json`: last dispatched step, phase, wall time, pod, node, instance) under the run on the
spool volume, from a thread of its own: never the training thread (which only stores the step it
dispatched), never the liveness thread (the shared volume is a network file system, and liveness
stays pod-local). Rank 0's heartbeat reads the documents for the cross-rank view.

Stacks are dumped with `faulthandler` into `stacks-rank-<r>.txt` beside it:
- by this thread, once per stop, when the rank's progress is older than `stall_dump_after`;
- by faulthandler's own watchdog (a C thread, no GIL needed) when this thread itself could not run
  for that long: a C call holding the GIL is then the hang, and the dump shows where;
- on SIGTERM, before the drain (`dump_stacks`), so an eviction keeps the evidence; and by faulthandler's own
  handler the moment it arrives (`dump_at_signal`, into `signal-stacks-rank-<r>.txt`), in C: a main thread
  blocked in C (a collective's wait, a call that retries on EINTR) runs no Python handler until it returns.
Each dump also writes the rank's flight recorder (`flight-recorder-rank-<r>`, `beacon.evidence.flight_recorder`),
from this thread: never the training thread, which only asks for it on SIGTERM.
py-spy would add native frames but needs ptrace (SYS_PTRACE in the pod); the Python frames name the
collective or the data loader a rank waits in, and the nccl flight recorder covers what nccl does.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from beacon import contract
from beacon.contract import Phase
from beacon.contract.pace import SLOW_REFRESH_BEATS, RankPace, run_stall_after
from beacon.contract.rank_evidence import (
    EARLIER_ATTEMPT_SLACK_S,
    SIGNAL_STACKS_PREFIX,
    STALL_DUMP,
    RankProgress,
    flight_recorder_name,
    rank_document_name,
    rank_of_file,
    signal_dump_header,
    signal_stacks_name,
    stacks_name,
    took_signal,
)
from beacon.create_only import Written, put_create_only
from beacon.evidence.flight_recorder import dump_flight_recorder
from beacon.evidence.progress import ProgressClock

log = logging.getLogger("beacon.ranks")

RANK_SIGNAL_INTERVAL_S = 5.0  # how often each rank rewrites its progress document, at most
PHASE_FRESH_S = 60.0  # a document older than this no longer says which phase its rank is in


def rank_signal_interval(heartbeat_interval: float) -> float:
    """Seconds between a rank's passes: it rewrites its document, and dumps its stacks once its progress
    is older than `stall_dump_after`, so every stalled rank has dumped within one pass after that."""
    return min(heartbeat_interval, RANK_SIGNAL_INTERVAL_S)


_FORGOTTEN_IN_CHILDREN: set[int] = set()


def _forget_in_forked_children(signum: int) -> None:
    """A process forked from a rank (a DataLoader worker, which torchrun's teardown signals too) does not dump
    into the rank's signal stacks file: faulthandler's handler there goes back to the one it chained to."""
    if signum not in _FORGOTTEN_IN_CHILDREN:
        _FORGOTTEN_IN_CHILDREN.add(signum)
        os.register_at_fork(after_in_child=lambda: faulthandler.unregister(signum))


@dataclass(frozen=True)
class Placement:
    """Where a rank runs, from the Job's downward API environment (empty off Kubernetes)."""

    pod: str
    node: str
    instance: str

    @classmethod
    def from_environment(cls) -> Placement:
        return cls(
            pod=os.environ.get("BEACON_POD_NAME", os.environ.get("HOSTNAME", "")),
            node=os.environ.get("BEACON_NODE_NAME", ""),
            instance=os.environ.get("BEACON_INSTANCE_TYPE", ""),
        )


def read_ranks(directory: Path, *, since: float = 0.0) -> list[RankProgress]:
    """Every rank's latest document under `directory` (a run's `ranks/`), in rank order; with `since` (wall
    time), only those written since (this attempt's, to a reader that started at `since` + the slack)."""
    found = []
    for path in sorted(directory.glob("rank-*.json")):
        try:
            document = RankProgress.from_document(path.read_bytes())
        except (OSError, ValueError, TypeError):  # being replaced, or torn by a dead node: the next read
            continue
        if document.wall_time >= since:
            found.append(document)
    return found


def this_attempts_documents_since() -> float:
    """For a reader starting now: the wall time before which a document is an earlier attempt's."""
    return time.time() - EARLIER_ATTEMPT_SLACK_S


@dataclass(frozen=True)
class CrossRankView:
    """Rank 0's view of all ranks, for its heartbeat: who is slowest, and how far apart they are."""

    ranks: int
    slowest_rank: int
    slowest_progress_age: float
    step_spread: int

    @classmethod
    def of(cls, ranks: list[RankProgress], now: float) -> CrossRankView | None:
        if not ranks:
            return None
        # A document that stopped being rewritten ages too: a dead or frozen rank is the slowest.
        ages = {r.rank: r.progress_age + max(0.0, now - r.wall_time) for r in ranks}
        slowest = max(ages, key=lambda rank: ages[rank])
        steps = [r.step for r in ranks]
        return cls(len(ranks), slowest, ages[slowest], max(steps) - min(steps))


def stall_threshold(stall_dump_after: float, heartbeat_interval: float, ranks: Iterable[RankProgress] = ()) -> float:
    """How old a rank's progress is before its stall is evidence: the ranks dump their stacks at the run's stall
    threshold (`stall_dump_after`, or sooner as their documents state: `contract.pace.run_stall_after`), each within
    one pass of its signal thread."""
    stall_after = run_stall_after((r.stall_after_s for r in ranks), stall_dump_after)
    return stall_after + rank_signal_interval(heartbeat_interval)


def a_rank_stalled(
    ranks: list[RankProgress], now: float, *, threshold: float, in_own_phase: bool, phase_limit: float
) -> bool:
    """The one stall rule, for rank 0 and the node leaders: some rank's progress (its document's, aged since it was
    written: a rank that stops rewriting ages) is past `threshold`, while no rank works in a named phase within its
    limit (a 150 s checkpoint), as its fresh document says or, for the caller itself, its own clock
    (`in_own_phase`: rank 0's follows the other ranks' phases too). Another rank's setup is work for `phase_limit`
    (the caller's) at most: one that never leaves it (hung after its first collective, before its first step) is
    stalled there."""
    view = CrossRankView.of(ranks, now)
    if view is None or in_own_phase or view.slowest_progress_age < threshold:
        return False

    def working(r: RankProgress) -> bool:
        if not r.working_in_phase(now) or r.ended or now - r.wall_time >= PHASE_FRESH_S:
            return False
        return r.phase != Phase.SETUP or r.phase_seconds + max(0.0, now - r.wall_time) < phase_limit

    return not any(working(r) for r in ranks)


def pace_fields(pace: RankPace) -> dict[str, Any]:
    """A rank's pace as its document's fields (JSON has no NaN)."""
    return {
        "pace_steps": pace.steps,
        "pace_window_s": pace.window_s,
        "pace_step_s": pace.step_s if math.isfinite(pace.step_s) else 0.0,
        "pace_wait_s": pace.wait_s if math.isfinite(pace.wait_s) else -1.0,
    }


class RankSignal:
    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        local_rank: int,
        world_size: int,
        progress: ProgressClock,
        interval: float,
        stall_dump_after: float,
        placement: Placement | None = None,
        node_rank: int = -1,
    ) -> None:
        self.directory = directory
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.node_rank = node_rank
        self.progress = progress
        self.interval = interval
        self.stall_dump_after = stall_dump_after
        self.placement = placement or Placement.from_environment()
        self.document = directory / rank_document_name(rank)
        self.stacks = directory / stacks_name(rank)
        self.flight_recorder = directory / flight_recorder_name(rank)
        self.dumps = 0
        # The step a flight-recorder dump was asked at, and the step of the last one written.
        self._recorder_asked: int | None = None
        self._recorder_for: int | None = None
        self._wake = threading.Event()  # a SIGTERM's dump is written now, not at the next pass
        self._dumped_for: int | None = None  # the step whose stop was dumped already
        self._stacks_file: IO[str] | None = None
        self.signal_stacks = directory / signal_stacks_name(rank)
        self._signal_file: IO[str] | None = None
        self._signals_caught: list[int] = []
        self._pid = os.getpid()  # a forked child (a DataLoader worker) inherits this object and its handlers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beacon-rank-signal", daemon=True)
        self._warned = False

    def start(self) -> RankSignal:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._stacks_file = open(self.stacks, "a")  # noqa: SIM115 - kept open for faulthandler's C writer
        except OSError as error:
            log.warning("rank %d: no progress signal under %s: %s", self.rank, self.directory, error)
            return self
        self._arm_watchdog()
        self._thread.start()
        return self

    def _arm_watchdog(self) -> None:
        if self._stacks_file is not None:
            # Re-armed by every pass of the loop: it fires only if this thread could not run that long.
            faulthandler.dump_traceback_later(
                self.stall_dump_after + self.interval, repeat=False, file=self._stacks_file, exit=False
            )

    def _loop(self) -> None:
        next_pass = time.monotonic() + self.interval
        while not self._stop.is_set():
            self._wake.wait(max(0.0, next_pass - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            if time.monotonic() < next_pass:  # woken for a flight-recorder dump only: passes keep their pace
                self._keep_flight_recorder()
                continue
            next_pass = time.monotonic() + self.interval
            self._arm_watchdog()
            self.write()
            step, age = self.progress.dispatched_step, self.progress.progress_age()
            if age >= self.stall_after() and self._dumped_for != step and not self.progress.in_phase_work():
                self._dumped_for = step
                self.dump_stacks(f"{STALL_DUMP} {age:.0f} s after step {step}")
            self._keep_flight_recorder()
        self._keep_flight_recorder()  # one a SIGTERM asked for just before the stop

    def stall_after(self) -> float:
        """When this rank's progress is a stall: `stall_dump_after`, or sooner once its pace gives a shorter
        threshold (`contract.pace`: 30 s at 1 s steps)."""
        return self.progress.stall_after(self.stall_dump_after)

    def _keep_flight_recorder(self) -> None:
        asked, self._recorder_asked = self._recorder_asked, None
        # A rank still at the step of its last dump keeps that one: taken while the ranks waited on each
        # other, it shows who did not join; a SIGTERM may just have released them (and mixing dumps from
        # before and after would show mismatches that never were).
        if asked is not None and asked != self._recorder_for and dump_flight_recorder(self.flight_recorder):
            self._recorder_for = asked

    def write(self, *, ended: str = "") -> None:
        now = time.time()
        age = self.progress.progress_age()
        body = RankProgress(
            rank=self.rank,
            local_rank=self.local_rank,
            world_size=self.world_size,
            step=self.progress.dispatched_step,
            phase=self.progress.own_phase_name(),
            progress_age=age,
            wall_time=now,
            last_step_wall_time=now - age,
            pid=os.getpid(),
            stacks_dumped=self.dumps,
            ended=ended,
            node_rank=self.node_rank,
            phase_seconds=self.progress.own_phase_seconds(),
            phase_limit=self.progress.phase_limit,
            **asdict(self.placement),
            **pace_fields(self.progress.pace.of_rank(self.rank)),
            stall_after_s=self.stall_after(),
        )
        temporary = self.document.with_name(f".{self.document.name}.tmp")
        try:
            temporary.write_text(json.dumps(asdict(body)))
            os.replace(temporary, self.document)
        except OSError as error:
            if not self._warned:
                log.warning("rank %d: cannot write %s: %s", self.rank, self.document, error)
                self._warned = True

    def dump_stacks(self, reason: str) -> None:
        """Every thread's Python stack into this rank's stacks file, headed by `reason`."""
        if self._stacks_file is None or os.getpid() != self._pid:  # a forked DataLoader worker's signal: not the rank's
            return
        try:
            self._stacks_file.write(
                f"--- rank {self.rank} pid {os.getpid()} at {time.time():.3f}, step "
                f"{self.progress.dispatched_step}: {reason}\n"
            )
            self._stacks_file.flush()
            faulthandler.dump_traceback(file=self._stacks_file, all_threads=True)
            self._stacks_file.flush()
            self.dumps += 1
        except (OSError, ValueError) as error:
            log.warning("rank %d: cannot dump stacks to %s: %s", self.rank, self.stacks, error)
        self._recorder_asked = self.progress.dispatched_step
        self._wake.set()  # this thread writes it: a flight recorder's dump is no signal handler's work

    def dump_at_signal(self, signum: int) -> None:
        """faulthandler's own handler for `signum`, before the Python one it chains to (install that first): every
        thread's stack into `signal-stacks-rank-<r>.txt` the moment the signal arrives. Python's handler runs only
        once the main thread is back in the interpreter, and one blocked in C (a collective's wait, a call that
        retries on EINTR) may never be: the stack that says where it hung is this one."""
        if self._stacks_file is None:
            return
        try:
            if self._signal_file is None:  # this process's alone: an earlier attempt's dump would read as this one's
                self._signal_file = open(self.signal_stacks, "w")  # noqa: SIM115 - kept open for faulthandler's C writer
                self._signal_file.write(signal_dump_header(self.rank, os.getpid()))
                self._signal_file.flush()
            faulthandler.register(signum, file=self._signal_file, all_threads=True, chain=True)
            self._signals_caught.append(signum)
            _forget_in_forked_children(signum)
        except (OSError, RuntimeError, ValueError) as error:
            log.warning("rank %d: no stack dump at signal %d: %s", self.rank, signum, error)

    def stop(self, *, ended: str = "stopped") -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=self.interval + 1)
        faulthandler.cancel_dump_traceback_later()
        for signum in self._signals_caught:  # the Python handler it chained to is back, for StopSignals to restore
            faulthandler.unregister(signum)
        self._signals_caught.clear()
        if self._signal_file is not None:
            self._signal_file.close()
            self._signal_file = None
        if self._stacks_file is not None:
            self.write(ended=ended)  # the last word: where and how this rank ended
            self._stacks_file.close()
            self._stacks_file = None


class PhaseFollower:
    """Rank 0's stall clock follows the other ranks' phases. While rank 3 writes a 150 s checkpoint,
    rank 0 waits in the next collective and its own progress stops: without this, its ProgressAge
    would cross the stall threshold on a healthy job. Each other rank's named phase, as its document
    shows it, is entered on rank 0's clock (as `rank 3 checkpoint`) until the document says it ended."""

    def __init__(self, progress: ProgressClock, *, own_rank: int = 0, fresh_for: float = PHASE_FRESH_S) -> None:
        self.progress = progress
        self.own_rank = own_rank
        self.fresh_for = fresh_for  # a document older than this no longer says what its rank does
        self.followed: dict[int, str] = {}

    def follow(self, ranks: list[RankProgress], now: float) -> None:
        current = {
            r.rank: f"rank {r.rank} {r.phase}"
            for r in ranks
            if r.rank != self.own_rank
            and r.working_in_phase(now)
            and not r.ended
            and now - r.wall_time < self.fresh_for
        }
        for rank, name in list(self.followed.items()):
            if current.get(rank) != name:
                self.progress.leave(name)
                del self.followed[rank]
        for rank, name in current.items():
            if rank not in self.followed:
                self.progress.enter(name, followed=True)
                self.followed[rank] = name


def upload_rank_evidence(
    s3: Any,
    *,
    bucket: str,
    experiment: str,
    run: str,
    attempt: int,
    directory: Path,
    live: int | None = None,
    node: int | None = None,
    ranks: frozenset[int] | None = None,
) -> int:
    """Every file of a run's ranks directory (progress documents, stack and flight-recorder dumps) to
    S3, create-only under the attempt; the number uploaded. A file already there stays as it is.

    With `live`, the files go to live snapshot `live` of the attempt instead (`contract.live_rank_evidence_key`),
    followed by its completion marker once every file is in S3: what rank 0 uploads while a rank stalls.
    With `node`, under that node leader's prefix (`contract.node_rank_evidence_key`); with `ranks`, only
    those ranks' files."""
    uploaded, missing = 0, 0
    for path in sorted(directory.glob("*")) if directory.is_dir() else []:
        key = None
        try:
            if not path.is_file() or path.name.startswith(".") or path.stat().st_size == 0:
                continue
            if ranks is not None and rank_of_file(path.name) not in ranks:
                continue
            if path.name.startswith(SIGNAL_STACKS_PREFIX) and not took_signal(path.read_text(errors="replace")):
                continue  # its head alone: no signal came
            key = _evidence_key(experiment, run, attempt, live, path.name, node)
            body = path.read_bytes()
        except OSError:  # the file went away meanwhile (a dump replaced): nothing to keep
            continue
        # The first copy under a key is the one kept: a later document of the rank goes to a later upload's key.
        outcome = put_create_only(s3, bucket=bucket, key=key, body=body, compare=False)
        if outcome.written is Written.CREATED:
            uploaded += 1
        elif not outcome.held:
            log.warning("cannot write s3://%s/%s: %s", bucket, key, outcome.error)
            missing += 1
    if live is not None and not missing:
        key = _evidence_key(experiment, run, attempt, live, contract.LIVE_SNAPSHOT_COMPLETE, node)
        outcome = put_create_only(s3, bucket=bucket, key=key, body=b"", compare=False)
        if not outcome.held:
            log.warning("cannot write s3://%s/%s: %s", bucket, key, outcome.error)
    return uploaded


def _evidence_key(
    experiment: str, run: str, attempt: int, live: int | None, file_name: str, node: int | None = None
) -> str:
    if node is not None:
        return contract.node_rank_evidence_key(experiment, run, attempt, node, file_name, snapshot=live)
    if live is None:
        return contract.rank_evidence_key(experiment, run, attempt, file_name)
    return contract.live_rank_evidence_key(experiment, run, attempt, live, file_name)


# Rank 0 refreshes a stall's live snapshot at most once per this many heartbeats (30 s at 15 s), and only
# when the evidence changed (`evidence_state`): a dump the first snapshot missed arrives within 30 s, before
# the stalled alarm fires; a hang that stays as it is costs no more requests.
LIVE_REFRESH_BEATS = 2


def evidence_state(directory: Path, ranks: list[RankProgress]) -> tuple[object, ...]:
    """What a snapshot of the ranks directory would say, as far as a verdict goes: each rank's step,
    phase, last word and dump count, and each dump file's size (not each document's ages)."""
    try:
        dumps = tuple(
            sorted(
                (path.name, path.stat().st_size)
                for path in directory.glob("*")
                if not path.name.startswith((".", "rank-"))
            )
        )
    except OSError:  # a file replaced meanwhile: the next beat looks again
        dumps = ()
    return tuple((r.rank, r.step, r.phase, r.ended, r.stacks_dumped) for r in ranks), dumps


class LiveSnapshots:
    """When rank 0 uploads a live snapshot of the ranks' evidence: once when a stall episode begins
    (some rank's progress, phases excluded, older than `stall_dump_after` plus one rank-signal pass, by
    when the stalled ranks have dumped their stacks), then at most once per
    `refresh_beats` heartbeats while it lasts, and only if the evidence changed. One in flight at most.

    Bound: per episode, 1 + beats / refresh_beats snapshots, each one PutObject per file of the ranks
    directory (a document and a stacks file per rank, plus flight-recorder dumps) and one marker.

    A slow episode (no rank stalled, one the others wait for: `contract.pace`) is snapshotted too, for the doctor to
    place the slow rank: once when it begins (another rank turning slowest begins another), then once per
    `slow_refresh_beats` while it lasts."""

    def __init__(
        self, *, refresh_beats: int = LIVE_REFRESH_BEATS, slow_refresh_beats: int = SLOW_REFRESH_BEATS
    ) -> None:
        self.refresh_beats, self.slow_refresh_beats = refresh_beats, slow_refresh_beats
        self.taken = 0  # snapshots so far in this process: the next one's number
        self.in_episode = False
        self.slow_rank: int | None = None  # the slow episode's rank
        self._beats_since = 0
        self._slow_beats_since = 0
        self._state: tuple[object, ...] | None = None

    def due(
        self, *, stalled: bool, state: tuple[object, ...] | None, busy: bool = False, slow: int | None = None
    ) -> int | None:
        """The number of the snapshot to take now, or None. `slow`: the rank the others wait for, when one is slow."""
        if not stalled:
            self.in_episode = False
            if slow is not None:
                return self._slow_due(busy, slow)
            self.slow_rank = None
            return None
        self._beats_since += 1
        if busy:  # the previous snapshot is still uploading: never two at once
            return None
        if self.in_episode and (self._beats_since < self.refresh_beats or state == self._state):
            return None
        self.in_episode, self._beats_since, self._state = True, 0, state
        self.taken += 1
        return self.taken - 1

    def _slow_due(self, busy: bool, rank: int) -> int | None:
        self._slow_beats_since += 1
        if busy or (self.slow_rank == rank and self._slow_beats_since < self.slow_refresh_beats):
            return None
        self.slow_rank, self._slow_beats_since = rank, 0
        self.taken += 1
        return self.taken - 1
