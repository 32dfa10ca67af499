"""The smoke job's flags: each documented in --help and settable as a BEACON_* environment variable.

The run's own settings among them become a `beacon.RunSettings`; the rest drive the toy training."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

from beacon import RunSettings, contract

# The runtime's own defaults: the smoke job's flags take them, never a copy (one place for each default).
RUNTIME: dict[str, Any] = {f.name: f.default for f in fields(RunSettings)}

__all__ = ["JobConfig", "build_parser", "parse_args"]

ENV_PREFIX = "BEACON_"  # every setting of the run, and of this job, as an environment variable


@dataclass(frozen=True)
class JobConfig:
    team: str
    experiment: str
    run: str
    steps: int
    batch_size: int
    workers: int
    learning_rate: float
    seed: int
    bucket: str
    spool_dir: Path
    checkpoint_dir: Path
    checkpoint_interval: int
    flush_interval: float
    chunk_records: int
    heartbeat_interval: float
    heartbeat_file: Path
    namespace: str
    region: str
    shutdown_budget: float
    stall_dump_after: float
    slow_rank_share: float
    alarms: bool
    allow_ephemeral_spool: bool
    telemetry: bool
    step_sleep: float
    setup_sleep: float
    hang_after_step: int
    hang_rank: int
    slow_after_step: int
    slow_rank: int
    slow_by: float
    min_duration: float

    def with_run(self, run: str) -> JobConfig:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return JobConfig(**{**values, "run": run})

    @property
    def settings(self) -> RunSettings:
        """The run's settings, for `beacon.init`: the flags the runtime reads."""
        names = {f.name for f in fields(RunSettings)} & {f.name for f in fields(self)}
        return RunSettings(**{name: getattr(self, name) for name in names})


class _OneLineParser(argparse.ArgumentParser):
    """Bad input gets one line and exit code 2, not a usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        raise SystemExit(2)


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative_int(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _positive_float(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative_float(value: str) -> float:
    number = float(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _identifier(kind: str) -> Any:
    def parse(value: str) -> str:
        try:
            return contract.validate_id(kind, value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="python -m smoke_job.train",
        description="Beacon's smoke-training job: a small CNN whose every record reaches S3 exactly once.",
        epilog=f"Every flag can also be set as an environment variable: {ENV_PREFIX}<FLAG> (e.g. BEACON_STEPS=200).",
    )

    def add(flag: str, kind: Any, default: Any, text: str, **extra: Any) -> None:
        name = flag.lstrip("-").replace("-", "_")
        # argparse parses a string default like a command-line value, so the environment is checked too.
        default = os.environ.get(f"{ENV_PREFIX}{name.upper()}", default)
        parser.add_argument(flag, type=kind, default=default, help=f"{text} [{ENV_PREFIX}{name.upper()}]", **extra)

    add("--team", _identifier("team"), "demo", "team name, a dimension of every metric")
    add("--experiment", _identifier("experiment"), "smoke", "experiment id (S3-safe)")
    # Not `--run`: torchrun would take it for an abbreviation of its own --run-path.
    add("--run-id", _identifier("run"), None, "run id; generated when absent; reuse it to resume")
    add("--steps", _positive_int, 200, "training steps")
    add("--batch-size", _positive_int, 32, "batch size per rank")
    add("--workers", _non_negative_int, 4, "DataLoader workers per rank (spawn context, at most 4)")
    add("--learning-rate", _positive_float, 0.02, "SGD learning rate")
    add("--seed", int, 1234, "seed of the synthetic dataset and the model")
    add("--bucket", str, None, "artifact bucket (required when telemetry is on)")
    add("--spool-dir", Path, RUNTIME["spool_dir"], "spool on the persistent volume")
    add("--checkpoint-dir", Path, RUNTIME["checkpoint_dir"], "checkpoints on the persistent volume")
    add("--checkpoint-interval", _positive_int, 50, "steps between checkpoints")
    add("--flush-interval", _positive_float, RUNTIME["flush_interval"], "seconds between spool chunk seals and uploads")
    add("--chunk-records", _positive_int, RUNTIME["chunk_records"], "records per chunk at most")
    add(
        "--heartbeat-interval",
        _positive_float,
        RUNTIME["heartbeat_interval"],
        "seconds between heartbeats (and metric batches)",
    )
    add("--heartbeat-file", Path, RUNTIME["heartbeat_file"], "liveness: each local rank touches <file>.<rank>")
    add("--namespace", str, None, "CloudWatch namespace (default: the team's, Beacon/<team>)")
    add(
        "--region",
        str,
        os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "AWS region (defaults to AWS_REGION)",
    )
    add("--shutdown-budget", _positive_float, RUNTIME["shutdown_budget"], "seconds to drain everything after SIGTERM")
    add(
        "--stall-dump-after",
        _positive_float,
        float(contract.STALL_THRESHOLD_S),
        "seconds without progress after which a rank dumps its stacks",
    )
    add(
        "--slow-rank-share",
        _positive_float,
        RUNTIME["slow_rank_share"],
        "a rank is slow once the others wait for it this share of each step (the team file's)",
    )
    add("--alarms", _bool, True, "create this run's alarms from the team's template, delete them on exit")
    add("--allow-ephemeral-spool", _bool, False, "accept a spool on tmpfs/overlay (local development only)")
    add("--telemetry", _bool, True, "all sinks on; off only to measure overhead")
    add("--step-sleep", float, 0.0, "extra seconds per step (fault tests slow the loop with it)")
    add("--setup-sleep", _non_negative_float, 0.0, "extra seconds of setup before the first step (tests)")
    add("--hang-after-step", int, -1, "hang the loop after this step, heartbeat alive (fault tests and benchmarks)")
    add("--hang-rank", int, -1, "with --hang-after-step, only this rank hangs; the others block in a collective")
    add("--slow-after-step", int, -1, "after this step, --step-sleep is --slow-by times longer (benchmarks)")
    add("--slow-rank", int, -1, "with --slow-after-step, only this rank slows (a straggler); -1: every rank")
    add("--slow-by", _positive_float, 1.5, "with --slow-after-step, the factor on --step-sleep")
    add(
        "--min-duration",
        _non_negative_float,
        0.0,
        "pace the loop so the run spans at least this many seconds (the smoke job: its run alarms arm)",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> JobConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.workers > 4:
        parser.error(f"argument --workers: at most 4 (fork deadlocks and memory), got {args.workers}")
    if args.telemetry and not args.bucket:
        parser.error("argument --bucket: required (or set BEACON_BUCKET)")
    values = vars(args)
    values["run"] = values.pop("run_id") or ""
    values["namespace"] = values["namespace"] or contract.metric_namespace(values["team"])
    return JobConfig(**values)
