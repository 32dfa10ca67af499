"""What a run needs to know, from keyword arguments first, then `BEACON_*` and `AWS_*` variables.

The stack's Job and the SageMaker job spec set the `BEACON_*` environment, so the same training
code runs there and on a laptop against a local S3: `beacon.init()` with no argument but the
experiment. Every value is checked once, here; an error names the argument and its variable.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.contract.pace import SLOW_RANK_SHARE, slow_rank_share_problem

ENV_PREFIX = "BEACON_"
# The trackers a run can be mirrored to (beacon/sinks/mirrors): replayed from the spool, never on the loop.
TRACKERS = ("mlflow", "wandb")
WANDB_MODES = ("online", "offline")


class SettingsError(ValueError):
    """A setting that cannot be used; the message is one line naming it."""


@dataclass(frozen=True)
class RunSettings:
    team: str = "demo"
    experiment: str = "default"
    run: str = ""  # generated on rank 0 when empty; reuse one to resume
    bucket: str = ""
    region: str = "us-east-1"
    namespace: str = ""  # CloudWatch namespace; the team's (Beacon/<team>) when empty
    spool_dir: Path = Path("/artifacts/spool")
    checkpoint_dir: Path = Path("/artifacts/checkpoints")
    flush_interval: float = 10.0  # seconds between spool chunk seals and uploads
    chunk_records: int = 100
    heartbeat_interval: float = float(contract.HEARTBEAT_INTERVAL_S)  # seconds between heartbeats and batches
    heartbeat_file: Path = Path("/tmp/beacon-heartbeat")  # each local rank touches <file>.<rank>
    shutdown_budget: float = 60.0  # seconds to drain after the loop ends (SIGTERM included)
    # A rank whose progress (phases excluded) is this old dumps its stacks beside its progress signal.
    stall_dump_after: float = float(contract.STALL_THRESHOLD_S)
    # A named phase (checkpoint, evaluation, a team's own) pauses the stall clock this long at most.
    phase_limit: float = float(contract.PHASE_LIMIT_S)
    # A rank is slow once the others wait for it this share of each step (the team file's monitoring.slow_rank_share).
    slow_rank_share: float = SLOW_RANK_SHARE
    alarms: bool = True  # create this run's alarms from the team's template, delete them on exit
    allow_ephemeral_spool: bool = False  # a spool on tmpfs/overlay/emptyDir: local development only
    telemetry: bool = True  # every sink on; off only to measure overhead
    # TensorBoard shows every record up to this rate, evenly thinned above it; S3 always has every record.
    tensorboard_points_per_s: float = 1000.0
    # Logged metrics that also go to CloudWatch (each is a custom metric, billed monthly). S3 and
    # TensorBoard carry every metric; CloudWatch always carries the health contract and the loss.
    cloudwatch_metrics: tuple[str, ...] = ()
    # Trackers the run is mirrored to, from the spool by a thread each (rank 0): e.g. ("mlflow",).
    mirrors: tuple[str, ...] = ()
    mlflow_tracking_uri: str = ""  # required with the MLflow mirror
    mlflow_experiment: str = ""  # the MLflow experiment; Beacon's experiment when empty
    wandb_project: str = ""  # the W&B project; Beacon's experiment when empty
    wandb_mode: str = "online"  # or "offline": the W&B run stays on the spool volume for `wandb sync`

    def __post_init__(self) -> None:
        for kind in ("team", "experiment"):
            _check(kind, lambda value, kind=kind: contract.validate_id(kind, value), getattr(self, kind))
        if self.run:
            _check("run", lambda value: contract.validate_id("run", value), self.run)
        for name in (
            "flush_interval",
            "heartbeat_interval",
            "shutdown_budget",
            "stall_dump_after",
            "phase_limit",
            "tensorboard_points_per_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise SettingsError(f"{_label(name)}: must be a number > 0, got {value!r}")
        if problem := slow_rank_share_problem(self.slow_rank_share):
            raise SettingsError(f"{_label('slow_rank_share')}: {problem}")
        if not isinstance(self.chunk_records, int) or self.chunk_records <= 0:
            raise SettingsError(f"{_label('chunk_records')}: must be an integer > 0, got {self.chunk_records!r}")
        if self.telemetry and not self.bucket:
            raise SettingsError(f"{_label('bucket')}: required when telemetry is on (the team's artifact bucket)")
        for name in self.cloudwatch_metrics:
            if not contract.is_metric_name(name):
                raise SettingsError(f"{_label('cloudwatch_metrics')}: {name!r} is not a metric name")
            if name in contract.reserved_metric_names():
                raise SettingsError(f"{_label('cloudwatch_metrics')}: {name!r} is one of Beacon's own metrics")
        self._check_mirrors()
        if not self.namespace:
            object.__setattr__(self, "namespace", contract.metric_namespace(self.team))

    def _check_mirrors(self) -> None:
        for name in self.mirrors:
            if name not in TRACKERS:
                raise SettingsError(f"{_label('mirrors')}: {name!r} is not one of {', '.join(TRACKERS)}")
        if len(set(self.mirrors)) < len(self.mirrors):
            raise SettingsError(f"{_label('mirrors')}: names a tracker twice: {','.join(self.mirrors)}")
        if self.mirrors and not self.telemetry:
            raise SettingsError(f"{_label('mirrors')}: needs telemetry on (a mirror replays the spool)")
        if "mlflow" in self.mirrors and not self.mlflow_tracking_uri:
            raise SettingsError(f"{_label('mlflow_tracking_uri')}: required when mirrors has mlflow")
        if self.wandb_mode not in WANDB_MODES:
            modes = ", ".join(WANDB_MODES)
            raise SettingsError(f"{_label('wandb_mode')}: must be one of {modes}, got {self.wandb_mode!r}")

    def with_run(self, run: str) -> RunSettings:
        return dataclasses.replace(self, run=run)

    @property
    def run_spool_dir(self) -> Path:
        return self.spool_dir / self.experiment / self.run

    @property
    def run_ranks_dir(self) -> Path:
        """Every rank's progress signal and stack dumps: on the run's shared volume where pods share one."""
        return self.run_spool_dir / contract.RANKS

    @property
    def run_checkpoint_dir(self) -> Path:
        return self.checkpoint_dir / self.experiment / self.run

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, **given: Any) -> RunSettings:
        """Keyword arguments win; then `BEACON_<NAME>` (`BEACON_RUN_ID` for the run); then, for the
        region, `AWS_REGION` and `AWS_DEFAULT_REGION`; then the defaults above."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            if given.get(field.name) is not None:
                values[field.name] = given.pop(field.name)
                continue
            given.pop(field.name, None)
            text = environ.get(_variable(field.name))
            if text is None and field.name == "region":
                text = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
            if text is not None and text != "":
                values[field.name] = _parse(field.name, field.default, text)
        if given:
            raise SettingsError(f"{sorted(given)[0]}: not a setting of beacon.init")
        for name in ("cloudwatch_metrics", "mirrors"):
            if isinstance(values.get(name), str):
                values[name] = _parse(name, (), values[name])
            elif isinstance(values.get(name), list | set):
                values[name] = tuple(values[name])
        for name in ("spool_dir", "checkpoint_dir", "heartbeat_file"):
            if name in values:
                values[name] = Path(values[name])
        return cls(**values)


def generated_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def _variable(name: str) -> str:
    return f"{ENV_PREFIX}RUN_ID" if name == "run" else f"{ENV_PREFIX}{name.upper()}"


def _label(name: str) -> str:
    return f"{name} ({_variable(name)})"


def _check(name: str, validate: Any, value: str) -> None:
    try:
        validate(value)
    except ValueError as error:
        raise SettingsError(f"{_label(name)}: {error}") from None


def _parse(name: str, default: Any, text: str) -> Any:
    try:
        if isinstance(default, bool):
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {text!r}")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return text
    except ValueError as error:
        raise SettingsError(f"{_label(name)}: {error}") from None
