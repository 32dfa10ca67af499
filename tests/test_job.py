"""The bundled training job, as real processes against a real moto server with IAM enforced.

Every test runs `python -m training.train` (or torchrun) as a subprocess acting as the writer role.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from tests.conftest import WriterSession
from tests.job_harness import JobHarness, delivered_records, finish, keys_under, signal_group, wait_for
from training import contract


@pytest.fixture
def harness(as_writer: WriterSession, tmp_path: Path) -> JobHarness:
    return JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)


def assert_exactly_once(records: list[dict[str, Any]], steps: int) -> None:
    assert sorted(r["step"] for r in records) == list(range(steps)), "every step once, no gap, no duplicate"
    assert sorted(r["seq"] for r in records) == list(range(steps)), "the record sequence has no gap"
    assert {r["rank"] for r in records} == {0}
    assert all({"run", "rank", "step", "loss", "wall_time"} <= set(r) for r in records)


def test_a_smoke_run_delivers_every_record_once_and_its_loss_goes_down(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    result = harness.run("--run-id", "smoke-1", "--steps", "200", "--checkpoint-interval", "100")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = result.summary
    records = delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "smoke-1")
    assert_exactly_once(records, 200)
    losses = [float(r["loss"]) for r in sorted(records, key=lambda r: r["step"])]
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
    losses = [float(r["loss"]) for r in sorted(records, key=lambda r: r["step"])]
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
    """Kubernetes and SageMaker signal the container's first process only: training.launch (torchrun)."""
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
    assert_exactly_once(delivered_records(as_writer.client("s3"), as_writer.bucket, "smoke", "kill-1"), 300)


def test_the_heartbeat_file_is_touched_while_the_job_runs(harness: JobHarness) -> None:
    process = harness.start("--run-id", "hb-1", "--steps", "400", "--step-sleep", "0.02")
    try:
        assert wait_for(lambda: (harness.workdir / "heartbeat").exists(), timeout=30)
        first = (harness.workdir / "heartbeat").stat().st_mtime
        assert wait_for(lambda: (harness.workdir / "heartbeat").stat().st_mtime > first, timeout=10)
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
