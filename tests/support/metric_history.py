"""What a run's heartbeat sent at every beat of its last minutes, put as its writer would have put it: for the
verdicts that read a span of a metric (`contract.pace.rank_slow`, `run_slowed`), not its last value."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from beacon import contract


def sent_every_beat(
    cloudwatch: Any,
    team: str,
    experiment: str,
    run: str,
    metric: contract.Metric,
    value: float,
    *,
    until: datetime | None = None,
    minutes: int = 10,
) -> None:
    """`metric` at `value` every heartbeat (15 s) of the `minutes` before `until` (now), the run's dimensions."""
    until = until or datetime.now(UTC).replace(microsecond=0)
    dimensions = [{"Name": k, "Value": v} for k, v in contract.run_dimensions(team, experiment, run).items()]
    beat = int(contract.HEARTBEAT_INTERVAL_S)
    data = [
        {"MetricName": metric.name, "Dimensions": dimensions, "Value": value, "Unit": metric.unit.value,
         "Timestamp": until - timedelta(seconds=ago), "StorageResolution": 1}
        for ago in range(0, minutes * 60, beat)
    ]  # fmt: skip
    # A beat's worth at a time, as the heartbeat sends: a request over 10 KB is gzipped by botocore, and the embedded
    # AWS checks the signature against the body it decompressed
    for start in range(0, len(data), 10):
        cloudwatch.put_metric_data(Namespace=contract.metric_namespace(team), MetricData=data[start : start + 10])
