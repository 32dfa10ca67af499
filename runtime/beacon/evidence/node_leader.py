"""Each node's evidence when rank 0 cannot upload it: rank 0 stopped, or the ranks directory is node-local.

Rank 0 uploads the ranks directory (`beacon.evidence.ranks`) at an attempt's end and, while a rank stalls, as live
snapshots from its heartbeat. Frozen (SIGSTOP, a C call holding the GIL), killed, or on a lost node, it
uploads nothing; and on multi-node SageMaker, which has no shared volume, rank 0's directory holds its own
node's files alone. So each other node's leader (LOCAL_RANK 0, torchrun's GROUP_RANK numbers the node), and on
rank 0's own node its LOCAL_RANK 1 (a single-node job has no other node), upload, create-only under
`ranks/attempt-<k>/node-<g>/` (`contract.node_rank_evidence_key`), what rank 0 does not (`node_share`):
- the directory holds no document of rank 0 (node-local: SageMaker): every file in it, its node's;
- rank 0's document is there and fresh (shared volume, rank 0 alive): nothing, rank 0 covers it;
- rank 0's document went stale, or rank 0's last word is written while the others stall: the first node
  leader still writing stands in for rank 0 (every file); the others upload their node's ranks' files.
At an attempt's end every leader uploads its own node's ranks' files (and, while rank 0 has no last word, the
first leader still writing everything), after waiting briefly for their last words: rank 0 uploads once the ranks
finished together, but torchrun tears a node's surviving ranks down 30 s after one of them exits, so whichever
process's end comes first or is cut short, each node's last words still reach S3.
A leader's stall test, snapshot bound and upload are rank 0's (`beacon.evidence.live_evidence.LiveEvidence`): some
rank's progress older than the run's stall threshold (its pace's, `contract.pace`, or `stall_dump_after`) plus one
rank-signal pass, no rank in a named phase.
It calls S3 only (no CloudWatch, no preflight: rank 0's preflight checked the bucket).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from beacon import contract
from beacon.contract.rank_evidence import RankProgress
from beacon.evidence.live_evidence import LiveEvidence
from beacon.evidence.progress import ProgressClock
from beacon.evidence.rank_board import RankBoard
from beacon.evidence.ranks import evidence_state, rank_signal_interval, read_ranks, this_attempts_documents_since
from beacon.settings import RunSettings

log = logging.getLogger("beacon.node_leader")

LAST_WORD_POLL_S = 0.2  # how often a leader at its attempt's end looks for its node's last words


def leads_evidence(*, rank: int, local_rank: int, node_rank: int) -> bool:
    """Whether this rank runs a node leader: each node's LOCAL_RANK 0 but rank 0's, and LOCAL_RANK 1 of rank 0's
    node (node 0), which stands in first when rank 0 stops (the others then upload their own node's ranks)."""
    if rank == 0 or node_rank < 0:
        return False
    return local_rank == 0 or (node_rank == 0 and local_rank == 1)


@dataclass(frozen=True)
class Share:
    """What a node leader uploads: `ranks` None is every file of the directory; empty is nothing."""

    ranks: frozenset[int] | None
    reason: str


def node_share(
    ranks: list[RankProgress], *, me: int, node_rank: int, now: float, fresh_for: float, at_end: bool
) -> Share:
    """What node `node_rank`'s leader (rank `me`) uploads, given the documents it sees."""
    zero = next((r for r in ranks if r.rank == 0), None)
    if zero is None:
        return Share(None, "node-local ranks directory: every file in it is this node's")
    own = frozenset(r.rank for r in ranks if r.node_rank == node_rank)
    if at_end and zero.ended:  # rank 0 uploads next, unless torchrun's teardown cuts it short first
        return Share(own, "the attempt's end: this node's ranks, beside rank 0's upload")
    if not at_end and not zero.ended and now - zero.wall_time < fresh_for:
        return Share(frozenset(), "rank 0 uploads the shared ranks directory")
    alive = [
        r.rank
        for r in ranks
        if leads_evidence(rank=r.rank, local_rank=r.local_rank, node_rank=r.node_rank)
        and (r.ended or now - r.wall_time < fresh_for)
    ]
    if min([*alive, me]) == me:
        return Share(None, "rank 0 went silent: the first node leader stands in for it")
    return Share(own, "rank 0 went silent: this node's ranks")


class NodeLeader:
    def __init__(self, s3: Any, *, settings: RunSettings, rank: int, node_rank: int, progress: ProgressClock) -> None:
        self.settings = settings
        self.rank, self.node_rank = rank, node_rank
        self.progress = progress  # this rank's own clock: its own phases are work too
        self.directory = settings.run_ranks_dir
        # Rank 0's stall rule, snapshot bound and upload, under this node's key
        self.evidence = LiveEvidence(s3, settings, progress=progress, node=node_rank)
        self.attempt = 0
        self._ranks_since = this_attempts_documents_since()  # restored or left-over documents are not this attempt's
        # Other nodes' documents, where each node has its own directory: for the stall test alone (what it
        # uploads stays this node's files, `node_share`).
        self.rank_board = RankBoard(
            self.directory, node_rank=node_rank, since=self._ranks_since,
            interval=rank_signal_interval(settings.heartbeat_interval),
        )  # fmt: skip
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beacon-node-evidence", daemon=True)

    def start(self, attempt: int) -> NodeLeader:
        self.attempt = attempt
        self._thread.start()
        self.rank_board.start()
        return self

    def _loop(self) -> None:
        """A pass every heartbeat interval, and between them, every rank-signal pass, once this rank's own progress
        is as old as the run's threshold (`LiveEvidence.own_progress_stopped`)."""
        every = rank_signal_interval(self.settings.heartbeat_interval)
        next_pass = time.monotonic() + self.settings.heartbeat_interval
        while not self._stop.wait(every):
            on_beat = time.monotonic() >= next_pass
            if not on_beat and not self.evidence.own_progress_stopped():
                continue
            if on_beat:
                next_pass = time.monotonic() + self.settings.heartbeat_interval
            try:
                self.look(begin_only=not on_beat)
            except Exception:  # evidence helps; it never stops training
                log.exception("node %d: live snapshot of the ranks' evidence failed", self.node_rank)

    def _share(self, ranks: list[RankProgress], now: float, *, at_end: bool) -> Share:
        return node_share(
            ranks, me=self.rank, node_rank=self.node_rank, now=now, fresh_for=self.settings.stall_dump_after,
            at_end=at_end,
        )  # fmt: skip

    @staticmethod
    def _own(share: Share, ranks: list[RankProgress]) -> Share:
        """Every file of the directory, read as this attempt's ranks' files: a restore's or an earlier
        world's are not this node's."""
        return Share(frozenset(r.rank for r in ranks), share.reason) if share.ranks is None else share

    def stalled(self, ranks: list[RankProgress], now: float) -> bool:
        return self.evidence.stalled(ranks, now)

    def look(self, now: float | None = None, *, begin_only: bool = False) -> int | None:
        """One pass: the number of the live snapshot uploaded, or None. `begin_only` (a pass between heartbeats): a
        stall episode's first snapshot alone; its refreshes keep the heartbeat's pace."""
        if begin_only and self.evidence.snapshots.in_episode:
            return None
        now = time.time() if now is None else now
        ranks = read_ranks(self.directory, since=self._ranks_since)
        share = self._own(self._share(ranks, now, at_end=False), ranks)
        everyone = self.rank_board.merged(ranks)
        stalled = share.ranks != frozenset() and self.stalled(everyone, now)
        state = (evidence_state(self.directory, ranks), share.ranks) if stalled else None
        # A slow rank on a node-local directory is placed by its node's documents: its leader uploads them too
        slow = self.evidence.slow_rank(everyone) if share.ranks != frozenset() and not stalled else None
        snapshot = self.evidence.due(stalled=stalled, state=state, slow=None if slow is None else slow.rank)
        if snapshot is None:
            return None
        log.warning(
            "node %d: %s (%s); live snapshot %d of the ranks' evidence to s3://%s/%s",
            self.node_rank,
            "a rank stalled" if slow is None else f"rank {slow.rank} is slow",
            share.reason,
            snapshot,
            self.settings.bucket,
            self._key(snapshot),
        )
        self._upload(share, snapshot)
        return snapshot

    def finish(self, *, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        """At the attempt's end, once the ranks finished together (or gave up waiting): this node's last words, and
        what rank 0 will not upload."""
        self._stop.set()
        self.rank_board.stop()
        if self._thread.ident is not None:
            self._thread.join(timeout=self.settings.heartbeat_interval + 30)
        ranks = self.last_words(clock=clock, sleep=sleep)
        share = self._own(self._share(ranks, clock(), at_end=True), ranks)
        if share.ranks != frozenset():
            log.info("node %d: the ranks' evidence to s3://%s/%s (%s)", self.node_rank, self.settings.bucket,
                     self._key(None), share.reason)  # fmt: skip
            self._upload(share, None)

    def last_words(self, *, clock: Callable[[], float], sleep: Callable[[float], None]) -> list[RankProgress]:
        """The directory's documents once this node's ranks wrote their last words or went quiet (killed: no
        rewrite for two passes), for two passes at most: a rank still draining is uploaded as it stands."""
        passes = rank_signal_interval(self.settings.heartbeat_interval)
        quiet, waited_until = 2 * passes, clock() + 2 * passes
        while True:
            ranks, now = read_ranks(self.directory, since=self._ranks_since), clock()
            if now >= waited_until or all(
                r.ended or now - r.wall_time > quiet for r in ranks if r.node_rank == self.node_rank
            ):
                return ranks
            sleep(min(LAST_WORD_POLL_S, waited_until - now))

    def _key(self, snapshot: int | None) -> str:
        s = self.settings
        return contract.node_rank_evidence_key(s.experiment, s.run, self.attempt, self.node_rank, "", snapshot=snapshot)

    def _upload(self, share: Share, snapshot: int | None) -> None:
        self.evidence.upload(self.directory, attempt=self.attempt, snapshot=snapshot, ranks=share.ranks)
