"""Run the real training job as a subprocess against a moto server, and read back what it delivered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.preflight import reported_seconds

from beacon_ops.processes import end_process_tree
from tests.support import local_tls
from tests.synth import ROOT


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith('{"beacon": "job-finished"')]

    @property
    def summary(self) -> dict[str, Any]:
        (summary,) = [s for s in self.summaries if s["rank"] == 0]
        return summary

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith(("beacon preflight:", "python -m"))]


def preflight_seconds(text: str) -> float:
    """Preflight's own time, as the job reports it (on failure and on success)."""
    seconds = reported_seconds(text)
    assert seconds is not None, f"the job reported no preflight time: {text[-500:]}"
    return seconds


@dataclass
class JobHarness:
    endpoint: str
    bucket: str
    workdir: Path
    credentials: dict[str, str]
    region: str = "us-east-1"
    extra_env: dict[str, str] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        # Not KUBERNETES_*: run from a CI pod, preflight would (rightly) refuse a spool on its emptyDir.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_", "KUBERNETES_"))}
        env.update(
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_REGION=self.region,
            AWS_ACCESS_KEY_ID=self.credentials["aws_access_key_id"],
            AWS_SECRET_ACCESS_KEY=self.credentials["aws_secret_access_key"],
            PYTHONUNBUFFERED="1",
        )
        if "aws_session_token" in self.credentials:
            env["AWS_SESSION_TOKEN"] = self.credentials["aws_session_token"]
        if self.endpoint.startswith("https:"):
            env["AWS_CA_BUNDLE"] = str(local_tls.authority().ca_file)  # the SDK's own setting, as any CA
        env.update(self.extra_env)
        return env

    def args(self, *extra: str) -> list[str]:
        return [
            "--bucket",
            self.bucket,
            "--spool-dir",
            str(self.workdir / "spool"),
            "--checkpoint-dir",
            str(self.workdir / "checkpoints"),
            "--heartbeat-file",
            str(self.workdir / "heartbeat"),
            "--heartbeat-interval",
            "1",
            "--flush-interval",
            "1",
            "--workers",
            "0",
            *extra,
        ]

    def command(self, *extra: str, ranks: int = 1, launcher: str = "") -> list[str]:
        """Plain python for one rank, torchrun for more; launcher="container" is the image's entry point."""
        rest = ["--standalone", f"--nproc-per-node={ranks}", "-m", "smoke_job.train", *self.args(*extra)]
        if launcher == "container":
            return [sys.executable, "-m", "beacon.launch", *rest]
        if launcher == "torchrun" or ranks > 1:
            return [str(Path(sys.executable).with_name("torchrun")), *rest]
        return [sys.executable, "-m", "smoke_job.train", *self.args(*extra)]

    def run(self, *extra: str, ranks: int = 1, launcher: str = "", timeout: float = 240) -> JobResult:
        started = time.monotonic()
        done = subprocess.run(
            self.command(*extra, ranks=ranks, launcher=launcher),
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return JobResult(done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def start(self, *extra: str, ranks: int = 1, launcher: str = "") -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(*extra, ranks=ranks, launcher=launcher),
            cwd=ROOT,
            env=self.env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def liveness_file(self, local_rank: int = 0) -> Path:
        return Path(contract.liveness_file(str(self.workdir / "heartbeat"), local_rank))

    def heartbeat_age(self) -> float:
        return time.time() - self.liveness_file().stat().st_mtime


def finish(process: subprocess.Popen[str], *, timeout: float) -> JobResult:
    started = time.monotonic()
    stdout, stderr = process.communicate(timeout=timeout)
    return JobResult(process.returncode, stdout, stderr, time.monotonic() - started)


def signal_group(process: subprocess.Popen[str], signum: signal.Signals) -> None:
    """SIGKILL ends the whole tree (torchrun puts each rank in a session of its own); other signals go
    to the launcher's group, as a terminal or a runner would send them."""
    if signum == signal.SIGKILL:
        end_process_tree(process.pid)
    else:
        os.killpg(process.pid, signum)


def delivered_records(s3: Any, bucket: str, experiment: str, run: str) -> list[contract.Record]:
    prefix = contract.run_prefix(experiment, run) + contract.EVENTS + "/"
    records: list[contract.Record] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            records.extend(contract.records_of(body))
    return records


def assert_live_history_once(records: list[contract.Record], steps: int) -> contract.History:
    """Exactly once across restarts: one record per (attempt, step), one live record per step, no
    gap in the sequence; a restart's superseded records are kept beside the live history."""
    history = contract.history(records)
    assert history.duplicated == [], "one record per (attempt, step)"
    assert history.live_steps == list(range(steps)), "every step once in the live history, no gap"
    assert sorted(r.seq for r in records) == list(range(len(records))), "the record sequence has no gap"
    assert {r.rank for r in records} <= {0}, "rank 0 alone writes"
    return history


def keys_under(s3: Any, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return keys


def wait_for(predicate: Any, *, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
