"""Tracker mirrors: the run's records copied to MLflow or W&B from the durable spool, never from the loop.

Each mirror is driven by a `MirrorWorker` thread of its own on rank 0 (`beacon.sinks.mirrors.worker`); a
tracker outage only makes its worker wait, and what it has not sent stays behind a durable cursor
for the next start of the run. The tracker packages are imported lazily, inside their mirror.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from beacon.contract import FinalState, Record
from beacon.process.preflight import PreflightError
from beacon.settings import RunSettings

# The mirrors' share of the shutdown budget, from the start of `finish` (they drain beside the uploads).
MIRROR_SHARE = 0.25


@dataclass(frozen=True)
class RunInfo:
    """The Beacon run a tracker's run mirrors."""

    team: str
    experiment: str
    run: str
    directory: Path  # the mirrors' own files, on the spool's volume


class Mirror(Protocol):
    name: str

    def open(self, run: RunInfo) -> int | None:
        """Find (by Beacon's run id) or create the tracker's run. Returns the last sequence number the
        tracker says it holds (-1: nothing), or None when it cannot tell: then the cursor decides."""

    def send(self, records: Sequence[Record]) -> None:
        """Give the tracker these records (consecutive sequence numbers, in order); raise on failure,
        so the same records are sent again later."""

    def close(self, state: FinalState) -> None:
        """Tell the tracker how the run ended; only once everything durable was sent."""

    def held_through(self, record: Record) -> None:
        """The last record the tracker holds, as the spool knows it (after `open`): where a restart that goes
        back over steps it holds begins, when the tracker itself could not say (offline)."""


class History:
    """Where a tracker's run stands across attempts: the last (attempt, step) it holds, and the ranges a restart
    went through again. Trackers cannot rewind (MLflow keeps every point; W&B's rewind is a preview), so a
    restart's records are sent beside the earlier attempt's, and the superseded range is named on the run
    (`superseded_ranges`): `attempt-00000: 10-14` says attempt 0's steps 10 to 14 are not the model's history."""

    def __init__(self, last: tuple[int, int] | None = None, superseded: dict[str, str] | None = None) -> None:
        self.last = last
        self.superseded = dict(superseded or {})

    def held(self, record: Record) -> bool:
        """Already in the tracker: at or before the last (attempt, step) it holds (records come in that order)."""
        return self.last is not None and (record.attempt, record.step) <= self.last

    def held_through(self, record: Record) -> None:
        if self.last is None:
            self.last = (record.attempt, record.step)

    def take(self, record: Record) -> bool:
        """Note `record` as sent; True when it starts a restart's pass over steps the tracker holds already."""
        rewound = self.last is not None and record.attempt > self.last[0] and record.step <= self.last[1]
        if rewound and self.last is not None:
            self.superseded[f"attempt-{self.last[0]:05d}"] = f"{record.step}-{self.last[1]}"
        self.last = (record.attempt, record.step)
        return rewound


def build(name: str, settings: RunSettings) -> Mirror:
    """The mirror `name` (one of `settings.TRACKERS`), its package checked but not imported yet."""
    if importlib.util.find_spec(name) is None:
        raise PreflightError(f"mirrors: {name} is not installed (pip install 'beacon[{name}]')")
    if name == "mlflow":
        from beacon.sinks.mirrors.mlflow import MlflowMirror

        return MlflowMirror(settings.mlflow_tracking_uri, settings.mlflow_experiment or settings.experiment)
    if name == "wandb":
        from beacon.sinks.mirrors.wandb import WandbMirror

        share = MIRROR_SHARE * settings.shutdown_budget  # wandb's own finish, at exit too, waits no longer
        return WandbMirror(settings.wandb_project or settings.experiment, settings.wandb_mode, finish_timeout=share)
    raise PreflightError(f"mirrors: no mirror named {name!r}")
