"""What every framework integration shares; imports no framework.

Frameworks log one step several times (training metrics, then validation at the same step, then a
summary after the last step), while Beacon keeps one record per step: a step logged twice is read as
two writers on one run. `StepRecords` merges a step's calls and records it once the step is over.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from beacon import contract
from beacon.run import Run

log = logging.getLogger("beacon.integrations")
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9_.:/-]")
_NAME_LIMIT = 250


def metric_name(name: str) -> str:
    """`name` as `run.log` accepts it: characters it refuses become '_' (a framework's "val acc")."""
    return _NOT_IN_A_NAME.sub("_", name)[:_NAME_LIMIT] or "_"


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers among a framework's logged values: ints, floats, one-element tensors or NumPy
    values (tensors are read off the loop by `run.log`). Anything else (text, a list) is skipped."""
    numbers: dict[str, Any] = {}
    for name, value in metrics.items():
        if not contract.unloggable(value):
            numbers[metric_name(str(name))] = value
        else:
            log.debug("not a number, not recorded: %s=%r", name, value)
    return numbers


class StepRecords:
    """One record per step from several log calls: a step's metrics are merged while it is the
    latest, and handed to `run.log` once a later step is logged or `flush` says the step is over."""

    def __init__(self) -> None:
        self.step: int | None = None  # the step being merged
        self.metrics: dict[str, Any] = {}
        self.recorded_through = -1

    def add(self, run: Run, step: int, metrics: Mapping[str, Any]) -> None:
        if not metrics:
            return
        if step <= self.recorded_through or (self.step is not None and step < self.step):
            log.warning(
                "%s for step %d came after step %d: not recorded (one record per step, in step order)",
                ", ".join(sorted(metrics)),
                step,
                self.recorded_through if self.step is None else max(self.recorded_through, self.step),
            )
            return
        if self.step is not None and step > self.step:
            self.flush(run)
        self.step = step
        self.metrics.update(metrics)

    def next_step(self) -> int:
        """The step a log call without one belongs to: the one being merged, else the next."""
        return self.step if self.step is not None else self.recorded_through + 1

    def flush(self, run: Run) -> None:
        """The step being merged is over: record it."""
        if self.step is None:
            return
        step, metrics = self.step, self.metrics
        self.step, self.metrics = None, {}
        self.recorded_through = step
        if run.finished is not None:
            log.warning("%s for step %d came after the run finished: not recorded", ", ".join(sorted(metrics)), step)
            return
        run.log(metrics, step)


class PhaseMarks:
    """Phases a framework opens in one hook and closes in another (validation start and end)."""

    def __init__(self) -> None:
        self._open: dict[str, AbstractContextManager[None]] = {}

    def enter(self, run: Run, name: str) -> None:
        if name in self._open:
            return
        phase = run.phase(name)
        phase.__enter__()
        self._open[name] = phase

    def leave(self, name: str) -> None:
        phase = self._open.pop(name, None)
        if phase is not None:
            phase.__exit__(None, None, None)

    def leave_all(self) -> None:
        for name in reversed(list(self._open)):
            self.leave(name)
