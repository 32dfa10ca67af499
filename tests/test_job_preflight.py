"""Preflight and bad input: each failure is one line, fast, and names what to fix."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, preflight_seconds
from tests.support.moto_server import MotoServer
from tests.support.synth import ROOT

PREFLIGHT_BUDGET_S = 20
EXIT_PREFLIGHT, EXIT_USAGE = 3, 2


@pytest.fixture
def harness(as_writer: WriterSession, tmp_path: Path) -> JobHarness:
    return JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)


def test_preflight_passes_for_the_writer_and_records_a_persistent_spool(harness: JobHarness) -> None:
    result = harness.run("--run-id", "pre-ok", "--steps", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "preflight passed" in result.stderr


def test_a_writer_without_permission_fails_preflight_fast_naming_bucket_and_action(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    denied = as_writer.aws.user_without_rights("no-rights")
    result = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, denied).run("--run-id", "pre-denied")
    assert result.returncode == EXIT_PREFLIGHT
    assert preflight_seconds(result.stderr) < PREFLIGHT_BUDGET_S, "timed inside the job"
    (line,) = result.error_lines
    assert line.startswith(f"beacon preflight: s3:PutObject s3://{as_writer.bucket}/experiments/smoke/pre-denied/")
    assert "denied" in line and "Pod Identity" in line


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_endpoint_fails_preflight_fast_naming_the_endpoint(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    result = JobHarness(dead, as_writer.bucket, tmp_path, as_writer.credentials).run("--run-id", "pre-dead")
    assert result.returncode == EXIT_PREFLIGHT
    (line,) = result.error_lines
    assert f"endpoint {dead}" in line and "unreachable" in line and "AWS_ENDPOINT_URL" in line
    assert preflight_seconds(line) < PREFLIGHT_BUDGET_S, "timed inside the job: interpreter start-up is not preflight"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs a tmpfs at /dev/shm")
def test_a_spool_on_tmpfs_is_refused(harness: JobHarness, tmp_path: Path) -> None:
    spool = Path("/dev/shm") / f"beacon-spool-{tmp_path.name}"
    result = harness.run("--run-id", "pre-tmpfs", "--spool-dir", str(spool))
    assert result.returncode == EXIT_PREFLIGHT
    (line,) = result.error_lines
    assert f"spool dir {spool}/smoke/pre-tmpfs is on tmpfs" in line and "persistent artifact volume" in line


def test_an_unwritable_spool_names_the_path_and_the_ownership_fix(harness: JobHarness, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool should be")
    result = harness.run("--run-id", "pre-ro", "--spool-dir", str(blocker))
    assert result.returncode == EXIT_PREFLIGHT
    (line,) = result.error_lines
    assert f"spool dir {blocker}/smoke/pre-ro: cannot create" in line and "ownership" in line


def test_a_missing_alarm_template_is_named(moto_server: MotoServer, tmp_path: Path) -> None:
    moto_server.client("s3").create_bucket(Bucket="beacon-bare")
    admin = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}
    result = JobHarness(moto_server.url, "beacon-bare", tmp_path, admin).run("--run-id", "pre-noalarms")
    assert result.returncode == EXIT_PREFLIGHT
    (line,) = result.error_lines
    assert "ssm:GetParameter /beacon/demo/run-alarm-template: not found" in line


BAD_INPUT = {
    "unknown_flag": (["--bucket", "b", "--colour", "blue"], "unrecognized arguments: --colour blue"),
    "experiment_not_s3_safe": (["--bucket", "b", "--experiment", "My Exp/1"], "argument --experiment"),
    "run_id_not_s3_safe": (["--bucket", "b", "--run-id", "run#1"], "argument --run-id"),
    "negative_steps": (["--bucket", "b", "--steps", "-3"], "argument --steps: must be > 0"),
    "missing_bucket": ([], "argument --bucket: required"),
    "too_many_workers": (["--bucket", "b", "--workers", "8"], "argument --workers: at most 4"),
    "not_a_boolean": (["--bucket", "b", "--alarms", "maybe"], "argument --alarms"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_and_exit_code_2(case: str) -> None:
    argv, expected = BAD_INPUT[case]
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "smoke_job.train", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == EXIT_USAGE
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert expected in lines[0]


def test_every_flag_is_documented_with_its_environment_variable() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "smoke_job.train", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    for flag in (
        "--experiment",
        "--run-id",
        "--steps",
        "--batch-size",
        "--workers",
        "--bucket",
        "--spool-dir",
        "--checkpoint-dir",
        "--checkpoint-interval",
        "--flush-interval",
        "--heartbeat-interval",
        "--namespace",
        "--region",
        "--shutdown-budget",
    ):
        assert flag in done.stdout, flag
        assert f"BEACON_{flag[2:].upper().replace('-', '_')}" in done.stdout.replace("\n", " ").replace("  ", ""), flag


@pytest.mark.parametrize(("case", "expected"), [("preflight", EXIT_PREFLIGHT), ("usage", EXIT_USAGE)])
def test_the_container_launcher_keeps_the_jobs_exit_code_where_bare_torchrun_says_1(
    as_writer: WriterSession, tmp_path: Path, case: str, expected: int
) -> None:
    """The Job's podFailurePolicy fails at once on 2 and 3; torchrun alone would exit 1 for both."""
    denied = as_writer.aws.user_without_rights("no-rights-launch")
    harness = JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, denied)
    extra = ("--run-id", "launch-denied") if case == "preflight" else ("--steps", "0")
    assert harness.run(*extra, launcher="container").returncode == expected
    assert harness.run(*extra, launcher="torchrun").returncode == 1
