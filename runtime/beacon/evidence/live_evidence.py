"""One uploader of the ranks' live evidence while a rank stalls, for rank 0 (at each heartbeat) and for each node
leader (at each of its passes): one stall rule and threshold (`ranks.a_rank_stalled`), one bound on snapshots
(`ranks.LiveSnapshots`), one upload (`ranks.upload_rank_evidence`). Rank 0 uploads on a thread of its own, one at a
time, so a slow S3 never delays a heartbeat; a node leader's pass is a thread of its own already.

A hang is looked for on its own cadence too, not the heartbeat's alone (issue 31): every rank-signal pass (5 s),
rank 0's `watch` thread and each node leader look once their own progress is as old as the run's threshold. In
synchronous training every rank stops when one hangs, so a rank's own clock is the cheap sign; only then is the
ranks' directory read (a thousand documents on a network file system every 5 s would not be)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.contract.pace import Straggler, straggler_of
from beacon.contract.rank_evidence import RankProgress
from beacon.evidence.progress import ProgressClock
from beacon.evidence.rank_board import RankBoard
from beacon.evidence.ranks import (
    CrossRankView,
    LiveSnapshots,
    a_rank_stalled,
    evidence_state,
    rank_signal_interval,
    read_ranks,
    stall_threshold,
    upload_rank_evidence,
)
from beacon.settings import RunSettings

log = logging.getLogger("beacon.telemetry")


@dataclass(frozen=True)
class RanksDirectory:
    """The run's ranks directory as one process reads it: this attempt's documents (`since`), and with `board`, the
    other nodes' where each node has a directory of its own."""

    directory: Path
    since: float
    board: RankBoard | None = None

    def read(self) -> tuple[list[RankProgress], list[RankProgress]]:
        """This directory's ranks, and everyone's (with the board's)."""
        ranks = read_ranks(self.directory, since=self.since)
        return ranks, self.board.merged(ranks) if self.board is not None else ranks


class LiveEvidence:
    def __init__(self, s3: Any, settings: RunSettings, *, progress: ProgressClock, node: int | None = None) -> None:
        self.s3, self.settings = s3, settings
        self.progress = progress  # this rank's own clock: its own phases are work too
        self.node = node  # a node leader's node; None: rank 0's uploads

        self.snapshots = LiveSnapshots()
        self._thread: threading.Thread | None = None
        self._pass = threading.Lock()  # the heartbeat's pass and the watch's never interleave

    def stalled(self, everyone: list[RankProgress], now: float) -> bool:
        return a_rank_stalled(
            everyone, now, threshold=self.threshold(everyone), in_own_phase=self.progress.in_phase_work(),
            phase_limit=self.settings.phase_limit,
        )  # fmt: skip

    def threshold(self, everyone: list[RankProgress]) -> float:
        """The ranks dump their stacks at the run's stall threshold, each within one rank-signal pass."""
        return stall_threshold(self.settings.stall_dump_after, self.settings.heartbeat_interval, everyone)

    def slow_rank(self, everyone: list[RankProgress]) -> Straggler | None:
        """The rank the others wait for, when it is slow for the verdict (`contract.pace`, the run's share)."""
        straggler = straggler_of([r.pace for r in everyone if not r.ended])
        slow = straggler is not None and straggler.is_slow(share=self.settings.slow_rank_share)
        return straggler if slow else None

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def due(self, *, stalled: bool, state: tuple[object, ...] | None, slow: int | None = None) -> int | None:
        """The number of the live snapshot to take now, or None."""
        return self.snapshots.due(stalled=stalled, state=state, busy=self.busy(), slow=slow)

    def own_progress_stopped(self) -> bool:
        """This rank's own progress is as old as its pace's stall threshold (`stall_dump_after` without a baseline),
        outside its phases: the cheap sign that some rank may hang."""
        own = self.progress.stall_after(self.settings.stall_dump_after)
        return self.progress.progress_age() >= own and not self.progress.in_phase_work()

    def look_as_rank_zero(
        self,
        where: RanksDirectory,
        ranks: list[RankProgress],
        everyone: list[RankProgress],
        now: float,
        *,
        attempt: int,
        begin_only: bool = False,
    ) -> int | None:
        """Rank 0's pass: a live snapshot of this directory's ranks' files once a rank stalls, or while one is slow,
        uploaded in the background; the number taken, or None. `begin_only` (the watch's passes): a stall episode's
        first snapshot alone; its refreshes keep the heartbeat's pace (`LiveSnapshots` counts beats)."""
        with self._pass:  # the heartbeat's and the watch's passes never interleave
            if begin_only and self.snapshots.in_episode:
                return None
            view = CrossRankView.of(everyone, now)
            stalled = self.stalled(everyone, now)
            straggler = None if stalled else self.slow_rank(everyone)
            state = evidence_state(where.directory, ranks) if stalled else None
            snapshot = self.due(stalled=stalled, state=state, slow=None if straggler is None else straggler.rank)
            if snapshot is None or view is None:
                return None
            place = contract.live_rank_evidence_key(self.settings.experiment, self.settings.run, attempt, snapshot, "")
            if straggler is not None:
                log.warning(
                    "rank %d is slow: the others wait for it %.0f%% of each step; live snapshot %d of the ranks' "
                    "evidence to s3://%s/%s", straggler.rank, 100 * straggler.waited_share, snapshot,
                    self.settings.bucket, place,
                )  # fmt: skip
            else:
                log.warning(
                    "rank %d: no progress for %.0f s; live snapshot %d of the ranks' evidence to s3://%s/%s",
                    view.slowest_rank, view.slowest_progress_age, snapshot, self.settings.bucket, place,
                )  # fmt: skip
            mine = frozenset(r.rank for r in ranks)  # this attempt's ranks' files
            self._thread = threading.Thread(
                target=self._upload_logged, args=(where.directory, attempt, snapshot, mine),
                name="beacon-rank-snapshot", daemon=True,
            )  # fmt: skip
            self._thread.start()
            return snapshot

    def upload(self, directory: Path, *, attempt: int, snapshot: int | None, ranks: frozenset[int] | None) -> None:
        """The ranks' files to S3, create-only: live snapshot `snapshot`, or the attempt's end (None)."""
        s = self.settings
        upload_rank_evidence(
            self.s3, bucket=s.bucket, experiment=s.experiment, run=s.run, attempt=attempt, directory=directory,
            live=snapshot, node=self.node, ranks=ranks,
        )  # fmt: skip

    def _upload_logged(self, directory: Path, attempt: int, snapshot: int, ranks: frozenset[int]) -> None:
        try:
            self.upload(directory, attempt=attempt, snapshot=snapshot, ranks=ranks)
        except Exception:  # evidence helps; it never stops the heartbeat or training
            log.exception("live snapshot %d of the ranks' evidence failed", snapshot)

    def wait(self, timeout: float) -> bool:
        """True once no live snapshot is uploading."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()


class StallWatch:
    """Rank 0's stall check on its own cadence, between heartbeats: every rank-signal pass, once its own progress
    stopped (`LiveEvidence.own_progress_stopped`), a pass that may begin a stall's snapshot."""

    def __init__(
        self,
        evidence: LiveEvidence,
        where: RanksDirectory,
        attempt: Callable[[], int],
        *,
        interval: float | None = None,
    ) -> None:
        self.evidence, self.where, self.attempt = evidence, where, attempt
        self.interval = interval if interval is not None else rank_signal_interval(evidence.settings.heartbeat_interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beacon-stall-check", daemon=True)

    def start(self) -> StallWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=self.interval + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.evidence.own_progress_stopped():
                    ranks, everyone = self.where.read()
                    self.evidence.look_as_rank_zero(
                        self.where, ranks, everyone, time.time(), attempt=self.attempt(), begin_only=True
                    )
            except Exception:  # evidence helps; it never stops training
                log.exception("the stall check's pass failed; the next one follows")
