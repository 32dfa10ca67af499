"""`beacon tensorboard` against a real moto server (IAM enforced), on files the real job uploaded (issue 14, item 2).

The job runs as the writer behind the bucket policy's conditions, so its TensorBoard files reach S3 the way
they would in AWS (one whole, create-only file per flush). The command runs as a process, as an operator
that may read the team's stack outputs and assume its reader role, and reads as the reader. moto ignores
the conditions of the reader's policy (s3:prefix, kms:ViaService): the policy evaluator answers for them.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from beacon import contract
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from config import names
from tests.conftest import WriterSession
from tests.support.cli import operator_of_the_artifacts_stack
from tests.support.job_harness import JobHarness, keys_under, wait_for
from tests.support.moto_server import REGION
from tests.support.policy_eval import Decision, Deployment, Request
from tests.support.synth import ROOT, Synthesized

TEAM, EXPERIMENT, RUN, STEPS = "demo", "smoke", "tb-cli", 60


@pytest.fixture
def operator(as_writer: WriterSession) -> dict[str, str]:
    return operator_of_the_artifacts_stack(as_writer, TEAM)


@pytest.fixture
def uploaded(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> list[str]:
    """The real job's TensorBoard files in S3: their keys."""
    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path / "job", as_writer.credentials)
    result = harness.run("--run-id", RUN, "--steps", str(STEPS), "--step-sleep", "0.02")
    assert result.returncode == 0, result.stderr[-3000:]
    keys = keys_under(as_writer.client("s3"), as_writer.bucket, contract.tensorboard_key(EXPERIMENT, RUN, ""))
    assert len(keys) >= 2, "one file per flush: the command must bring several back"
    return keys


def environment(as_writer: WriterSession, keys: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
    return {
        **env,
        "AWS_ENDPOINT_URL": as_writer.aws.url,
        "AWS_ACCESS_KEY_ID": keys["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": keys["aws_secret_access_key"],
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def beacon(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "beacon_ops.cli", "tensorboard", "--team", TEAM, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_no_serve_downloads_every_file_of_the_run_and_tensorboard_reads_every_step(
    as_writer: WriterSession, operator: dict[str, str], uploaded: list[str], tmp_path: Path
) -> None:
    env, directory = environment(as_writer, operator), tmp_path / "tb"
    done = beacon(env, "--run", RUN, "--no-serve", "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(directory), "stdout is the directory alone, for scripts"
    assert f"{len(uploaded)} files ({len(uploaded)} new)" in done.stderr

    s3 = as_writer.client("s3")
    in_s3 = {
        key.rsplit("/", 1)[1]: sha256(s3.get_object(Bucket=as_writer.bucket, Key=key)["Body"].read())
        for key in uploaded
    }
    local = {path.name: sha256(path.read_bytes()) for path in directory.iterdir()}
    assert local == in_s3, "each file whole, under its uploaded name, and nothing else"

    events = EventAccumulator(str(directory))
    events.Reload()
    assert "loss" in events.Tags()["scalars"]
    assert sorted(e.step for e in events.Scalars("loss")) == list(range(STEPS)), "every step, once, across the files"

    again = beacon(env, "--run", RUN, "--no-serve", "--dir", str(directory))
    assert again.returncode == 0 and "(0 new)" in again.stderr, "a second run fetches only what is new"


def test_a_run_without_tensorboard_files_is_one_line_naming_the_run_and_where_it_looked(
    as_writer: WriterSession, operator: dict[str, str], tmp_path: Path
) -> None:
    done = beacon(environment(as_writer, operator), "--run", "never-ran", "--no-serve", "--dir", str(tmp_path / "x"))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    prefix = contract.tensorboard_key(EXPERIMENT, "never-ran", "")
    assert line.startswith("beacon tensorboard: run 'never-ran'") and f"s3://{as_writer.bucket}/{prefix}" in line
    assert not (tmp_path / "x").exists()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return int(probe.getsockname()[1])


def test_it_serves_tensorboard_on_the_files_and_ends_it_on_sigterm(
    as_writer: WriterSession, operator: dict[str, str], uploaded: list[str], tmp_path: Path
) -> None:
    port, directory = free_port(), tmp_path / "tb"
    argv = ["tensorboard", "--team", TEAM, "--run", RUN, "--port", str(port), "--dir", str(directory)]
    process = subprocess.Popen(
        [sys.executable, "-m", "beacon_ops.cli", *argv],
        cwd=ROOT,
        env=environment(as_writer, operator),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def loss_is_served() -> bool:
            try:
                tags = requests.get(f"http://localhost:{port}/data/plugin/scalars/tags", timeout=2).json()
            except (requests.RequestException, ValueError):
                return False
            return any("loss" in run_tags for run_tags in tags.values())

        assert wait_for(loss_is_served, timeout=90), "TensorBoard serves the run's loss"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("localhost", port)) != 0:
                break
        time.sleep(0.2)
    else:
        pytest.fail("TensorBoard outlived the command")


def test_the_reader_may_list_and_read_a_runs_tensorboard_files_as_aws_evaluates(demo: Synthesized) -> None:
    """What moto cannot say: the reader's s3:prefix and kms:ViaService conditions admit the command's calls."""
    aws = Deployment(demo.templates)
    artifacts = names.stack_name(TEAM, "artifacts")
    reader = aws.arn(artifacts, aws.find(artifacts, "AWS::IAM::Role", "ArtifactStoreReaderRole"))
    bucket = aws.arn(artifacts, aws.find(artifacts, "AWS::S3::Bucket", "ArtifactStoreBucket"))
    key = aws.arn(artifacts, aws.find(artifacts, "AWS::KMS::Key", "ArtifactStoreKey"))
    prefix = contract.tensorboard_key(EXPERIMENT, RUN, "")
    tls = {"aws:SecureTransport": True}
    requests_made = [
        Request("s3:ListBucket", bucket, reader, {"s3:prefix": prefix, **tls}),
        Request("s3:GetObject", f"{bucket}/{prefix}part-00000001.events.out.tfevents.1.host.1.0", reader, tls),
        Request("kms:Decrypt", key, reader, {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}),
    ]
    for request in requests_made:
        assert aws.decide(request).decision is Decision.ALLOW, request
