"""The heartbeat's window: what the spool writer, the uploader and the loop measured since the last metric
batch. Each side adds under one lock; the heartbeat takes the window whole, and puts it back if CloudWatch
refused the batch, so nothing measured is lost to an outage."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from beacon import contract


def metric_value(value: Any) -> float:
    """A logged value as a float: a number, or a one-element tensor (read here, off the loop)."""
    if hasattr(value, "item"):
        value = value.detach().item() if hasattr(value, "detach") else value.item()
    return float(value)


def cloudwatch_accepts(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= contract.CLOUDWATCH_VALUE_LIMIT


def datum_is_valid(datum: dict[str, Any]) -> bool:
    """CloudWatch refuses a whole request for one bad value: drop the datum, keep the heartbeat."""
    values = [datum["Value"]] if "Value" in datum else list(datum.get("StatisticValues", {}).values())
    return all(cloudwatch_accepts(float(v)) for v in values)


def statistic_set(values: list[float]) -> dict[str, float]:
    return {"SampleCount": float(len(values)), "Sum": sum(values), "Minimum": min(values), "Maximum": max(values)}


@dataclass
class WindowStats:
    """Per-step values aggregated between two metric batches."""

    values: dict[str, list[float]] = field(default_factory=dict)  # the loss and the listed metrics
    last_step: int = -1
    upload_latencies_ms: list[float] = field(default_factory=list)
    upload_failures: int = 0
    checkpoint_seconds: list[float] = field(default_factory=list)
    checkpoints_skipped: int = 0
    steps_since_checkpoint: int | None = None  # at the last skip


class MetricWindow:
    """The current window (`stats`) and its lock; `metrics`: the names whose values the heartbeat sends (the loss,
    the team's CloudWatch metrics)."""

    def __init__(self, metrics: Sequence[str]) -> None:
        self.metrics = tuple(metrics)
        self.lock = threading.Lock()
        self.stats = WindowStats()

    def steps(self, last_step: int, metrics_of: Sequence[dict[str, float]]) -> None:
        with self.lock:
            for name in self.metrics:
                values = [metrics[name] for metrics in metrics_of if name in metrics]
                if values:
                    self.stats.values.setdefault(name, []).extend(values)
            self.stats.last_step = max(self.stats.last_step, last_step)

    def uploaded(self, latency_ms: float) -> None:
        with self.lock:
            self.stats.upload_latencies_ms.append(latency_ms)

    def upload_failed(self) -> None:
        with self.lock:
            self.stats.upload_failures += 1

    def checkpoint_finished(self, seconds: float) -> None:
        with self.lock:
            self.stats.checkpoint_seconds.append(seconds)

    def checkpoint_skipped(self, step: int, resume_point: int) -> None:
        with self.lock:
            self.stats.checkpoints_skipped += 1
            self.stats.steps_since_checkpoint = step - resume_point

    def take(self) -> WindowStats:
        with self.lock:
            taken, self.stats = self.stats, WindowStats()
        return taken

    def restore(self, sent: WindowStats) -> None:
        """A window whose batch failed, merged back before what came since."""
        with self.lock:
            current = self.stats
            for name, values in sent.values.items():
                current.values.setdefault(name, [])[:0] = values
            current.last_step = max(current.last_step, sent.last_step)
            current.upload_latencies_ms[:0] = sent.upload_latencies_ms
            current.upload_failures += sent.upload_failures
            current.checkpoint_seconds[:0] = sent.checkpoint_seconds
