"""Every node's rank documents for every node, where the ranks directory is node-local (multi-node SageMaker).

On EKS every node mounts the run's one volume, and rank 0 reads every rank's document there. On SageMaker
each instance has its own `/opt/ml/checkpoints`: rank 0 would see its own node's ranks alone, so one rank
of another node in a long checkpoint, by itself, would read as a hang (its node's others wait, and rank 0's
clock would not know why). So where a directory holds its own node's documents alone, the rank that reads
it (rank 0 on node 0, the node leader elsewhere, `beacon.evidence.node_leader`) runs a board: a thread of its own that
puts them in torchrun's own store (one key per node, in the TCPStore the launcher on node 0 hosts at
MASTER_ADDR:MASTER_PORT; it outlives a worker that dies) and reads the other nodes' keys back. The reader then
counts those ranks with its own (`merged`): rank 0's heartbeat for the phases it follows, the slowest rank and
the spread of steps; a node leader for its stall test. What each uploads stays its own node's files.

The store's calls can block past their timeout (a frozen node 0 keeps its connections open), so they run on
the board's thread alone: `merged` reads what the thread last brought, never the store, and a reading older
than three passes is not used; nor is a node whose key stopped changing for three passes (its board stopped,
or the node was lost: its documents would only age). No AWS call; one small value per node per pass. Three
failed passes in a row, or a shared directory, give the board up: each node then sees its own ranks, as before.
Node 0's leader (its LOCAL_RANK 1) writes node 0's key beside rank 0, on purpose: it stays current if rank 0
stops.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from beacon.contract.rank_evidence import RankProgress
from beacon.evidence.ranks import read_ranks

log = logging.getLogger("beacon.rank_board")

STORE_TIMEOUT_S = 10.0  # connecting, and any one call (torch may wait longer: only the board's thread waits)
CONNECT_ATTEMPTS = 3  # then the board is given up (said once)
STALE_PASSES = 3  # a reading older than this many passes is not used


def board_key(node_rank: int) -> str:
    return f"beacon/ranks/node-{node_rank:05d}"


def nodes_from_environment() -> int:
    """torchrun's number of nodes (GROUP_WORLD_SIZE); 1 outside torchrun."""
    value = os.environ.get("GROUP_WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def torchrun_store() -> Any:
    """A client of the store torchrun's workers rendezvous on (MASTER_ADDR, MASTER_PORT)."""
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        raise ValueError("MASTER_ADDR and MASTER_PORT are not set: not started by torchrun")
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported without `as`

    return TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S))


class RankBoard:
    """Node `node_rank`'s documents (those of `directory`) on torchrun's store, and the other nodes' read back,
    by a daemon thread every `interval` seconds."""

    def __init__(
        self,
        directory: Path,
        *,
        node_rank: int,
        since: float,
        interval: float,
        nodes: int | None = None,
        connect: Callable[[], Any] = torchrun_store,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory
        self.node_rank = node_rank
        self.since = since  # documents written before are an earlier attempt's
        self.interval = interval
        self.nodes = nodes_from_environment() if nodes is None else nodes
        self._connect = connect
        self._clock = clock
        self._store: Any = None
        self._failures = 0  # in a row: a pass that works starts the count again
        self._passes = 0
        # Each other node's pass number as last read, and when (this clock) it last changed: a node whose board
        # stopped (given up, or the node lost) leaves its key behind, and its documents would age without end.
        self._seen: dict[int, tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._others: list[RankProgress] = []
        self._read_at = -float("inf")  # when the last complete reading of the other nodes' keys was taken
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="beacon-rank-board", daemon=True)

    @property
    def wanted(self) -> bool:
        return self.nodes > 1 and self.node_rank >= 0

    def start(self) -> RankBoard:
        if self.wanted:
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; waited for briefly, so that it is not mid-call when the process exits (a store call that
        blocks past it leaves a daemon thread behind)."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=2.0)

    def merged(self, own: list[RankProgress]) -> list[RankProgress]:
        """The directory's documents and, from the board's last fresh reading, the other nodes' it does not hold,
        in rank order. A directory that holds several nodes' documents (a shared volume) needs none."""
        if len({r.node_rank for r in own}) > 1:
            return own
        with self._lock:
            fresh = self._clock() - self._read_at <= STALE_PASSES * self.interval
            others = list(self._others) if fresh else []
        held = {r.rank for r in own}
        return sorted([*own, *(r for r in others if r.rank not in held)], key=lambda r: r.rank)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.pass_once():
                    return
            except Exception:  # the board helps; it never stops training
                log.exception("node %d: rank board pass failed", self.node_rank)
            self._stop.wait(self.interval)

    def pass_once(self) -> bool:
        """Share this node's documents and read the other nodes'; False once the board is given up."""
        own = read_ranks(self.directory, since=self.since)
        if own and any(r.node_rank != self.node_rank for r in own):
            log.info("node %d: the ranks directory is shared; no rank board", self.node_rank)
            return False
        store = self._reach()
        if store is None:
            return self._failures < CONNECT_ATTEMPTS
        others: list[RankProgress] = []
        try:
            self._passes += 1
            if own:
                value = {"pass": self._passes, "documents": [asdict(r) for r in own]}
                store.set(board_key(self.node_rank), json.dumps(value))
            for node in range(self.nodes):
                key = board_key(node)
                if node != self.node_rank and store.check([key]):
                    others += self._documents(node, store.get(key))
        except Exception as error:  # the store went away: a new client next pass, up to CONNECT_ATTEMPTS in a row
            self._store = None
            return not self._failed(error)
        self._failures = 0
        with self._lock:
            self._others, self._read_at = others, self._clock()
        return True

    def _documents(self, node: int, value: bytes) -> list[RankProgress]:
        """Node `node`'s documents of this attempt, if its board still writes; none for a bad value (that node's
        alone: a document of the wrong shape would fail every heartbeat that counts it)."""
        try:
            written = json.loads(value)
            documents = [RankProgress.from_document(json.dumps(body).encode()) for body in written["documents"]]
            if not isinstance(written["pass"], int):
                raise ValueError("a pass number of the wrong shape")
        except Exception as error:
            log.warning("node %d: unreadable %s on the rank board: %s", self.node_rank, board_key(node), error)
            return []
        now = self._clock()
        last, changed = self._seen.get(node, (None, now))
        self._seen[node] = (written["pass"], now if written["pass"] != last else changed)
        if now - self._seen[node][1] > STALE_PASSES * self.interval:
            return []  # its board stopped writing: its documents would only age
        return [d for d in documents if d.wall_time >= self.since]

    def _reach(self) -> Any:
        if self._store is None:
            try:
                self._store = self._connect()
            except Exception as error:  # torch's DistStoreError, an import error, a refused connection
                self._failed(error)
        return self._store

    def _failed(self, error: BaseException) -> bool:
        """Count a failure; True (said once) when the board is given up."""
        self._failures += 1
        if self._failures < CONNECT_ATTEMPTS:
            return False
        log.warning("node %d: no rank board (each node sees its own ranks alone): %s", self.node_rank, error)
        return True
