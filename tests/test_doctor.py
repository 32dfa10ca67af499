"""`beacon doctor` against a real moto server and real job processes: each verdict from its cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from beacon import contract
from beacon.contract.rank_evidence import RankProgress

from beacon_ops.doctor import diagnosis
from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from tests.conftest import WriterSession
from tests.support.cli import against, beacon
from tests.support.job_harness import JobHarness, signal_group, wait_for
from tests.support.moto_server import REGION
from tests.support.synth import ROOT


@pytest.fixture
def reader(as_writer: WriterSession) -> dict[str, str]:
    provisioned = as_writer.provisioned
    sts = as_writer.aws.client("sts", **provisioned.operator_keys)
    return provisioned.role_credentials(sts, provisioned.store.reader_role_arn, "doctor")


@pytest.fixture
def harness(as_writer: WriterSession, tmp_path: Path) -> JobHarness:
    return JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)


def doctor(
    as_writer: WriterSession,
    reader: dict[str, str],
    run: str,
    *,
    probe: dict[str, str] | None = None,
    stall_after_s: float | None = None,
) -> Diagnosis:
    return diagnose(
        DoctorInputs(
            team="demo",
            experiment="smoke",
            run=run,
            bucket=as_writer.bucket,
            region=REGION,
            s3=as_writer.aws.client("s3", **reader),
            cloudwatch=as_writer.aws.client("cloudwatch", **reader),
            probe_s3=as_writer.aws.client("s3", **(probe or as_writer.credentials)),
            stall_after_s=stall_after_s,
        )
    )


def verdict(result: Diagnosis, check: str) -> str:
    return next(v.verdict for v in result.verdicts if v.check == check)


def test_a_finished_run_is_finished_and_every_check_passes(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str]
) -> None:
    assert harness.run("--run-id", "doc-done", "--steps", "30").returncode == 0
    # The backlog the run last published while it ran (CloudWatch's, before its drain at the end) is older than
    # what its final state says it left: the doctor says the latter.
    as_writer.client("cloudwatch").put_metric_data(
        Namespace=contract.metric_namespace("demo"),
        MetricData=[{"MetricName": contract.SPOOL_BACKLOG.name, "Value": 48, "Unit": "Count",
                     "Dimensions": [{"Name": k, "Value": v} for k, v in
                                    contract.run_dimensions("demo", "smoke", "doc-done").items()]}],
    )  # fmt: skip
    result = doctor(as_writer, reader, "doc-done")
    assert result.diagnosis == "finished" and result.healthy
    delivery = next(v.evidence for v in result.verdicts if v.check == "delivery")
    assert "spool backlog 0 at its end" in delivery, delivery
    assert verdict(result, "job") == "succeeded"
    assert verdict(result, "permission") == "writable"
    assert verdict(result, "ranks") == "rank 0 only"
    assert verdict(result, "spool") == "persistent"
    assert verdict(result, "endpoint") == "reachable"
    assert [v.check for v in result.verdicts] == [
        "job",
        "liveness",
        "delivery",
        "permission",
        "endpoint",
        "ranks",
        "rank",
        "spool",
        "loss",
        "pace",
        "checkpoints",
        "evidence",
        "alarms",
    ], "in order of likelihood"
    assert verdict(result, "rank") == "not applicable", "one rank: no other to compare it with"
    assert verdict(result, "loss") == "finite"
    assert verdict(result, "checkpoints") == "on time"


def test_a_diverging_loss_is_named_without_hiding_that_the_run_is_alive(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str]
) -> None:
    """What the job sends instead of a NaN loss CloudWatch would refuse (tests/test_runtime_failures.py)."""
    assert harness.run("--run-id", "doc-nan", "--steps", "20").returncode == 0
    as_writer.client("cloudwatch").put_metric_data(
        Namespace=contract.metric_namespace("demo"),
        MetricData=[
            {
                "MetricName": contract.NON_FINITE_LOSS.name,
                "Dimensions": [
                    {"Name": k, "Value": v} for k, v in contract.run_dimensions("demo", "smoke", "doc-nan").items()
                ],
                "Value": 3.0,
                "Unit": contract.NON_FINITE_LOSS.unit.value,
            }
        ],
    )
    result = doctor(as_writer, reader, "doc-nan")
    assert verdict(result, "loss") == "diverging"
    assert result.diagnosis == "finished", "the records arrived: a diverging loss is not a lost one"


def test_a_running_job_is_healthy_and_silent_once_frozen_with_sigstop(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str]
) -> None:
    process = harness.start("--run-id", "doc-frozen", "--steps", "100000", "--step-sleep", "0.05")
    try:
        assert wait_for(lambda: doctor(as_writer, reader, "doc-frozen").diagnosis == "healthy", timeout=60)
        signal_group(process, signal.SIGSTOP)
        frozen = time.monotonic()
        assert wait_for(lambda: doctor(as_writer, reader, "doc-frozen").diagnosis == "silent", timeout=60)
        # Not after 3 beats of 1 s: CloudWatch's own publish-to-read delay would make a live run read as silent
        # between its beats (issue 27, finding 2); the window's floor is 30 s, plus the doctor's own reads. Counted
        # from the last beat, which came up to a beat (1 s) before the freeze, stamped to CloudWatch's second.
        assert diagnosis.SILENT_FLOOR_S <= time.monotonic() - frozen + 2 + 0.5 < 60
    finally:
        signal_group(process, signal.SIGKILL)
        process.wait(timeout=30)


def test_a_hung_loop_with_a_live_heartbeat_is_stalled_not_silent(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str]
) -> None:
    process = harness.start("--run-id", "doc-stall", "--steps", "1000", "--step-sleep", "3600")
    try:
        assert wait_for(
            lambda: doctor(as_writer, reader, "doc-stall", stall_after_s=4).diagnosis == "stalled", timeout=60
        )
    finally:
        signal_group(process, signal.SIGKILL)
        process.wait(timeout=30)


def test_a_job_identity_without_permission_is_diagnosed_as_permission(
    as_writer: WriterSession, reader: dict[str, str], tmp_path: Path
) -> None:
    nobody = as_writer.aws.user_without_rights("nobody")
    assert (
        JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, nobody).run("--run-id", "doc-denied").returncode == 3
    )
    result = doctor(as_writer, reader, "doc-denied", probe=nobody)
    assert result.diagnosis == "permission"
    assert verdict(result, "job") == "not started"


def test_two_writers_on_one_run_is_a_rank_collision(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str]
) -> None:
    assert harness.run("--run-id", "doc-ranks", "--steps", "10").returncode == 0
    stray = contract.Record("smoke", "doc-ranks", 3, {"loss": 1.0}, 0.0, seq=0, rank=1).to_line().decode()
    as_writer.client("s3").put_object(
        Bucket=as_writer.bucket,
        Key=contract.events_key("smoke", "doc-ranks", 999),
        Body=stray.encode(),
        IfNoneMatch="*",
    )
    assert doctor(as_writer, reader, "doc-ranks").diagnosis == "rank-collision"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a tmpfs at /dev/shm")
def test_a_spool_on_tmpfs_allowed_by_flag_is_still_called_out(
    harness: JobHarness, as_writer: WriterSession, reader: dict[str, str], tmp_path: Path
) -> None:
    spool = Path("/dev/shm") / f"beacon-doctor-{tmp_path.name}"
    result = harness.run(
        "--run-id", "doc-tmpfs", "--steps", "5", "--spool-dir", str(spool), "--allow-ephemeral-spool", "true"
    )
    assert result.returncode == 0
    assert doctor(as_writer, reader, "doc-tmpfs").diagnosis == "spool-not-persistent"


def test_the_cli_reads_options_from_the_environment_and_prints_json(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    assert harness.run("--run-id", "doc-cli", "--steps", "5").returncode == 0
    store = as_writer.provisioned.store
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
    env.update(
        AWS_ENDPOINT_URL=as_writer.aws.url,
        AWS_REGION=REGION,
        BEACON_BUCKET=store.bucket,
        BEACON_READER_ROLE_ARN=store.reader_role_arn,
        BEACON_WRITER_ROLE_ARN=store.writer_role_arn,
        AWS_ACCESS_KEY_ID=as_writer.provisioned.operator_keys["aws_access_key_id"],
        AWS_SECRET_ACCESS_KEY=as_writer.provisioned.operator_keys["aws_secret_access_key"],
    )
    done = subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "doctor", "--team", "demo", "--run", "doc-cli", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["diagnosis"] == "finished" and answer["healthy"] is True
    assert [v["check"] for v in answer["verdicts"]] == [
        *("orchestrator", "logs", "job", "liveness", "delivery", "permission", "endpoint"),
        *("ranks", "rank", "spool", "loss", "pace", "checkpoints", "evidence", "alarms"),
    ]
    # No cluster stack in this sandbox: the orchestrator's verdict says so, and how to fix it, without failing.
    orchestrator = answer["verdicts"][0]
    assert (orchestrator["check"], orchestrator["status"], orchestrator["verdict"]) == (
        "orchestrator",
        "info",
        "unreadable",
    )
    assert "beacon-demo-cluster" in orchestrator["evidence"] and "make deploy TEAM=demo" in orchestrator["fix"]


def test_the_cli_names_the_team_it_cannot_read(as_writer: WriterSession) -> None:
    done = beacon("doctor", "--team", "nosuch", "--run", "r", env=against(as_writer.aws.url))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("beacon doctor: ") and "unknown team 'nosuch'" in line


# --- the run's pace against its baseline (issue 31): the pace check on the heartbeat's StepTimeRatio -------------
class RatiosSent:
    """CloudWatch as the doctor reads it, holding only the StepTimeRatio the heartbeat sent (`ratio` every beat of the
    last `minutes`, the last one `then`)."""

    def __init__(self, ratio: float, minutes: int, *, last: float | None = None) -> None:
        from datetime import UTC, datetime, timedelta

        self.now = datetime.now(UTC)
        beats = [self.now - timedelta(seconds=ago) for ago in range(5, minutes * 60, 15)]
        self.points = [{"Timestamp": at, "Minimum": ratio} for at in beats]
        if last is not None:
            self.points[0]["Minimum"] = last

    def get_metric_statistics(self, **asked: object) -> dict[str, object]:
        return {"Datapoints": self.points if asked["MetricName"] == contract.STEP_TIME_RATIO.name else []}


def pace_check(sent: RatiosSent, documents: Sequence[RankProgress]) -> diagnosis.Verdict:
    inputs = DoctorInputs("demo", "smoke", "r", "bucket", REGION, None, sent, now=sent.now)
    dims = contract.run_dimensions("demo", "smoke", "r")
    ratios = diagnosis._samples(inputs, contract.STEP_TIME_RATIO, dims, "Minimum", sent.now)
    return diagnosis._pace(ratios, sent.now, 45.0, documents)


def test_the_pace_check_says_slowed_only_over_the_span_and_what_it_cannot_know_without_timed_waits() -> None:
    slowed = pace_check(RatiosSent(1.7, 10), [])
    assert (slowed.status, slowed.verdict) == ("warn", "slowed") and "no rank stands out" in slowed.evidence
    document = RankProgress(0, 0, 4, 900, "training", 0.5, 1.0, 0.5, 1, "p", "n", "", 0)
    untimed = pace_check(RatiosSent(1.7, 10), [replace(document, rank=r) for r in range(4)])  # waits not timed
    assert "waits are not timed (run.watch)" in untimed.evidence, untimed
    timed = [replace(document, rank=r, pace_steps=300, pace_window_s=301.0, pace_step_s=1.7, pace_wait_s=0.01)
             for r in range(4)]  # fmt: skip
    assert "no rank stands out" in pace_check(RatiosSent(1.7, 10), timed).evidence
    assert pace_check(RatiosSent(1.7, 3), []).verdict == "slowing", "not yet for ten minutes"
    assert pace_check(RatiosSent(1.7, 10, last=1.1), []).verdict == "at its baseline", "it recovered"
    assert pace_check(RatiosSent(1.0, 0), []).verdict == "no ratio"
