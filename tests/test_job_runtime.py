"""The real job (subprocess, moto, IAM enforced) where setup, phases and failures meet the heartbeat."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3
import pytest
from beacon import contract
from beacon.process.preflight import PREFLIGHT_BUDGET_S, Retrying, run_preflight
from botocore.config import Config
from smoke_job.config import parse_args

from tests.conftest import WriterSession
from tests.support.fault_proxy import FaultPlan, FaultProxy
from tests.support.job_harness import JobHarness, preflight_seconds

SETUP_SECONDS = 8.0
TRANSIENT_FAULTS = ("error_500", "slow_down_503", "reset")


@pytest.fixture
def harness(as_writer: WriterSession, tmp_path: Path) -> JobHarness:
    return JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)


def maximum(as_writer: WriterSession, metric: contract.Metric, dimensions: dict[str, str]) -> float | None:
    now = datetime.now(UTC)
    points = as_writer.aws.client("cloudwatch").get_metric_statistics(
        Namespace=contract.metric_namespace("demo"),
        MetricName=metric.name,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum"],
    )["Datapoints"]
    return max((float(p["Maximum"]) for p in points), default=None)


def test_a_long_setup_is_reported_as_setup_and_not_as_progress_age(
    harness: JobHarness, as_writer: WriterSession
) -> None:
    """Heartbeats run through setup; ProgressAge stays low while PhaseSeconds{Phase=setup} grows. On
    6cb2f94 the stall clock started in Job.build, so setup time counted as a stall."""
    result = harness.run("--run-id", "setup-1", "--steps", "20", "--setup-sleep", str(SETUP_SECONDS))
    assert result.returncode == 0, result.stderr[-3000:]
    as_writer.aws.reset_auth_only()
    run = contract.run_dimensions("demo", "smoke", "setup-1")
    setup = contract.phase_dimensions("demo", "smoke", "setup-1", contract.Phase.SETUP)
    in_setup = maximum(as_writer, contract.PHASE_SECONDS, setup)
    assert in_setup is not None and in_setup >= SETUP_SECONDS - 3, "the heartbeat says the job is in setup"
    age = maximum(as_writer, contract.PROGRESS_AGE, run)
    assert age is not None and age < SETUP_SECONDS / 2, f"setup counted as a stall: ProgressAge {age}"


def test_transient_errors_at_start_up_are_retried_and_the_job_runs(as_writer: WriterSession, tmp_path: Path) -> None:
    """The first three requests to S3, CloudWatch and SSM each fail (500, 503 throttling, a reset):
    6cb2f94 (2 attempts, no retry of its own) failed preflight with exit 3."""
    plan = FaultPlan(services=("s3", "monitoring", "ssm"), kinds=TRANSIENT_FAULTS, fail_first=3)
    proxy = FaultProxy(as_writer.aws.url, plan).start()
    try:
        harness = JobHarness(proxy.url, as_writer.bucket, tmp_path, as_writer.credentials)
        result = harness.run("--run-id", "pre-flaky", "--steps", "5")
    finally:
        proxy.stop()
    assert result.returncode == 0, result.stderr[-3000:]
    assert preflight_seconds(result.stderr) < PREFLIGHT_BUDGET_S, "retried within preflight's own budget"
    for service in ("s3", "monitoring", "ssm"):
        assert {f"{service}:{kind}" for kind in TRANSIENT_FAULTS} <= set(proxy.stats.injected), service


class Relay(socketserver.ThreadingTCPServer):
    """Bytes both ways between a loopback port and an upstream: an endpoint that starts listening late."""

    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        def pipe(source: socket.socket, sink: socket.socket) -> None:
            with contextlib.suppress(OSError):
                while data := source.recv(65536):
                    sink.sendall(data)
                sink.shutdown(socket.SHUT_WR)

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with socket.create_connection(upstream) as out:
                    threading.Thread(target=pipe, args=(out, self.request), daemon=True).start()
                    pipe(self.request, out)

        super().__init__(("127.0.0.1", port), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_refused_connection_that_clears_within_its_budget_passes_preflight(
    as_writer: WriterSession, tmp_path: Path
) -> None:
    """Nothing listens at first (a proxy sidecar still starting); it starts during the first retry."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    upstream = urlparse(as_writer.aws.url)
    relays: list[Relay] = []

    def sleep_then_listen(seconds: float) -> None:
        if not relays:
            relays.append(Relay(port, (str(upstream.hostname), int(upstream.port or 80))))
        time.sleep(seconds)

    def client(service: str) -> Any:
        return boto3.session.Session().client(
            service,
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            config=Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=2, read_timeout=5),
            **as_writer.credentials,
        )

    flags = ["--bucket", as_writer.bucket, "--run-id", "pre-late", "--alarms", "false", "--slow-rank-share", "0.4"]
    config = parse_args(flags).settings
    try:
        record = run_preflight(
            config,
            spool_dir=tmp_path / "spool",
            world_size=1,
            s3=client("s3"),
            cloudwatch=client("cloudwatch"),
            ssm=None,
            retrying=Retrying(sleep=sleep_then_listen),
        )
    finally:
        for relay in relays:
            relay.shutdown()
            relay.server_close()
    assert relays, "the first attempt was refused"
    assert record.run == "pre-late"
    assert record.slow_rank_share == 0.4, "the team's share, in the record the doctor reads it from"
