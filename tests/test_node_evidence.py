"""A hung or dead rank 0 does not take the evidence with it (issue 17): each other node's leader uploads
what rank 0 cannot (`beacon.evidence.node_leader`), and the doctor's reader merges the uploads per rank.

Clocks are scaled in the torchrun tests: stall_dump_after 3 s and a 1 s heartbeat stand for 90 s and
15 s (1:30 and 1:15); a node leader snapshots after 4 s where it would after 95 s. The in-process tests
write the documents with the ages they mean, so nothing sleeps there."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from beacon import contract
from beacon.contract.rank_evidence import RankProgress, rank_document_name, stacks_name
from beacon.evidence.node_leader import NodeLeader, leads_evidence, node_share
from beacon.evidence.progress import ProgressClock
from beacon.evidence.rank_board import board_key
from beacon.evidence.ranks import read_ranks, upload_rank_evidence
from smoke_job.config import parse_args
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, re-exported without `as`

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.doctor.rank_verdict import which_rank
from beacon_ops.evidence.reading import merge_rank_files, rank_sources, read_run
from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, keys_under, signal_group, wait_for
from tests.support.moto_server import MotoServer
from tests.test_live_ranks import ALL_REDUCE, FORWARD, stack_dump
from tests.test_ranks import free_port, start_node

BUCKET, EXPERIMENT, RUN = "beacon-demo-nodes", "smoke", "r1"
STALL = 90.0
NOW = 10_000.0


def doc(rank: int, *, age: float = 100.0, written: float = NOW, ended: str = "") -> RankProgress:
    """Rank `rank` of 4 on 2 nodes (ranks 0-1 on node 0, 2-3 on node 1), as its document says."""
    node = rank // 2
    return RankProgress(rank, rank % 2, 4, 50, "training", age, written, written - age, 100 + rank, f"train-{node}",
                        f"node-{node}", "g6.12xlarge", 1, ended, node_rank=node)  # fmt: skip


# --- who uploads what ---------------------------------------------------------------------------------
def share(ranks: list[RankProgress], me: int = 2, *, at_end: bool = False) -> frozenset[int] | None:
    return node_share(ranks, me=me, node_rank=me // 2, now=NOW, fresh_for=STALL, at_end=at_end).ranks


def test_a_node_leader_uploads_what_rank_0_cannot() -> None:
    everyone = [doc(r) for r in range(4)]
    assert share(everyone) == frozenset(), "shared volume, rank 0 alive: rank 0 uploads every rank's files"
    assert share(everyone[2:]) is None, "no rank 0 document: a node-local directory (SageMaker), all of it is ours"
    frozen = [doc(0, written=NOW - 120), *everyone[1:]]
    assert share(frozen, me=1) is None, "rank 0 went silent: its node's local rank 1 stands in first"
    assert share(frozen) == frozenset({2, 3}), "node 1's leader uploads its own node's ranks"
    assert share(frozen[:2], me=1) is None, "a single node: local rank 1 is the only one who can"
    assert share([*frozen, doc(4)], me=4) == frozenset({4}), "a later leader uploads its own node's ranks"
    silent_1 = [doc(0, written=NOW - 120), doc(1, written=NOW - 120), *everyone[2:]]
    assert share(silent_1) is None, "rank 1 silent too: node 1's leader, the next still writing, stands in"
    assert share([*silent_1[:2], doc(2, written=NOW - 120), doc(3), doc(4)], me=4) is None
    ended = [doc(0, ended="preempted"), *everyone[1:]]
    assert share(ended, me=1) is None, "rank 0 ended while the others still stall: its heartbeat is over"
    assert share(ended, at_end=True) == frozenset({2, 3}), "the end, rank 0's last word: it uploads, and so do we"
    assert share(everyone, me=1, at_end=True) is None, "no last word from rank 0 at the end: killed, frozen or lost"
    assert [leads_evidence(rank=r, local_rank=r % 2, node_rank=r // 2) for r in range(4)] == [False, True, True, False]
    assert not leads_evidence(rank=1, local_rank=1, node_rank=-1), "no GROUP_RANK: not under torchrun"


# --- reading: one set from rank 0's upload and the node leaders' -----------------------------------------
def keys_of(*paths: str) -> list[str]:
    return [f"p/{contract.RANKS}/{path}" for path in paths]


def test_the_reader_takes_each_uploaders_choice_in_the_newest_attempt() -> None:
    older = keys_of("attempt-00000/rank-00000.json")
    root = keys_of("attempt-00001/live-00000/rank-00000.json", "attempt-00001/live-00000/.complete")
    node = keys_of(
        "attempt-00001/node-00001/live-00000/rank-00002.json", "attempt-00001/node-00001/live-00000/.complete",
        "attempt-00001/node-00001/live-00001/rank-00002.json",  # still uploading: the complete one wins
    )  # fmt: skip
    node_end = keys_of("attempt-00001/node-00003/rank-00006.json")
    assert rank_sources("p/", older + root + node + node_end) == [
        (root[:1], "attempt-00001/live-00000"),
        (node[:1], "attempt-00001/node-00001/live-00000"),
        (node_end, "attempt-00001/node-00003"),
    ]
    assert rank_sources("p/", older + node) == [(node[:1], "attempt-00001/node-00001/live-00000")], "no rank 0"
    assert rank_sources("p/", []) == []


def test_the_merge_takes_each_ranks_newest_document_and_that_uploads_stacks() -> None:
    def files(where: str, *documents: RankProgress, stacks: str = "") -> dict[str, tuple[str, bytes]]:
        found = {rank_document_name(d.rank): (f"{where}/doc", json.dumps(asdict(d)).encode()) for d in documents}
        return found | {stacks_name(d.rank): (f"{where}/stacks", stacks.encode()) for d in documents if stacks}

    rank_0s = files("root", doc(0, written=NOW - 50), doc(1, written=NOW - 50), doc(3, written=NOW - 50), stacks="old")
    node_1s = files("node-1", doc(0, written=NOW - 50), doc(1, written=NOW - 10), doc(3, written=NOW), stacks="new")
    merged = merge_rank_files([rank_0s, node_1s])
    assert merged[stacks_name(3)] == ("node-1/stacks", b"new"), "rank 3's document and stacks from one upload"
    assert merged[rank_document_name(1)][0] == "node-1/doc"
    assert merged[rank_document_name(0)][0] == "root/doc", "a tie stays with rank 0's upload"
    assert merge_rank_files([{}, node_1s]) == node_1s, "rank 0's upload missing altogether"


# --- the verdict when rank 0 is the one that stopped ------------------------------------------------------
def test_a_frozen_rank_with_no_dump_while_the_others_dumped_and_wait_went_silent() -> None:
    documents = [doc(0, written=NOW - 8), *(doc(r) for r in (1, 2, 3))]
    stacks = {r: stack_dump(r, ALL_REDUCE).replace(" at 1.0,", f" at {NOW - 5},") for r in (1, 2, 3)}
    verdict = which_rank(documents, stacks)
    assert verdict is not None and (verdict.rank, verdict.how, verdict.step) == (0, "silent", 50)
    assert verdict.line() == (
        "rank 0 on pod train-0, node node-0, instance type g6.12xlarge went silent at step 50 in training; "
        "3 rank(s) wait in all_reduce (1, 2, 3)"
    )
    rewritten = [doc(0, written=NOW - 1), *documents[1:]]
    assert which_rank(rewritten, stacks) is None, "rewritten since the others dumped: alive, its dump still due"
    # Long after (CI's snapshot came 30 s into the freeze): still silent, not "died", while the others wait.
    long_frozen = [doc(0, written=NOW - 600), *documents[1:]]
    later = which_rank(long_frozen, stacks)
    assert later is not None and (later.rank, later.how) == (0, "silent"), later
    torn_down = [long_frozen[0], *(replace(d, ended="failed: RuntimeError") for d in documents[1:])]
    died = which_rank(torn_down, stacks)
    assert died is not None and (died.rank, died.how) == (0, "died"), "the others ended: torchrun tore it down"


def test_a_frozen_ranks_dump_of_an_earlier_slow_step_does_not_hide_that_it_went_silent() -> None:
    """Rank 0 dumped its stacks at a slow step 12 (a stall dump is taken once per stop, and CI's load can make one
    step that slow), stepped on to 50, then froze. That old dump, in all_reduce, is no evidence of where it is
    now: it went silent, as with no dump at all (CI saw "none stands out" once a snapshot carried the old file)."""
    documents = [doc(0, written=NOW - 8), *(doc(r) for r in (1, 2, 3))]
    stacks = {r: stack_dump(r, ALL_REDUCE).replace(" at 1.0,", f" at {NOW - 5},") for r in (1, 2, 3)}
    stacks[0] = stack_dump(0, ALL_REDUCE).replace(" at 1.0, step 50:", f" at {NOW - 300}, step 12:")
    assert " step 12: " in stacks[0], "the old dump names its own step"
    verdict = which_rank(documents, stacks)
    assert verdict is not None and (verdict.rank, verdict.how, verdict.step) == (0, "silent", 50), verdict
    current = {**stacks, 0: stack_dump(0, ALL_REDUCE).replace(" at 1.0,", f" at {NOW - 5},")}
    assert which_rank(documents, current) is None, "a dump of this stop, in all_reduce: it waits like the others"


def test_ranks_with_no_document_while_every_other_waits_sent_nothing() -> None:
    """Node-local directories: rank 0's node uploaded nothing, node 1's leader uploaded ranks 2-3."""
    stacks = {r: stack_dump(r, ALL_REDUCE) for r in (2, 3)}
    verdict = which_rank([doc(2), doc(3)], stacks)
    assert verdict is not None and (verdict.rank, verdict.how, verdict.missing) == (0, "silent", [0, 1])
    assert verdict.line().startswith("rank(s) 0, 1 sent nothing while the others waited (no document")
    assert verdict.line().endswith("; 2 rank(s) wait in all_reduce (2, 3)")
    named = which_rank([doc(2), doc(3)], {2: stacks[2], 3: stack_dump(3, FORWARD)})
    assert named is not None and (named.rank, named.how) == (3, "hung"), "a rank it has that stands out comes first"


# --- a node leader in-process, against the embedded AWS ---------------------------------------------------
@pytest.fixture
def aws(moto_server: MotoServer) -> MotoServer:
    moto_server.client("s3").create_bucket(Bucket=BUCKET)
    return moto_server


def leader_of_node_1(aws: MotoServer, tmp_path: Path) -> NodeLeader:
    flags = {"--bucket": BUCKET, "--experiment": EXPERIMENT, "--run-id": RUN, "--stall-dump-after": str(STALL),
             "--spool-dir": str(tmp_path / "spool")}  # fmt: skip
    settings = parse_args([part for pair in flags.items() for part in pair]).settings
    return NodeLeader(aws.client("s3"), settings=settings, rank=2, node_rank=1, progress=ProgressClock())


def write(directory: Path, documents: list[RankProgress], hung: int = 3) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for d in documents:
        (directory / rank_document_name(d.rank)).write_text(json.dumps(asdict(d)))
        (directory / stacks_name(d.rank)).write_text(stack_dump(d.rank, FORWARD if d.rank == hung else ALL_REDUCE))


def node_keys(aws: MotoServer) -> list[str]:
    ranks = f"{contract.run_prefix(EXPERIMENT, RUN)}{contract.RANKS}/"
    return sorted(k.removeprefix(ranks) for k in keys_under(aws.client("s3"), BUCKET, ranks))


def test_on_node_local_directories_node_1s_leader_uploads_its_ranks_and_the_doctor_names_rank_3(
    aws: MotoServer, tmp_path: Path
) -> None:
    leader = leader_of_node_1(aws, tmp_path)
    now = time.time()
    write(leader.directory, [doc(2, written=now), doc(3, written=now)])
    assert leader.look(now) == 0
    assert leader.look(now) is None, "one snapshot per stall while the evidence stays as it is"
    live = "attempt-00000/node-00001/live-00000/"
    assert node_keys(aws) == sorted(live + n for n in (".complete", "rank-00002.json", "rank-00003.json",
                                                       "stacks-rank-00002.txt", "stacks-rank-00003.txt"))  # fmt: skip
    s3: Any = aws.client("s3")
    node_0 = tmp_path / "node-0"  # rank 0's own node-local directory: ranks 0-1 wait, its heartbeat uploaded them
    write(node_0, [doc(0, written=now), doc(1, written=now)])
    upload_rank_evidence(s3, bucket=BUCKET, experiment=EXPERIMENT, run=RUN, attempt=0, directory=node_0, live=0)
    evidence = read_run(s3, BUCKET, EXPERIMENT, RUN)
    assert evidence.rank_files_from == "attempt-00000/live-00000, attempt-00000/node-00001/live-00000"
    verdict = which_rank(*evidence.ranks())
    assert verdict is not None and (verdict.rank, verdict.how, verdict.waiting) == (
        3,
        "hung",
        {"all_reduce": [0, 1, 2]},
    )
    inputs = DoctorInputs(team="demo", experiment=EXPERIMENT, run=RUN, bucket=BUCKET, region="us-east-1", s3=s3,
                          cloudwatch=aws.client("cloudwatch"))  # fmt: skip
    (named,) = [v for v in diagnose(inputs).verdicts if v.check == "rank"]
    assert named.evidence.startswith("rank 3 on pod train-1, node node-1, instance type g6.12xlarge hung at step 51")
    assert named.fix.startswith(f"its stack: ranks/{live}stacks-rank-00003.txt (live snapshot: node 1's leader")


def test_an_earlier_jobs_restored_documents_are_not_this_attempts_and_node_1_uploads_its_own_ranks(
    aws: MotoServer, tmp_path: Path
) -> None:
    """A rerun on SageMaker restores every node's files of the earlier job on every node: node 1's directory holds
    rank 0's and rank 1's documents of an hour ago (ended), beside its own ranks 2-3, which stall now. Rank 0's old
    last word must not read as rank 0 covering the directory, nor as rank 0 gone silent: the leader uploads its own
    node's ranks, and nothing of the earlier job."""
    leader = leader_of_node_1(aws, tmp_path)
    now = time.time()
    earlier = [replace(doc(r, written=now - 3600), ended="finished") for r in (0, 1)]
    write(leader.directory, [*earlier, doc(2, written=now), doc(3, written=now)])
    assert leader.look(now) == 0
    live = "attempt-00000/node-00001/live-00000/"
    assert node_keys(aws) == sorted(live + n for n in (".complete", "rank-00002.json", "rank-00003.json",
                                                       "stacks-rank-00002.txt", "stacks-rank-00003.txt"))  # fmt: skip
    assert {r.rank for r in read_ranks(leader.directory, since=now - 60)} == {2, 3}
    assert {r.rank for r in read_ranks(leader.directory)} == {0, 1, 2, 3}


def test_on_a_shared_volume_with_rank_0_alive_a_node_leader_uploads_nothing_until_its_last_word_is_missing(
    aws: MotoServer, tmp_path: Path
) -> None:
    leader = leader_of_node_1(aws, tmp_path)
    now = time.time()
    write(leader.directory, [doc(r, written=now) for r in range(4)])
    assert leader.look(now) is None and node_keys(aws) == [], "rank 0's heartbeat covers the shared directory"
    write(leader.directory, [replace(doc(r, written=now), ended="" if r == 0 else "failed: RuntimeError")
                             for r in range(4)])  # fmt: skip
    # The attempt's end: rank 0 wrote no last word (killed). Its node's local rank 1 stands in for it (every
    # file); node 1's leader uploads its own node's ranks beside it.
    stand_in = NodeLeader(aws.client("s3"), settings=leader.settings, rank=1, node_rank=0, progress=ProgressClock())
    stand_in.finish()
    leader.finish()
    files = (rank_document_name, stacks_name)
    assert node_keys(aws) == sorted(
        [f"attempt-00000/node-00000/{f(r)}" for r in range(4) for f in files]
        + [f"attempt-00000/node-00001/{f(r)}" for r in (2, 3) for f in files]
    )
    documents, _ = read_run(aws.client("s3"), BUCKET, EXPERIMENT, RUN).ranks()
    assert [d.rank for d in documents] == [0, 1, 2, 3]


def test_at_the_end_each_leader_uploads_its_nodes_last_words_whoever_ends_first(
    aws: MotoServer, tmp_path: Path
) -> None:
    """Rank 0's last word is written, so it uploads next; but torchrun tears a node's surviving ranks down 30 s
    after one of them exits, and rank 0 may be the one cut short (finding 12 of issue 26). Each leader uploads its
    own node's ranks beside it, once each of them wrote its last word, or went quiet (killed), or two passes went by."""
    leader = leader_of_node_1(aws, tmp_path)
    clock = [time.time()]
    draining = [replace(doc(0, written=clock[0]), ended="failed: RuntimeError"), doc(1, written=clock[0]),
                replace(doc(2, written=clock[0]), ended="failed: RuntimeError"), doc(3, written=clock[0])]  # fmt: skip
    write(leader.directory, draining)
    slept: list[float] = []

    def rank_3_ends_a_moment_later(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds
        write(leader.directory, [replace(doc(3, written=clock[0]), ended="failed: RuntimeError")])

    leader.finish(clock=lambda: clock[0], sleep=rank_3_ends_a_moment_later)
    assert slept == [0.2], "it waited for rank 3's last word, and no longer"
    assert node_keys(aws) == sorted(f"attempt-00000/node-00001/{f(r)}" for r in (2, 3)
                                    for f in (rank_document_name, stacks_name))  # fmt: skip
    documents, _ = read_run(aws.client("s3"), BUCKET, EXPERIMENT, RUN).ranks()
    assert [(d.rank, d.ended) for d in documents] == [(2, "failed: RuntimeError"), (3, "failed: RuntimeError")]

    # Node 0's leader (local rank 1): rank 1 ended, rank 0 was killed outright (its document stopped being
    # rewritten), so it waits until rank 0 is quiet for two passes, then stands in for it with every file.
    stand_in = NodeLeader(aws.client("s3"), settings=leader.settings, rank=1, node_rank=0, progress=ProgressClock())
    killed = [doc(0, written=clock[0]), replace(doc(1, written=clock[0]), ended="failed: RuntimeError")]
    write(stand_in.directory, killed)
    waited: list[float] = []

    def nothing_changes(seconds: float) -> None:
        waited.append(seconds)
        clock[0] += seconds

    stand_in.finish(clock=lambda: clock[0], sleep=nothing_changes)
    passes = 2 * min(leader.settings.heartbeat_interval, 5.0)
    assert passes - 0.01 <= sum(waited) <= passes + 0.21, waited
    assert {k.rsplit("/", 1)[-1] for k in node_keys(aws) if "node-00000" in k} >= {"rank-00000.json", "rank-00001.json"}


# --- real processes: 4 gloo ranks as 2 torchrun "nodes" against moto ----------------------------------------
# No checkpoints: a rank frozen inside a checkpoint phase is "working" to the others until its phase goes stale
JOB = (
    *("--steps", "100000", "--step-sleep", "0.05", "--alarms", "false", "--stall-dump-after", "3"),
    *("--checkpoint-interval", "1000000"),
)


def doctor_inputs(as_writer: WriterSession, run: str) -> DoctorInputs:
    """The doctor's inputs for a smoke run of the writer's sandbox, read with its S3 and CloudWatch clients."""
    return DoctorInputs(team="demo", experiment="smoke", run=run, bucket=as_writer.bucket, region="us-east-1",
                        s3=as_writer.client("s3"), cloudwatch=as_writer.client("cloudwatch"))  # fmt: skip


def rank_verdict(inputs: DoctorInputs) -> str:
    evidence = read_run(inputs.s3, inputs.bucket, inputs.experiment, inputs.run)
    verdict = which_rank(*evidence.ranks())
    return "" if verdict is None else verdict.line()


def test_rank_0_frozen_by_sigstop_node_1s_leader_uploads_and_the_doctor_says_rank_0_went_silent(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """SIGSTOP freezes every thread of rank 0: its heartbeat, its signal thread, faulthandler's watchdog.
    Ranks 1-3 block in the next all_reduce and dump their stacks; node 1's leader (rank 2) sees rank 0's
    document go stale on the shared volume and uploads every rank's files in rank 0's stead."""
    harness = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)
    run = "nodes-frozen"
    port = free_port()
    nodes = [start_node(harness, node, port, "--run-id", run, *JOB) for node in (0, 1)]
    ranks_dir = tmp_path / "spool" / "smoke" / run / "ranks"
    s3 = as_writer.client("s3")
    inputs = doctor_inputs(as_writer, run)
    try:
        stepping = lambda: len(r := read_ranks(ranks_dir)) == 4 and min(d.step for d in r) >= 10  # noqa: E731
        assert wait_for(stepping, timeout=120), [p.poll() for p in nodes]
        (zero,) = [r for r in read_ranks(ranks_dir) if r.rank == 0]
        os.kill(zero.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        silent = wait_for(lambda: "went silent" in rank_verdict(inputs), timeout=90, interval=0.5)
        prefix = contract.run_prefix("smoke", run)
        assert silent, (rank_verdict(inputs), keys_under(s3, as_writer.bucket, f"{prefix}{contract.RANKS}/"))
        took = time.monotonic() - frozen
        print(f"named {took:.1f} s after the freeze")
        prefix = contract.run_prefix("smoke", run) + contract.RANKS + "/"
        uploaded = [k.removeprefix(prefix) for k in keys_under(s3, as_writer.bucket, prefix)]
        # Rank 1 (node 0's local rank 1) stands in for rank 0, node 1's leader uploading ranks 2-3 beside it; or, when
        # rank 1's document looked stale too (3 s here, on a loaded machine), node 1's leader stands in itself.
        # Either way every rank's document arrives, from the node leaders' live snapshots alone.
        assert all(k.startswith(("attempt-00000/node-00000/live-", "attempt-00000/node-00001/live-")) for k in uploaded)
        assert {k.rsplit("/", 1)[1] for k in uploaded} >= {rank_document_name(r) for r in range(4)}, uploaded
        (named,) = [v for v in diagnose(inputs).verdicts if v.check == "rank"]
        assert named.verdict == "silent", named
        assert named.evidence.startswith("rank 0 on pod train-0, node node-0 went silent at step "), named.evidence
        # In all_reduce, or in backward when the freeze caught rank 0 before DDP's gradient all-reduce (in C++).
        # Not always all three: a rank whose dump caught it between frames of no collective is not listed
        # (a run here saw "2 rank(s) wait in all_reduce (2, 3)"); whoever is listed waits, and is not rank 0.
        collective = "(?:all_reduce|DDP's gradient all_reduce)"
        waiting = re.search(
            rf"; (?:\d rank\(s\) wait in {collective} \(([\d, ]+)\)|rank (\d) waits in {collective})", named.evidence
        )
        assert waiting, named
        assert {int(r) for r in (waiting.group(1) or waiting.group(2)).split(", ")} <= {1, 2, 3}, named
        assert named.fix.startswith("no stack dump"), named.fix
        if "flight recorder" in named.evidence:  # the frozen rank wrote none: the others' agreement is not about it
            assert re.search(r"flight recorder: no dump from rank\(s\) 0\b", named.evidence), named.evidence
    finally:
        for node in nodes:
            signal_group(node, signal.SIGKILL)
            node.communicate(timeout=60)


def test_a_single_node_jobs_frozen_rank_0_is_named_from_what_its_local_rank_1_uploads(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """One node, two ranks: no other node's leader. Rank 0 frozen by SIGSTOP uploads nothing; its node's local rank
    1 sees its document go stale, stands in and uploads both ranks' files, and the doctor names rank 0."""
    harness = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)
    run = "one-node-frozen"
    job = harness.start("--run-id", run, *JOB, ranks=2)
    ranks_dir = tmp_path / "spool" / "smoke" / run / "ranks"
    s3 = as_writer.client("s3")
    inputs = doctor_inputs(as_writer, run)
    try:
        stepping = lambda: len(r := read_ranks(ranks_dir)) == 2 and min(d.step for d in r) >= 10  # noqa: E731
        assert wait_for(stepping, timeout=120), job.poll()
        (zero,) = [r for r in read_ranks(ranks_dir) if r.rank == 0]
        os.kill(zero.pid, signal.SIGSTOP)
        silent = wait_for(lambda: "went silent" in rank_verdict(inputs), timeout=90, interval=0.5)
        prefix = contract.run_prefix("smoke", run) + contract.RANKS + "/"
        uploaded = [k.removeprefix(prefix) for k in keys_under(s3, as_writer.bucket, prefix)]
        assert silent, (rank_verdict(inputs), uploaded)
        assert uploaded and all(k.startswith("attempt-00000/node-00000/live-") for k in uploaded), uploaded
        assert {k.rsplit("/", 1)[1] for k in uploaded} >= {rank_document_name(0), rank_document_name(1)}
        assert rank_verdict(inputs).startswith("rank 0 ") and "went silent at step " in rank_verdict(inputs)
    finally:
        signal_group(job, signal.SIGKILL)
        job.communicate(timeout=60)


def test_node_local_directories_node_1s_leader_uploads_ranks_2_and_3_and_the_doctor_names_rank_3(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """SageMaker-like: each node's spool (and ranks directory) is its own. Rank 3 hangs after step 20:
    rank 0 sees and uploads ranks 0-1 alone; node 1's leader uploads ranks 2-3, rank 3's stack among them."""
    harness = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)
    run = "nodes-local"
    port = free_port()
    hang = ("--hang-after-step", "20", "--hang-rank", "3")
    nodes = [
        start_node(harness, node, port, "--run-id", run, *JOB, *hang, "--spool-dir", str(tmp_path / f"node-{node}"))
        for node in (0, 1)
    ]
    s3 = as_writer.client("s3")
    inputs = doctor_inputs(as_writer, run)
    try:

        def named_3() -> bool:  # with rank 0's own snapshot of ranks 0-1 merged in: they wait too
            line = rank_verdict(inputs)
            return line.startswith("rank 3 on pod train-1, node node-1 hung at step 21") and "(0, 1, 2)" in line

        assert wait_for(named_3, timeout=150, interval=0.5), (rank_verdict(inputs), [p.poll() for p in nodes])
        for number in (0, 1):
            local = {d.rank for d in read_ranks(tmp_path / f"node-{number}" / "smoke" / run / "ranks")}
            assert local == {2 * number, 2 * number + 1}, "each node's directory holds its own ranks alone"
        # Each node's documents are on the board (torchrun's store, hosted by node 0's launcher), for the other:
        # rank 0 counts ranks 2-3's phases and ages with its own (`beacon.evidence.rank_board`).
        board = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        on_board = {node: {d["rank"] for d in json.loads(board.get(board_key(node)))["documents"]} for node in (0, 1)}
        assert on_board == {0: {0, 1}, 1: {2, 3}}, on_board
        evidence = read_run(s3, as_writer.bucket, "smoke", run)
        assert evidence.rank_file_keys[stacks_name(3)].split("/ranks/")[1].startswith("attempt-00000/node-00001/live-")
        assert evidence.rank_file_keys[stacks_name(0)].split("/ranks/")[1].startswith("attempt-00000/live-")
        (named,) = [v for v in diagnose(inputs).verdicts if v.check == "rank"]
        assert "; 3 rank(s) wait in all_reduce (0, 1, 2)" in named.evidence, named.evidence
        assert "smoke_job/job.py" in named.evidence and "(live snapshot: node 1's leader" in named.fix, named
    finally:
        for node in nodes:
            signal_group(node, signal.SIGKILL)
            node.communicate(timeout=60)
