"""The bundled training job, as real processes against a real moto server with IAM enforced.

Every test runs `python -m smoke_job.train` (or torchrun) as a subprocess acting as the writer role.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from beacon import contract, kill_points
from beacon.contract.goodput import Category
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from beacon_ops.evidence.goodput import run_ledger
from beacon_ops.evidence.reading import read_run
from tests.conftest import WriterSession
from tests.support.fault_proxy import FaultPlan, FaultProxy
from tests.support.job_harness import (
    JobHarness,
    assert_live_history_once,
    delivered_records,
    finish,
    keys_under,
    preflight_seconds,
    signal_group,
    wait_for,
)
from tests.support.synth import ROOT
from workloads import manifests


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    """The job against moto behind the bucket policy's conditions, as strict as S3."""
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def assert_exactly_once(records: list[contract.Record], steps: int) -> contract.History:
    history = assert_live_history_once(records, steps)
    assert {r.rank for r in records} == {0}
    assert all(r.run and r.wall_time > 0 for r in records)
    assert all(r.loss is not None for r in history.live), "every step the model went through has its loss"
    # A step a kill caught before the spool thread read its tensor loss comes back from the journal without it
    # (the restart names the value lost); the restart then went through that step again, so it is superseded
    without = [(r.attempt, r.step) for r in records if r.loss is None]
    assert set(without) <= {(r.attempt, r.step) for r in history.superseded}, without
    return history


def test_a_smoke_run_delivers_every_record_once_and_its_loss_goes_down(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    result = harness.run("--run-id", "smoke-1", "--steps", "200", "--checkpoint-interval", "100")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "smoke-1")
    assert_exactly_once(records, 200)
    losses = [float(r.metrics["loss"]) for r in sorted(records, key=lambda r: r.step)]
    # The stored loss band for seed 1234: ~2.3 at the start, under 0.3 by the end.
    assert 2.0 < sum(losses[:20]) / 20 < 2.6
    assert sum(losses[-20:]) / 20 < 0.3
    assert summary["delivery"]["unacknowledged_records"] == 0
    assert summary["checkpoints"] == [99, 199]
    checkpoints = keys_under(
        as_writer.client("s3"), as_writer.bucket, contract.run_prefix("smoke", "smoke-1") + "checkpoints/"
    )
    assert checkpoints[-1].endswith("step-00000199.pt")


def test_tensorboard_files_are_whole_files_readable_by_tensorboard(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    assert harness.run("--run-id", "tb-1", "--steps", "60", "--step-sleep", "0.02").returncode == 0
    s3 = as_writer.client("s3")
    keys = keys_under(s3, as_writer.bucket, contract.run_prefix("smoke", "tb-1") + "tensorboard/")
    assert len(keys) >= 2, "one file per flush"
    steps: list[int] = []
    for index, key in enumerate(keys):
        path = harness.workdir / f"events-{index}"
        path.write_bytes(s3.get_object(Bucket=as_writer.bucket, Key=key)["Body"].read())
        for event in EventFileLoader(str(path)).Load():
            steps.extend(event.step for value in event.summary.value if value.tag == "loss")
    assert sorted(steps) == list(range(60))


def test_only_rank_0_touches_the_sinks_with_two_ranks_on_cpu(harness: JobHarness, as_writer: WriterSession) -> None:
    result = harness.run("--run-id", "ddp-1", "--steps", "120", "--workers", "1", ranks=2)
    assert result.returncode == 0, result.stderr[-3000:]
    by_rank = {s["rank"]: s for s in result.summaries}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0]["world_size"] == 2
    assert by_rank[1]["aws_requests"] == 0 and by_rank[1]["writes_sinks"] is False
    assert by_rank[0]["aws_requests"] > 0
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "ddp-1")
    assert_exactly_once(records, 120)
    losses = [float(r.metrics["loss"]) for r in sorted(records, key=lambda r: r.step)]
    assert sum(losses[-20:]) / 20 < sum(losses[:20]) / 20 - 0.5, "the loss went down"
    prefix = contract.run_prefix("smoke", "ddp-1")
    assert keys_under(as_writer.client("s3"), as_writer.bucket, prefix + "checkpoints/"), "a checkpoint exists"
    assert not (harness.workdir / "spool" / "smoke" / "ddp-1" / "rank-1").exists()


def test_sigterm_mid_run_delivers_everything_and_exits_0_within_the_budget(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    process = harness.start("--run-id", "term-1", "--steps", "5000", "--step-sleep", "0.02", "--shutdown-budget", "20")
    spool = harness.workdir / "spool" / "smoke" / "term-1"
    assert wait_for(
        lambda: (
            len(list((spool / "sealed").glob("*")))
            + len(
                keys_under(as_writer.client("s3"), as_writer.bucket, contract.run_prefix("smoke", "term-1") + "events/")
            )
            >= 2
        ),
        timeout=60,
    )
    signalled = time.monotonic()
    signal_group(process, signal.SIGTERM)
    result = finish(process, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert time.monotonic() - signalled < 20 + 5
    summary = result.summary
    assert summary["stopped_by_signal"] is True
    steps_done = summary["last_step"] + 1
    assert 0 < steps_done < 5000
    assert_exactly_once(delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "term-1"), steps_done)
    assert summary["delivery"]["pending_chunks"] == 0


def test_sigterm_to_the_container_launcher_alone_drains_both_ranks_and_exits_0(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    """Kubernetes and SageMaker signal the container's first process only: beacon.launch (torchrun)."""
    common = ("--run-id", "term-launch", "--steps", "5000", "--step-sleep", "0.02", "--shutdown-budget", "20")
    process = harness.start(*common, ranks=2, launcher="container")
    prefix = contract.run_prefix("smoke", "term-launch") + "events/"
    assert wait_for(lambda: len(keys_under(as_writer.client("s3"), as_writer.bucket, prefix)) >= 1, timeout=90)
    process.send_signal(signal.SIGTERM)
    result = finish(process, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    assert summary["stopped_by_signal"] is True and summary["delivery"]["pending_chunks"] == 0
    steps_done = summary["last_step"] + 1
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "term-launch")
    assert_exactly_once(records, steps_done)


def test_sigkill_then_restart_with_the_same_run_loses_and_duplicates_nothing(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    common = ("--run-id", "kill-1", "--steps", "300", "--checkpoint-interval", "40")
    process = harness.start(*common, "--step-sleep", "0.03")
    latest = harness.workdir / "checkpoints" / "smoke" / "kill-1" / "latest.json"
    assert wait_for(latest.exists, timeout=60)
    time.sleep(1.5)  # some steps after the checkpoint: they must be neither lost nor repeated
    signal_group(process, signal.SIGKILL)
    process.communicate(timeout=30)
    resumed = harness.run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["start_step"] > 0, "restored model, optimizer and step from the checkpoint"
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "kill-1")
    assert_exactly_once(records, 300)
    # The goodput ledger (issue 30) of this real run: the steps attempt 0 did after its checkpoint, lost at the kill
    # and done again, are its wasted progress, to the second of their records.
    superseded = {(r.attempt, r.step) for r in contract.history(records).superseded}
    first = sorted((r for r in records if r.attempt == 0), key=lambda r: r.seq)
    redone = sum(b.wall_time - a.wall_time for a, b in itertools.pairwise(first) if (b.attempt, b.step) in superseded)
    book = run_ledger(read_run(as_writer.client("s3"), as_writer.bucket, "smoke", "kill-1"))
    assert redone > 0 and book.seconds[Category.WASTED_PROGRESS] == pytest.approx(redone, abs=1e-6)
    assert book.seconds[Category.PRODUCTIVE] > 0 and book.seconds[Category.RESTART_GAP] > 0


def test_the_heartbeat_file_is_touched_while_the_job_runs(harness: JobHarness) -> None:
    process = harness.start("--run-id", "hb-1", "--steps", "400", "--step-sleep", "0.02")
    try:
        assert wait_for(harness.liveness_file().exists, timeout=30)
        first = harness.liveness_file().stat().st_mtime
        assert wait_for(lambda: harness.liveness_file().stat().st_mtime > first, timeout=10)
    finally:
        signal_group(process, signal.SIGTERM)
        finish(process, timeout=60)


def test_metrics_of_the_contract_reach_cloudwatch(harness: JobHarness, as_writer: WriterSession) -> None:
    assert harness.run("--run-id", "cw-1", "--steps", "80", "--step-sleep", "0.02").returncode == 0
    as_writer.aws.reset_auth_only()
    listed = as_writer.aws.client("cloudwatch").list_metrics(Namespace=contract.metric_namespace("demo"))["Metrics"]
    names = {m["MetricName"] for m in listed if {"Name": "Run", "Value": "cw-1"} in m["Dimensions"]}
    for metric in (
        contract.HEARTBEAT,
        contract.PROGRESS_AGE,
        contract.LOSS,
        contract.STEP,
        contract.STEPS_PER_SECOND,
        contract.SPOOL_BACKLOG,
        contract.UPLOAD_FAILURES,
        contract.UPLOAD_LATENCY,
    ):
        assert metric.name in names, metric.name
    team = {m["MetricName"] for m in listed if m["Dimensions"] == [{"Name": "Team", "Value": "demo"}]}
    assert {contract.SPOOL_BACKLOG.name, contract.UPLOAD_FAILURES.name} <= team


def test_min_duration_spreads_the_steps_so_a_short_run_lasts_long_enough(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    """The smoke job uses it so its run alarms arm; nothing is skipped or repeated for it."""
    result = harness.run("--run-id", "paced-1", "--steps", "20", "--min-duration", "4")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.summary["loop_seconds"] >= 4 * 19 / 20
    assert_exactly_once(delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "paced-1"), 20)


@pytest.mark.parametrize(
    ("point", "nth"),
    [
        (kill_points.SEAL_STATE_WRITTEN, 3),
        (kill_points.SEAL_RENAMED, 3),
        (kill_points.UPLOADED_NOT_ACKNOWLEDGED, 2),
        (kill_points.CHECKPOINT_WRITTEN, 2),
        (kill_points.CHECKPOINT_PROMOTED, 2),
    ],
)
def test_killed_at_a_durable_state_transition_then_restarted_every_step_arrives_exactly_once(
    harness: JobHarness, as_writer: WriterSession, point: str, nth: int
) -> None:
    run = f"kp-{point.replace(':', '-')}"
    common = ("--run-id", run, "--steps", "300", "--checkpoint-interval", "40", "--chunk-records", "20")
    killed = subprocess.run(
        [sys.executable, "-m", "tests.support.kill_point_job", point, str(nth), *harness.args(*common)],
        cwd=ROOT,
        env=harness.env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = harness.run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    history = assert_exactly_once(delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", run), 300)
    assert history.attempts == [0, 1], "the restart is the run's second attempt"
    resumed_at = resumed.summary["start_step"]
    assert {r.step for r in history.superseded} <= set(range(resumed_at, 300)), "only steps gone through again"
    assert all(r.attempt == 1 for r in history.live if r.step >= resumed_at)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_every_pod_of_a_two_node_job_passes_its_own_probes_while_it_trains(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """The rendered Indexed Job, run as its two pods would run it (two torchrun nodes rendezvousing
    on loopback), and each pod's startup and liveness probe commands executed on that pod's paths.
    Before, only rank 0 touched the heartbeat file: pod 1 failed its startup probe and was killed."""
    spec = manifests.SmokeJobSpec(
        team="demo", image="i", bucket=as_writer.bucket, region="us-east-1", uid=1000, gid=1000, nodes=2,
        steps=100000, heartbeat_interval=1, shutdown_budget=20, workers=0,
    )  # fmt: skip
    job, _service = manifests.smoke_job(spec)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    port = free_port()
    volume = tmp_path / "volume"

    def on_pod(value: str, index: int) -> str:
        value = value.replace("$(JOB_COMPLETION_INDEX)", str(index))
        value = value.replace(manifests.ARTIFACTS_MOUNT, str(volume))
        value = value.replace(manifests.RUNTIME_DIR, str(tmp_path / f"pod-{index}"))
        if value.startswith("--master-addr="):
            return "--master-addr=127.0.0.1"
        return f"--master-port={port}" if value.startswith("--master-port=") else value

    harness = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)
    pods = []
    for index in range(2):
        (tmp_path / f"pod-{index}").mkdir()
        downward = {"metadata.name": f"train-{index}", "spec.nodeName": f"node-{index}"}  # what the kubelet fills in
        rendered = {
            e["name"]: on_pod(e["value"], index) if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
            for e in container["env"]
        }
        env = {**harness.env(), **rendered}
        command = [sys.executable if part == "python" else part for part in container["command"]]
        args = [on_pod(arg, index) for arg in container["args"]]
        pods.append(subprocess.Popen([*command, *args], cwd=ROOT, env=env, text=True, start_new_session=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip

    def probe(index: int, kind: str) -> bool:
        command = [on_pod(part, index) for part in container[kind]["exec"]["command"]]
        return subprocess.run(command, capture_output=True, check=False).returncode == 0

    try:
        prefix = contract.run_prefix("smoke", spec.name) + "events/"
        assert wait_for(lambda: len(keys_under(as_writer.client("s3"), as_writer.bucket, prefix)) >= 1, timeout=120)
        for index in range(2):
            assert probe(index, "startupProbe"), f"pod {index} passes its startup probe"
            assert probe(index, "livenessProbe"), f"pod {index} passes its liveness probe"
    finally:
        for pod in pods:
            pod.send_signal(signal.SIGTERM)  # the container's first process, as the kubelet does
        results = [finish(pod, timeout=120) for pod in pods]
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]


def test_a_run_continued_on_a_new_volume_delivers_after_what_s3_holds_and_never_wedges(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """A reused run id on an empty volume (a new PVC, an emptyDir, a partial SageMaker restore):
    before, its first chunk met S3's chunk-00000000 with other bytes, and every retry failed."""
    first = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path / "old-volume", as_writer.credentials)
    assert first.run("--run-id", "moved", "--steps", "100").returncode == 0
    second = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path / "new-volume", as_writer.credentials)
    result = second.run("--run-id", "moved", "--steps", "200", timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.summary["delivery"]["upload_failures"] == 0
    assert_exactly_once(delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "moved"), 200)


def test_a_spool_whose_pending_chunk_conflicts_with_s3_is_refused_at_once_naming_the_run(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    first = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path / "one", as_writer.credentials)
    assert first.run("--run-id", "twice", "--steps", "30").returncode == 0
    other = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path / "two", as_writer.credentials)
    sealed = tmp_path / "two" / "spool" / "smoke" / "twice" / "sealed"
    sealed.mkdir(parents=True)
    (sealed / "chunk-00000000.jsonl").write_bytes(contract.Record("smoke", "twice", 0, {"loss": 9.0}, 0.0, 0).to_line())
    result = other.run("--run-id", "twice", "--steps", "30", timeout=60)
    assert result.returncode == 3, result.stderr[-3000:]
    assert preflight_seconds(result.stderr) < 20, "timed inside the job: interpreter start-up is not the refusal"
    (line,) = result.error_lines
    assert "run 'twice': chunk 0 in the spool" in line and "differs from s3://" in line
    assert (sealed / "chunk-00000000.jsonl").exists(), "the spool keeps its records"


def test_a_restore_that_brings_back_checkpoints_but_not_the_spool_replays_the_steps_in_between(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """SageMaker restores /opt/ml/checkpoints file by file, in no order: `latest` can come back newer
    than the spool. Here S3 becomes unreachable, checkpoints go on advancing past what S3 holds, the
    job is killed, and only the checkpoints come back. Resuming at `latest` would lose every step
    between S3's last record and it; the job resumes earlier and replays them."""
    proxy = FaultProxy(as_writer.aws.url, FaultPlan()).start()
    try:
        harness = JobHarness(proxy.url, as_writer.bucket, tmp_path, as_writer.credentials)
        common = ("--run-id", "restored", "--steps", "400", "--checkpoint-interval", "40", "--chunk-records", "20")
        process = harness.start(*common, "--step-sleep", "0.02")
        prefix = contract.run_prefix("smoke", "restored") + "events/"
        s3 = as_writer.client("s3")
        assert wait_for(lambda: len(keys_under(s3, as_writer.bucket, prefix)) >= 2, timeout=90)
        proxy.unreachable(600, services=("s3",))
        delivered = max((r.step for r in delivered_records(s3, as_writer.bucket, "smoke", "restored")), default=-1)
        latest = tmp_path / "checkpoints" / "smoke" / "restored" / "latest.json"
        ahead = lambda: latest.exists() and json.loads(latest.read_text())["step"] > delivered + 40  # noqa: E731
        assert wait_for(ahead, timeout=90), "checkpoints advanced past what S3 holds"
        signal_group(process, signal.SIGKILL)
        process.communicate(timeout=30)
    finally:
        proxy.stop()
    shutil.rmtree(tmp_path / "spool")  # the restore brought back the checkpoints only
    direct = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)
    resumed = direct.run(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.summary["start_step"] <= delivered + 1
    assert_exactly_once(delivered_records(s3, as_writer.bucket, "smoke", "restored"), 400)
