"""Run the real training job as a subprocess against a moto server, and read back what it delivered.

The job's environment and command are the sandbox's (beacon_ops.local.sandbox), as `beacon local` runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.contract.preflight import reported_seconds

from beacon_ops.local.processes import end_process_tree
from beacon_ops.local.sandbox import aws_env, job_args, job_command
from tests.support import local_tls
from tests.support.synth import ROOT


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
        env.update(aws_env(endpoint=self.endpoint, region=self.region, credentials=self.credentials))
        if self.endpoint.startswith("https:"):
            env["AWS_CA_BUNDLE"] = str(local_tls.authority().ca_file)  # the SDK's own setting, as any CA
        env.update(self.extra_env)
        return env

    def args(self, *extra: str) -> list[str]:
        storage = job_args(
            bucket=self.bucket,
            spool_dir=self.workdir / "spool",
            checkpoint_dir=self.workdir / "checkpoints",
            heartbeat_file=self.workdir / "heartbeat",
            heartbeat_interval="1",
        )
        return [*storage, "--workers", "0", *extra]

    def command(self, *extra: str, ranks: int = 1, launcher: str = "") -> list[str]:
        """Plain python for one rank, torchrun for more; launcher="container" is the image's entry point."""
        return job_command(self.args(*extra), ranks=ranks, launcher=launcher)

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
