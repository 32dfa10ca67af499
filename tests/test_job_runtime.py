"""The real job (subprocess, moto, IAM enforced) where setup, phases and failures meet the heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.conftest import WriterSession
from tests.job_harness import JobHarness
from training import contract

SETUP_SECONDS = 8.0


@pytest.fixture
def harness(as_writer: WriterSession, tmp_path: Path) -> JobHarness:
    return JobHarness(as_writer.aws.url, as_writer.bucket, tmp_path, as_writer.credentials)


def maximum(as_writer: WriterSession, metric: contract.Metric, dimensions: dict[str, str]) -> float | None:
    now = datetime.now(UTC)
    points = as_writer.aws.client("cloudwatch").get_metric_statistics(
        Namespace=contract.NAMESPACE,
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
