"""Every node's rank documents for every node where each node has its own ranks directory (multi-node
SageMaker): the board on torchrun's own store (`beacon.evidence.rank_board`), against a real TCPStore."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from beacon.contract.rank_evidence import RankProgress, rank_document_name
from beacon.evidence.progress import ProgressClock
from beacon.evidence.rank_board import RankBoard, board_key, torchrun_store
from beacon.evidence.ranks import PhaseFollower
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported without `as`


def document(rank: int, *, node: int, phase: str = "training", written: float = 1000.0) -> RankProgress:
    return RankProgress(
        rank=rank, local_rank=rank % 2, world_size=4, step=20, phase=phase, progress_age=0.0, wall_time=written,
        last_step_wall_time=written, pid=100 + rank, pod=f"pod-{rank}", node=f"algo-{node + 1}", instance="i",
        stacks_dumped=0, node_rank=node, phase_seconds=150.0 if phase != "training" else 0.0, phase_limit=1800.0,
    )  # fmt: skip


def directory_of(root: Path, *documents: RankProgress) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for d in documents:
        (root / rank_document_name(d.rank)).write_text(json.dumps(asdict(d)))
    return root


def board(directory: Path, node: int, **options: Any) -> RankBoard:
    return RankBoard(directory, node_rank=node, since=0.0, interval=60.0, **options)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """torchrun's store as node 0's launcher hosts it, and the workers' environment pointing at it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GROUP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    yield master


def test_rank_0_follows_a_checkpoint_that_one_rank_of_another_node_is_in_by_itself(store: Any, tmp_path: Path) -> None:
    """Node 1's leader puts its node's documents on the board: rank 3 in a 150 s checkpoint alone. Rank 0's
    directory holds ranks 0-1 alone; with the board, its clock counts rank 3's checkpoint as work, as it does
    on a shared volume. Without, its ProgressAge would cross the stall threshold on a healthy job."""
    node_0 = [document(0, node=0), document(1, node=0)]
    node_1 = board(directory_of(tmp_path / "algo-2", document(2, node=1), document(3, node=1, phase="checkpoint")), 1)
    rank_0 = board(directory_of(tmp_path / "algo-1", *node_0), 0)
    assert node_1.pass_once() and rank_0.pass_once() and node_1.pass_once()
    merged = rank_0.merged(node_0)
    assert [(r.rank, r.phase) for r in merged] == [(0, "training"), (1, "training"), (2, "training"), (3, "checkpoint")]
    assert [r.rank for r in node_1.merged(merged[2:])] == [0, 1, 2, 3], "rank 0's node shares too"

    now = [1000.0]
    clock = ProgressClock(now=lambda: now[0])
    clock.step_finished()
    PhaseFollower(clock).follow(merged, now[0])
    assert clock.current_phase() == ("rank 3 checkpoint", 0.0)
    alone = ProgressClock(now=lambda: now[0])
    PhaseFollower(alone).follow(node_0, now[0])
    assert alone.current_phase() is None, "its own node's documents alone say nothing of rank 3"


def test_a_shared_directory_runs_no_board_and_a_stale_reading_is_not_used(store: Any, tmp_path: Path) -> None:
    """On EKS the directory holds every node's documents: nothing goes on the board. A reading older than
    three passes (the store stopped answering) is not used: the ranks would look as old as the reading. Nor is a
    node whose key stopped changing (its board gave up, or the node was lost)."""
    everyone = [document(0, node=0), document(1, node=0), document(2, node=1), document(3, node=1)]
    shared = board(directory_of(tmp_path / "shared", *everyone), 0)
    assert not shared.pass_once() and not store.check([board_key(0)])
    assert shared.merged(everyone) == everyone
    now = [0.0]
    node_1 = board(directory_of(tmp_path / "algo-2", *everyone[2:]), 1)
    rank_0 = RankBoard(directory_of(tmp_path / "algo-1", *everyone[:2]), node_rank=0, since=0.0, interval=5.0,
                       clock=lambda: now[0])  # fmt: skip
    assert node_1.pass_once() and rank_0.pass_once()
    assert rank_0.merged(everyone[:2]) == everyone
    now[0] = 15.0
    assert rank_0.merged(everyone[:2]) == everyone, "three passes old: still used"
    now[0] = 15.1
    assert rank_0.merged(everyone[:2]) == everyone[:2], "a reading older than three passes"
    # node 1's board stopped at 0 s: its key stays, unchanged, and a fresh reading of it is not used either
    assert rank_0.pass_once() and rank_0.merged(everyone[:2]) == everyone[:2], "a key unchanged for three passes"
    assert node_1.pass_once() and rank_0.pass_once() and rank_0.merged(everyone[:2]) == everyone, "written again"
    earlier = RankBoard(tmp_path / "algo-1", node_rank=0, since=2000.0, interval=60.0)
    assert earlier.pass_once() and earlier.merged([]) == [], "written before this attempt began"


def test_a_store_that_never_answers_never_holds_up_the_reader(tmp_path: Path) -> None:
    """A frozen node 0 keeps its connections open, and torch's calls then wait past their timeout: they run on
    the board's thread alone, and `merged` (rank 0's heartbeat, a node leader's pass) reads what it last had."""
    answered = threading.Event()

    class Frozen:
        def set(self, key: str, value: str) -> None:
            answered.wait()

        def check(self, keys: list[str]) -> bool:
            answered.wait()
            return False

    own = [document(0, node=0)]
    frozen = RankBoard(directory_of(tmp_path, *own), node_rank=0, since=0.0, interval=0.01, nodes=2, connect=Frozen)
    frozen.start()
    try:
        started = time.monotonic()
        for _ in range(50):
            assert frozen.merged(own) == own
        assert time.monotonic() - started < 5.0, "the thread waits on the store; the reader does not"
    finally:
        frozen.stop()
        answered.set()


def test_an_unreachable_store_is_given_up_after_three_tries_and_one_bad_value_costs_its_node_alone(
    store: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def refused() -> Any:
        calls.append(1)
        raise RuntimeError("connection refused")

    own = [document(0, node=0)]
    unreachable = board(directory_of(tmp_path / "algo-1", *own), 0, nodes=2, connect=refused)
    assert [unreachable.pass_once() for _ in range(3)] == [True, True, False]
    assert len(calls) == 3 and caplog.text.count("no rank board") == 1 and unreachable.merged(own) == own
    assert not board(tmp_path / "algo-1", 0, nodes=1).wanted, "one node: no board at all"
    blips = iter([RuntimeError("reset"), store, RuntimeError("reset"), RuntimeError("reset"), store])

    def now_and_then() -> Any:
        outcome = next(blips)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    flaky = board(tmp_path / "algo-1", 0, nodes=2, connect=now_and_then)
    assert [flaky.pass_once() for _ in range(5)] == [True] * 5, "three failures in a row give it up, not in a run"

    wrong_shape = {"pass": 1, "documents": [{**asdict(document(5, node=3)), "progress_age": "old"}]}
    for node, value in ((1, "not json"), (2, json.dumps({"pass": 1, "documents": [asdict(document(4, node=2))]})),
                        (3, json.dumps(wrong_shape)), (4, json.dumps({"documents": {}})), (5, "[1, 2]")):  # fmt: skip
        store.set(board_key(node), value)
    six_nodes = board(tmp_path / "algo-1", 0, nodes=6)
    assert six_nodes.pass_once() and [r.rank for r in six_nodes.merged(own)] == [0, 4], "a bad value costs its node"
    assert all(f"unreadable beacon/ranks/node-0000{n}" in caplog.text for n in (1, 3, 4, 5))
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.delenv("MASTER_ADDR")
    try:
        with pytest.raises(ValueError, match="MASTER_ADDR"):
            torchrun_store()
    finally:
        monkeypatch.undo()
