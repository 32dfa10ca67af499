"""Which rank, while the run still hangs (issue 17): rank 0's heartbeat uploads a live snapshot of the
ranks' evidence once a rank stalls, so the alarm's function, which reads S3 only, names the rank before
the attempt ends. The heartbeat runs in-process against the embedded AWS; the documents say their
ages, so no clock is scaled and nothing sleeps."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from beacon import contract
from beacon.contract.rank_evidence import RankProgress, rank_document_name, stacks_name
from beacon.evidence.live_evidence import LiveEvidence, RanksDirectory, StallWatch
from beacon.evidence.progress import ProgressClock
from beacon.evidence.ranks import LiveSnapshots, upload_rank_evidence
from beacon.log.spool import Spool
from beacon.telemetry import Telemetry
from smoke_job.config import parse_args

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.doctor.rank_verdict import which_rank
from beacon_ops.evidence.reading import rank_keys, read_run
from tests.support.job_harness import keys_under
from tests.support.metric_history import sent_every_beat
from tests.support.moto_server import MotoServer
from tests.support.synchronous_ranks import Clock

BUCKET, EXPERIMENT, RUN = "beacon-demo-live", "smoke", "r1"
STALL = 90.0  # stall_dump_after, as deployed
FORWARD = '  File "/app/model.py", line 41 in forward\n  File "/app/train.py", line 88 in train_step\n'
ALL_REDUCE = (
    '  File "/venv/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
    '  File "/app/train.py", line 88 in train_step\n'
)


def document(rank: int, *, age: float, phase: str = "training", step: int = 50, dumps: int = 1) -> RankProgress:
    now = time.time()
    return RankProgress(rank, rank % 2, 4, step, phase, age, now, now - age, 100 + rank, f"train-{rank // 2}",
                        f"node-{rank // 2}", "g6.12xlarge", dumps)  # fmt: skip


def stack_dump(rank: int, frames: str) -> str:
    return (
        f"--- rank {rank} pid {100 + rank} at 1.0, step 50: no progress for 95 s after step 50\n"
        "Thread 0x1 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 1032 in _bootstrap\n\n'
        f"Current thread 0x2 (most recent call first):\n{frames}"
    )


def write_ranks(directory: Path, documents: list[RankProgress], *, dumped: bool = True) -> None:
    """The ranks directory as the ranks' own writers leave it on the volume (`beacon.evidence.ranks`)."""
    directory.mkdir(parents=True, exist_ok=True)
    for d in documents:
        (directory / rank_document_name(d.rank)).write_text(json.dumps(asdict(d)))
        if dumped:
            (directory / stacks_name(d.rank)).write_text(stack_dump(d.rank, FORWARD if d.rank == 3 else ALL_REDUCE))


def hung(*, rank3_age: float = 100.0) -> list[RankProgress]:
    """Rank 3 stopped in forward; ranks 0-2 wait in the next all_reduce, their progress stopped too."""
    return [document(r, age=rank3_age if r == 3 else rank3_age - 1) for r in range(4)]


@pytest.fixture
def aws(moto_server: MotoServer) -> MotoServer:
    moto_server.client("s3").create_bucket(Bucket=BUCKET)
    return moto_server


def rank_0(
    aws: MotoServer, tmp_path: Path, progress: ProgressClock | None = None, *, more: dict[str, str] | None = None
) -> Telemetry:
    """Rank 0's telemetry of a 4-rank run, as `beacon.run` builds it (ranks_dir set for world size > 1)."""
    flags = {"--bucket": BUCKET, "--experiment": EXPERIMENT, "--run-id": RUN, "--stall-dump-after": str(STALL)}
    flags |= more or {}
    config = parse_args([part for pair in flags.items() for part in pair]).settings
    sink = Telemetry(config, s3=aws.client("s3"), cloudwatch=aws.client("cloudwatch"),
                     progress=progress or ProgressClock(), spool=Spool(tmp_path / "spool"), run_alarms=None,
                     ranks_dir=tmp_path / "ranks")  # fmt: skip
    return sink


def live(sink: Telemetry) -> LiveEvidence:
    assert sink.evidence is not None, "rank 0 of a run with a ranks directory"
    return sink.evidence


def beat(sink: Telemetry) -> None:
    sink.heartbeat.beat()
    assert live(sink).wait(timeout=30)


def ranks_keys(aws: MotoServer) -> list[str]:
    return sorted(keys_under(aws.client("s3"), BUCKET, f"{contract.run_prefix(EXPERIMENT, RUN)}{contract.RANKS}/"))


def snapshot_keys(snapshot: int, *names: str) -> list[str]:
    return sorted(contract.live_rank_evidence_key(EXPERIMENT, RUN, 0, snapshot, name) for name in names)


EVERY_FILE = (contract.LIVE_SNAPSHOT_COMPLETE, *(f(r) for r in range(4) for f in (rank_document_name, stacks_name)))


def test_a_stalled_rank_makes_rank_0s_heartbeat_upload_a_live_snapshot_that_names_it(
    aws: MotoServer, tmp_path: Path
) -> None:
    sink = rank_0(aws, tmp_path)
    write_ranks(tmp_path / "ranks", hung(rank3_age=STALL + 1))
    beat(sink)
    assert ranks_keys(aws) == [], "the ranks dump at stall_dump_after, each within a pass of its thread (5 s)"
    write_ranks(tmp_path / "ranks", hung())
    beat(sink)
    assert ranks_keys(aws) == snapshot_keys(0, *EVERY_FILE), "every file, then the marker: create-only, off the loop"
    evidence = read_run(aws.client("s3"), BUCKET, EXPERIMENT, RUN)
    assert evidence.rank_files_from == "attempt-00000/live-00000"
    assert set(evidence.rank_files) == set(EVERY_FILE) - {contract.LIVE_SNAPSHOT_COMPLETE}
    verdict = which_rank(*evidence.ranks())
    assert verdict is not None and (verdict.rank, verdict.how, verdict.step) == (3, "hung", 50)
    assert verdict.where == "/app/model.py:41 in forward" and verdict.waiting == {"all_reduce": [0, 1, 2]}


def test_one_snapshot_per_stall_and_a_refresh_only_when_the_evidence_changed_and_refresh_beats_went_by(
    aws: MotoServer, tmp_path: Path
) -> None:
    """The bound: per stall, 1 + beats / LIVE_REFRESH_BEATS snapshots at most, each one PutObject per
    file of the ranks directory and a marker; a hang that stays as it is costs one."""
    sink = rank_0(aws, tmp_path)
    refresh = live(sink).snapshots.refresh_beats
    ranks = tmp_path / "ranks"
    write_ranks(ranks, hung(), dumped=False)  # the ranks' own dumps come a beat later (their own clocks)
    beat(sink)
    first = ranks_keys(aws)
    assert first == snapshot_keys(0, contract.LIVE_SNAPSHOT_COMPLETE, *(rank_document_name(r) for r in range(4)))
    for _ in range(refresh + 2):
        write_ranks(ranks, hung(rank3_age=120), dumped=False)  # ages grow: not a change worth a request
        beat(sink)
    assert ranks_keys(aws) == first, "the same hang: no second snapshot"
    write_ranks(ranks, hung(rank3_age=130))  # now every rank has dumped its stacks
    beat(sink)
    assert ranks_keys(aws) == sorted(first + snapshot_keys(1, *EVERY_FILE)), "a refresh carries the dumps"
    (ranks / stacks_name(0)).write_text(stack_dump(0, ALL_REDUCE) * 2)
    for _ in range(refresh - 1):
        beat(sink)
    assert len(ranks_keys(aws)) == len(first) + len(EVERY_FILE), "at most one refresh per refresh_beats beats"
    beat(sink)
    assert contract.live_rank_evidence_key(EXPERIMENT, RUN, 0, 2, stacks_name(0)) in ranks_keys(aws)
    assert read_run(aws.client("s3"), BUCKET, EXPERIMENT, RUN).rank_files_from == "attempt-00000/live-00002"


def test_a_150_s_checkpoint_on_one_rank_while_the_others_wait_uploads_nothing(aws: MotoServer, tmp_path: Path) -> None:
    """Ranks 0-2 wait 150 s in the next collective (their progress ages say so) while rank 3 checkpoints:
    rank 0's clock follows rank 3's phase, so nothing is stalled."""
    sink = rank_0(aws, tmp_path)
    waiting = [document(r, age=150.0) for r in range(3)]
    write_ranks(tmp_path / "ranks", [*waiting, document(3, age=2.0, phase=contract.Phase.CHECKPOINT)])
    beat(sink)
    beat(sink)
    assert ranks_keys(aws) == []
    assert live(sink).snapshots.taken == 0
    write_ranks(tmp_path / "ranks", [*waiting, document(3, age=150.0)])  # back in training, and stuck there
    beat(sink)
    assert [k.rsplit("/", 2)[1] for k in ranks_keys(aws)] == ["live-00000"] * len(EVERY_FILE)


def test_a_stall_that_ends_and_comes_back_is_a_new_episode_with_its_own_snapshot() -> None:
    snapshots = LiveSnapshots(refresh_beats=4)
    assert snapshots.due(stalled=True, state=("a",)) == 0
    assert snapshots.due(stalled=True, state=("a",)) is None
    assert snapshots.due(stalled=False, state=None) is None
    assert snapshots.due(stalled=True, state=("a",), busy=True) is None, "never two uploads at once"
    assert snapshots.due(stalled=True, state=("a",)) == 1


def test_a_single_rank_run_snapshots_its_own_stall_and_sends_no_cross_rank_metrics(
    aws: MotoServer, tmp_path: Path
) -> None:
    """One rank, stuck in forward 100 s: its own stack (where it hangs) reaches S3 while it hangs, and the doctor
    shows it; the two cross-rank metrics are for runs of several ranks."""
    sink = rank_0(aws, tmp_path)
    assert not sink.heartbeat.cross_rank_metrics  # world size 1, as `beacon.run` builds it
    alone = replace(document(0, age=100.0), world_size=1)
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / rank_document_name(0)).write_text(json.dumps(asdict(alone)))
    (tmp_path / "ranks" / stacks_name(0)).write_text(stack_dump(0, FORWARD))
    beat(sink)
    assert ranks_keys(aws) == snapshot_keys(0, contract.LIVE_SNAPSHOT_COMPLETE, rank_document_name(0), stacks_name(0))
    listed = aws.client("cloudwatch").list_metrics(Namespace=contract.metric_namespace("demo"))["Metrics"]
    assert not {m["MetricName"] for m in listed} & {m.name for m in contract.RANK_METRICS}
    evidence = read_run(aws.client("s3"), BUCKET, EXPERIMENT, RUN)
    documents, stacks = evidence.ranks()
    verdict = which_rank(documents, stacks)
    assert verdict is not None and (verdict.rank, verdict.how) == (0, "hung")
    assert verdict.where == "/app/model.py:41 in forward" and verdict.stack[0] == verdict.where
    inputs = DoctorInputs("demo", EXPERIMENT, RUN, BUCKET, "us-east-1", aws.client("s3"), aws.client("cloudwatch"))
    (named,) = [v for v in diagnose(inputs, evidence=evidence).verdicts if v.check == "rank"]
    assert named.verdict == "hung" and named.evidence.startswith("rank 0 on pod train-0, node node-0"), named
    assert "stacks-rank-00000.txt (live snapshot: rank 0 uploaded it while the run hung)" in named.fix
    assert which_rank([replace(alone, ended="finished")], stacks) is None, "a run that finished hangs nowhere"
    assert which_rank([replace(alone, ended="failed: RuntimeError")], stacks) is None, "the failure is the cause"
    assert which_rank([replace(alone, step=60)], stacks) is None, "stepped on since that stall: it passed"
    killed = {0: stacks[0] + "--- rank 0 pid 100 at 2.0, step 50: received SIGTERM\n" + stacks[0].split("\n", 1)[1]}
    after = which_rank([replace(alone, ended="preempted")], killed)
    assert after is not None and after.how == "hung" and after.ended == "preempted", "hung, then the probe's kill"


# --- reading: the end of the attempt wins; else the newest complete snapshot of the newest attempt ------
def keys_of(*paths: str) -> list[str]:
    return [f"p/{contract.RANKS}/{path}" for path in paths]


def test_the_reader_prefers_the_attempts_own_files_then_the_newest_complete_snapshot() -> None:
    live0 = keys_of("attempt-00001/live-00000/rank-00003.json", "attempt-00001/live-00000/.complete")
    live1_partial = keys_of("attempt-00001/live-00001/rank-00000.json")
    final = keys_of("attempt-00001/rank-00000.json", "attempt-00001/rank-00003.json")
    older = keys_of("attempt-00000/rank-00000.json")
    assert rank_keys("p/", older + live0 + live1_partial) == (live0[:1], "attempt-00001/live-00000")
    assert rank_keys("p/", older + live1_partial) == (live1_partial, "attempt-00001/live-00001"), "better than none"
    assert rank_keys("p/", older + live0 + final) == (final, "attempt-00001")
    assert rank_keys("p/", older) == (older, "attempt-00000")
    assert rank_keys("p/", keys_of("attempt-00001/live-00000/.complete")) == ([], "attempt-00001/live-00000")
    assert rank_keys("p/", []) == ([], "")


def test_with_a_live_snapshot_and_the_attempts_end_in_s3_the_end_wins(aws: MotoServer, tmp_path: Path) -> None:
    s3: Any = aws.client("s3")
    write_ranks(tmp_path / "hung", hung())
    assert upload_rank_evidence(s3, bucket=BUCKET, experiment=EXPERIMENT, run=RUN, attempt=0,
                                directory=tmp_path / "hung", live=0) == 8  # fmt: skip
    ended = [replace(d, ended="preempted") for d in hung()]
    write_ranks(tmp_path / "ended", ended)
    upload_rank_evidence(s3, bucket=BUCKET, experiment=EXPERIMENT, run=RUN, attempt=0, directory=tmp_path / "ended")
    evidence = read_run(s3, BUCKET, EXPERIMENT, RUN)
    assert evidence.rank_files_from == "attempt-00000"
    documents, _ = evidence.ranks()
    assert {d.ended for d in documents} == {"preempted"}, "the attempt's last word, not the snapshot"


# --- a slow rank (issue 31): rank 0's heartbeat sends StragglerWaitShare and snapshots the ranks once ------------
def paced(rank: int, *, slow: int | None) -> RankProgress:
    """A rank's document after five minutes of 1.5 s steps under `run.watch`: `slow` waits least, the others 0.5 s."""
    return replace(document(rank, age=0.5, dumps=0), pace_steps=200, pace_window_s=301.0, pace_step_s=1.5,
                   pace_wait_s=0.01 if rank == slow else (0.5 if slow is not None else 0.02))  # fmt: skip


def test_a_slow_rank_is_sent_snapshotted_once_and_named_by_the_doctor_until_it_recovers(
    aws: MotoServer, tmp_path: Path
) -> None:
    sink = rank_0(aws, tmp_path)
    sink.heartbeat.cross_rank_metrics = True  # rank 0 of four, as `beacon.run` builds it
    write_ranks(tmp_path / "ranks", [paced(r, slow=2) for r in range(4)], dumped=False)
    # its earlier beats said so for minutes (the verdict's span: `contract.pace.rank_slow`)
    sent_every_beat(aws.client("cloudwatch"), "demo", EXPERIMENT, RUN, contract.STRAGGLER_WAIT_SHARE, 0.33)
    beat(sink)
    beat(sink)  # still slow: no second snapshot before SLOW_REFRESH_BEATS
    every_document = (contract.LIVE_SNAPSHOT_COMPLETE, *(rank_document_name(r) for r in range(4)))
    assert ranks_keys(aws) == snapshot_keys(0, *every_document)
    inputs = DoctorInputs("demo", EXPERIMENT, RUN, BUCKET, "us-east-1", aws.client("s3"), aws.client("cloudwatch"))

    def rank_check() -> Any:
        (check,) = [v for v in diagnose(inputs).verdicts if v.check == "rank"]
        return check

    named = rank_check()
    assert named.verdict == "slow", named
    assert named.evidence.startswith("rank 2 on pod train-1, node node-1, instance type g6.12xlarge is slow: the other "
                                     "ranks wait for it 33% of each 1.50 s step"), named  # fmt: skip
    write_ranks(tmp_path / "ranks", [paced(r, slow=None) for r in range(4)], dumped=False)  # it recovered
    beat(sink)
    recovered = rank_check()  # its last StragglerWaitShare says so; the snapshot still shows it slow
    assert recovered.verdict == "none stands out", recovered
    listed = aws.client("cloudwatch").list_metrics(Namespace=contract.metric_namespace("demo"))["Metrics"]
    assert contract.STRAGGLER_WAIT_SHARE.name in {m["MetricName"] for m in listed}


def test_a_teams_own_slow_rank_share_is_what_rank_0_and_the_doctor_hold_a_rank_to(
    aws: MotoServer, tmp_path: Path
) -> None:
    """A team that set monitoring.slow_rank_share = 0.4: a rank waited for 33% of each step is not slow for its run.
    Rank 0 (BEACON_SLOW_RANK_SHARE) takes no snapshot; the doctor reads the share from the run's preflight record."""
    sink = rank_0(aws, tmp_path, more={"--slow-rank-share": "0.4"})
    sink.heartbeat.cross_rank_metrics = True
    write_ranks(tmp_path / "ranks", [paced(r, slow=2) for r in range(4)], dumped=False)
    sent_every_beat(aws.client("cloudwatch"), "demo", EXPERIMENT, RUN, contract.STRAGGLER_WAIT_SHARE, 0.33)
    beat(sink)
    assert ranks_keys(aws) == [], "not slow at this run's share: no slow episode to snapshot"
    upload_rank_evidence(aws.client("s3"), bucket=BUCKET, experiment=EXPERIMENT, run=RUN, attempt=0,
                         directory=tmp_path / "ranks", live=0)  # fmt: skip
    inputs = DoctorInputs("demo", EXPERIMENT, RUN, BUCKET, "us-east-1", aws.client("s3"), aws.client("cloudwatch"))

    def rank_check() -> Any:
        (check,) = [v for v in diagnose(inputs).verdicts if v.check == "rank"]
        return check

    assert rank_check().verdict == "slow", "a run of another version (no share in its preflight): the default 25%"
    preflight = {"spool_dir": "/artifacts/spool", "spool_filesystem": "nfs4", "started_at": "2026-12-06T10:00:00+00:00",
                 "slow_rank_share": 0.4}  # fmt: skip
    aws.client("s3").put_object(Bucket=BUCKET, Key=contract.preflight_key(EXPERIMENT, RUN, "1-abc.json"),
                                Body=json.dumps(preflight).encode())  # fmt: skip
    assert rank_check().verdict == "none stands out"
    preflight["slow_rank_share"] = 25  # a percentage where a share belongs: not this run's rule, the default's
    aws.client("s3").put_object(Bucket=BUCKET, Key=contract.preflight_key(EXPERIMENT, RUN, "1-abc.json"),
                                Body=json.dumps(preflight).encode())  # fmt: skip
    assert rank_check().verdict == "slow"


def test_a_slow_episode_is_snapshotted_when_it_begins_then_every_slow_refresh_beats_numbered_with_the_stalls() -> None:
    snapshots = LiveSnapshots(refresh_beats=2, slow_refresh_beats=3)
    assert snapshots.due(stalled=False, state=None, slow=2) == 0
    assert [snapshots.due(stalled=False, state=None, slow=2) for _ in range(3)] == [None, None, 1]
    assert snapshots.due(stalled=False, state=None, slow=1) == 2, "another rank slowest: another episode, at once"
    assert snapshots.due(stalled=True, state=("a",)) == 3, "a stall is its own episode, in the same numbering"
    assert snapshots.due(stalled=False, state=None) is None
    assert snapshots.due(stalled=False, state=None, slow=1) == 4, "slow again after it was over: a new episode"


def test_a_hang_after_a_slow_spell_stops_the_share_so_the_slow_alarm_cannot_hide_it(
    aws: MotoServer, tmp_path: Path
) -> None:
    sink = rank_0(aws, tmp_path)
    sink.heartbeat.cross_rank_metrics = True
    frozen = [replace(paced(r, slow=2), progress_age=STALL + 10) for r in range(4)]  # windows frozen at the hang
    write_ranks(tmp_path / "ranks", frozen)
    beat(sink)
    listed = aws.client("cloudwatch").list_metrics(Namespace=contract.metric_namespace("demo"))["Metrics"]
    names = {m["MetricName"] for m in listed}
    assert contract.SLOWEST_RANK_PROGRESS_AGE.name in names and contract.STRAGGLER_WAIT_SHARE.name not in names


def test_the_doctor_says_a_slow_rank_it_cannot_place_yet_and_points_rank_0_at_its_own_work() -> None:
    from beacon_ops.doctor.diagnosis import _stopped_rank
    from beacon_ops.doctor.orchestrator import NodeView
    from beacon_ops.evidence.reading import RunEvidence

    unplaced, _ = _stopped_rank(RunEvidence(EXPERIMENT, RUN), None, slow_share=0.4)
    assert (unplaced.status, unplaced.verdict) == ("warn", "slow")
    assert "40% of each step" in unplaced.evidence and "no document in S3 places it yet" in unplaced.evidence
    files = {rank_document_name(r): json.dumps(asdict(paced(r, slow=0))).encode() for r in range(4)}
    rank_0_slow, _ = _stopped_rank(RunEvidence(EXPERIMENT, RUN, rank_files=files), None, slow_share=0.33)
    assert rank_0_slow.evidence.startswith("rank 0 on pod train-0") and rank_0_slow.fix.startswith("rank 0 does work")
    recovered, _ = _stopped_rank(RunEvidence(EXPERIMENT, RUN, rank_files=files), None, slow_share=None)
    assert recovered.verdict == "none stands out", "its heartbeat no longer says slow"
    # `beacon doctor` on EKS reads the job's nodes too: the slow rank's is placed as far as the API says
    node = NodeView("node-1", exists=True, instance_id="i-0abc", node_claim="gpu-x7k2p")
    files = {rank_document_name(r): json.dumps(asdict(paced(r, slow=2))).encode() for r in range(4)}
    placed, _ = _stopped_rank(RunEvidence(EXPERIMENT, RUN, rank_files=files), None, slow_share=0.33,
                              nodes={"node-1": node})  # fmt: skip
    assert placed.evidence.startswith(
        "rank 2 on pod train-1, node node-1, instance type g6.12xlarge is slow: the other ranks wait for it 33% of "
        "each 1.50 s step"
    ), placed
    assert "[node-1: instance i-0abc, NodeClaim gpu-x7k2p]" in placed.evidence, placed


# --- the stall check's own cadence (issue 31): rank 0 looks between heartbeats once its own progress stopped ------
def test_rank_0s_stall_check_uploads_the_snapshot_between_heartbeats_once_its_own_progress_stopped(
    aws: MotoServer, tmp_path: Path
) -> None:
    flags = {"--bucket": BUCKET, "--experiment": EXPERIMENT, "--run-id": RUN, "--stall-dump-after": str(STALL)}
    settings = parse_args([part for pair in flags.items() for part in pair]).settings
    clock = Clock(time.monotonic())
    evidence = LiveEvidence(aws.client("s3"), settings, progress=ProgressClock(clock))
    write_ranks(tmp_path / "ranks", hung())
    watch = StallWatch(evidence, RanksDirectory(tmp_path / "ranks", 0.0), lambda: 0, interval=0.05).start()
    try:
        time.sleep(0.5)
        assert ranks_keys(aws) == [], "rank 0 still steps: the directory is not even read"
        clock.t += STALL  # rank 0 waits in the collective the hung rank never joins
        deadline = time.monotonic() + 15
        while len(ranks_keys(aws)) < len(EVERY_FILE) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ranks_keys(aws) == snapshot_keys(0, *EVERY_FILE), "no heartbeat needed"
    finally:
        watch.stop()
        assert evidence.wait(timeout=30)


# --- the run slowed (issue 31): rank 0's heartbeat sends its step time over the baseline it keeps ------------------
def test_rank_0_sends_the_runs_step_time_over_its_kept_baseline_while_it_steps_and_no_rank_stands_out(
    aws: MotoServer, tmp_path: Path
) -> None:
    clock = Clock(time.monotonic())
    progress = ProgressClock(clock)
    sink = rank_0(aws, tmp_path, progress)
    sink.heartbeat.cross_rank_metrics = True

    def sent(ranks: list[RankProgress]) -> float | None:
        data, _ = sink.heartbeat.metric_batch(time.time(), ranks)
        ratios = [d["Value"] for d in data if d["MetricName"] == contract.STEP_TIME_RATIO.name]
        return ratios[0] if ratios else None

    def steps(count: int, seconds: float) -> None:
        for _ in range(count):
            clock.t += seconds
            progress.step_finished()

    healthy = [paced(r, slow=None) for r in range(4)]
    steps(200, 1.0)
    assert sent(healthy) is None, "its first window is not full: no baseline yet"
    steps(200, 1.0)
    assert sent(healthy) == pytest.approx(1.0), "the baseline, kept from here on"
    steps(400, 1.6)
    assert sent(healthy) == pytest.approx(1.6), "every rank slower alike"
    assert sent([paced(r, slow=2) for r in range(4)]) is None, "a rank stands out: the slow rank's alarm says it"
    clock.t += 60.0  # no step past the run's threshold (30 s at this pace): its frozen window says nothing
    assert sent(healthy) is None
