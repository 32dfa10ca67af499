"""Every node's rank documents for every node, where the ranks directory is node-local (multi-node SageMaker).

On EKS every node mounts the run's one volume, and rank 0 reads every rank's document there. On SageMaker
each instance has its own `/opt/ml/checkpoints`: rank 0 would see its own node's ranks alone, so one rank
of another node in a long checkpoint, by itself, would read as a hang (its node's others wait, and rank 0's
clock would not know why). So where a directory holds its own node's documents alone, the rank that reads
it (rank 0 on node 0, the node leader elsewhere, `beacon.node_leader`) runs a board: a thread of its own that
puts them in torchrun's own store (one key per node, in the TCPStore the launcher on node 0 hosts at
MASTER_ADDR:MASTER_PORT; it outlives a worker that dies) and reads the other nodes' keys back. The reader then
counts those ranks with its own (`merged`): rank 0's heartbeat for the phases it follows, the slowest rank and
the spread of steps; a node leader for its stall test. What each uploads stays its own node's files.

The store's calls can block past their timeout (a frozen node 0 keeps its connections open), so they run on
the board's thread alone: `merged` reads what the thread last brought, never the store, and a reading older
than three passes is not used. No AWS call; one small value per node per pass. A connection refused three
times, or a board on a shared directory, is given up: each node then sees its own ranks, as before.
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

from beacon.ranks import RankProgress, read_ranks

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
    ) -> None:
        self.directory = directory
        self.node_rank = node_rank
        self.since = since  # documents written before are an earlier attempt's
        self.interval = interval
        self.nodes = nodes_from_environment() if nodes is None else nodes
        self._connect = connect
        self._store: Any = None
        self._failures = 0
        self._lock = threading.Lock()
        self._others: list[RankProgress] = []
        self._read_at = 0.0  # monotonic time of the last complete reading of the other nodes' keys
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
        self._stop.set()  # never joined: a store call may block; the thread is a daemon

    def merged(self, own: list[RankProgress]) -> list[RankProgress]:
        """The directory's documents and, from the board's last fresh reading, the other nodes' it does not hold,
        in rank order. A directory that holds several nodes' documents (a shared volume) needs none."""
        if len({r.node_rank for r in own}) > 1:
            return own
        with self._lock:
            fresh = time.monotonic() - self._read_at <= STALE_PASSES * self.interval
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
            if own:
                store.set(board_key(self.node_rank), json.dumps([asdict(r) for r in own]))
            for node in range(self.nodes):
                key = board_key(node)
                if node != self.node_rank and store.check([key]):
                    others += self._documents(key, store.get(key))
        except Exception as error:  # the store went away: a new client next pass, up to CONNECT_ATTEMPTS
            self._store = None
            return not self._failed(error)
        with self._lock:
            self._others, self._read_at = others, time.monotonic()
        return True

    def _documents(self, key: str, value: bytes) -> list[RankProgress]:
        try:
            documents = [RankProgress.from_document(json.dumps(body).encode()) for body in json.loads(value)]
        except (TypeError, ValueError) as error:  # one node's bad value: that node's alone
            log.warning("node %d: unreadable %s on the rank board: %s", self.node_rank, key, error)
            return []
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
