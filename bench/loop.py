"""One training loop, four trackers: `python -m bench.loop TRACKER ...`, run by bench/trackers.py.

The same loop for each: 10 metrics a step (Python floats), each `log` call timed inside the call.
Modes:
- `cost`: `rounds` rounds of `steps` steps (cost per step of each round); then the time from the
  last log call until the tracker's own sense of durable; then `kill_steps` more steps, one every
  `step_s`, a line `ready <last step>` right after the last log call, and a wait to be SIGKILLed.
- `sustained` (Beacon): `log` as fast as the thread can for `records` records, reporting records
  S3-acknowledged and resident memory every `sample_s`; an `outage` line on stdin is answered once
  the outage the bench made is over (see trackers.bench_sustained).
- `mirror` (Beacon with its MLflow mirror): `steps` steps at `step_s`, then the mirror's lag.

Durable means: Beacon, S3 acknowledged (and, beside it, fsync'd in the spool); MLflow, the server
acknowledged the batch (`flush_async_logging` returned); TensorBoard and W&B offline, the local
event file holds the last step and was fsync'd.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

METRICS = tuple(f"m{i}" for i in range(10))
POLL_S = 0.001


def metrics_of(step: int) -> dict[str, float]:
    return {name: 1.0 / (step + 1 + index) for index, name in enumerate(METRICS)}


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def fsync_files(directory: Path, pattern: str) -> None:
    for path in directory.rglob(pattern):
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # any descriptor of the file flushes its pages
        finally:
            os.close(descriptor)


def wait_until(predicate: Callable[[], bool], limit_s: float = 120.0, poll_s: float = POLL_S) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("not durable in time")
        time.sleep(poll_s)


# --- the trackers -------------------------------------------------------------------------------------
class Tracker:
    identity: dict[str, str] = {}

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def wait_durable(self, last_step: int) -> dict[str, float]:
        """Block until every step through `last_step` is durable; seconds it took, by kind."""
        raise NotImplementedError


class BeaconTracker(Tracker):
    def __init__(self, run_id: str, **settings: Any) -> None:
        import beacon

        self.run = beacon.init("bench", run_id=run_id, alarms=False, **settings)
        self.telemetry: Any = self.run.telemetry
        self.identity = {"run": run_id, "spool": str(self.run.settings.run_spool_dir)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step)

    def acknowledged(self) -> int:
        """Records S3 acknowledged in this process."""
        return int(self.telemetry.report.records - self.telemetry.spool.unacknowledged_records())

    def wait_durable(self, last_step: int) -> dict[str, float]:
        started = time.perf_counter()
        spool = self.telemetry.spool
        wait_until(lambda: spool.durable_step >= last_step)
        spooled = time.perf_counter() - started
        wait_until(lambda: self.telemetry.unacknowledged_records() == 0)
        return {"durable_s": time.perf_counter() - started, "spool_fsync_s": spooled}


class MlflowTracker(Tracker):
    def __init__(self, tracking_uri: str, workdir: Path) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment("bench")
        self.active = mlflow.start_run()
        self.identity = {"run": self.active.info.run_id}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.mlflow.log_metrics(metrics, step=step, synchronous=False)

    def wait_durable(self, last_step: int) -> dict[str, float]:
        started = time.perf_counter()
        self.mlflow.flush_async_logging()  # returns once the server acknowledged every queued batch
        return {"durable_s": time.perf_counter() - started}


class TensorBoardTracker(Tracker):
    def __init__(self, workdir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.directory = workdir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.directory))  # its defaults: a flush every 120 s
        self.identity = {"dir": str(self.directory)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def wait_durable(self, last_step: int) -> dict[str, float]:
        started = time.perf_counter()
        self.writer.flush()
        fsync_files(self.directory, "events.out.tfevents.*")
        return {"durable_s": time.perf_counter() - started}


class WandbTracker(Tracker):
    def __init__(self, workdir: Path) -> None:
        import wandb

        self.run = wandb.init(project="bench", dir=str(workdir), mode="offline", settings=wandb.Settings(silent=True))
        self.file = Path(self.run.dir).parent / f"run-{self.run.id}.wandb"
        self.identity = {"file": str(self.file)}

    def log(self, metrics: dict[str, float], step: int) -> None:
        # No step= : W&B holds an explicit step's row open until a later step; each call commits here.
        self.run.log(metrics)

    def wait_durable(self, last_step: int) -> dict[str, float]:
        from bench.wandb_log import read_offline_run

        def holds_last() -> bool:
            try:
                return any(row.get("_step") == last_step for row in read_offline_run(self.file).history)
            except Exception:  # a torn record at the end, mid-write
                return False

        started = time.perf_counter()
        wait_until(holds_last, poll_s=0.01)  # each look reads the whole file
        fsync_files(self.file.parent, self.file.name)
        return {"durable_s": time.perf_counter() - started}


def open_tracker(args: argparse.Namespace) -> Tracker:
    workdir = Path(args.workdir)
    if args.tracker == "beacon":
        return BeaconTracker(args.run_id)
    if args.tracker == "mlflow":
        return MlflowTracker(args.tracking_uri, workdir)
    if args.tracker == "tensorboard":
        return TensorBoardTracker(workdir)
    if args.tracker == "wandb":
        return WandbTracker(workdir)
    raise SystemExit(f"unknown tracker {args.tracker!r}")


# --- the modes --------------------------------------------------------------------------------------
def timed_steps(tracker: Tracker, first: int, count: int, step_s: float = 0.0) -> float:
    """Seconds spent inside `log` over `count` steps."""
    inside = 0
    clock = time.perf_counter_ns
    for step in range(first, first + count):
        metrics = metrics_of(step)
        started = clock()
        tracker.log(metrics, step)
        inside += clock() - started
        if step_s:
            time.sleep(step_s)
    return inside / 1e9


def cost(args: argparse.Namespace) -> None:
    tracker = open_tracker(args)
    per_round = []
    step = 0
    for _ in range(args.rounds):
        per_round.append(1000 * timed_steps(tracker, step, args.steps) / args.steps)
        step += args.steps
    durable = tracker.wait_durable(step - 1)
    emit(
        tracker=args.tracker,
        ms_per_step=statistics.median(per_round),
        ms_per_step_rounds=per_round,
        **durable,
        identity=tracker.identity,
    )
    timed_steps(tracker, step, args.kill_steps, args.step_s)
    last = step + args.kill_steps - 1
    print(f"ready {last}", flush=True)  # right after the last log call: the bench SIGKILLs now
    threading.Event().wait()


def sustained(args: argparse.Namespace) -> None:
    tracker = BeaconTracker(args.run_id)
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    logged = 0
    inside = 0.0
    next_sample = started

    def sample() -> None:
        nonlocal next_sample
        now = time.monotonic() - started
        samples.append({"t": now, "logged": logged, "acked": tracker.acknowledged(), "rss_mb": resident_mb()})
        next_sample = time.monotonic() + args.sample_s

    def log_burst(count: int) -> None:
        """`count` records as fast as the thread can, held back only while more than `queued` records
        wait in memory for the spool: the spool's pace, not the bench's, sets the figure."""
        nonlocal logged, inside
        while logged - tracker.telemetry.report.records > args.queued:
            time.sleep(0.001)
        inside += timed_steps(tracker, logged, count)
        logged += count
        if time.monotonic() >= next_sample:
            sample()

    sample()
    outage_t = float("nan")
    outage = threading.Thread(target=sys.stdin.readline, daemon=True)  # the bench's word: S3 is back
    while logged < args.records:
        log_burst(min(1000, args.records - logged))
        if args.outage_at and logged >= args.outage_at and not outage.is_alive() and not outage.ident:
            sample()
            outage_t = samples[-1]["t"]
            emit(event="outage", logged=logged)  # the bench makes S3 unreachable, then answers on stdin
            outage.start()
        while outage.is_alive():  # the loop goes on logging through the outage
            log_burst(100)
    last_log = time.monotonic()
    while tracker.acknowledged() < logged:
        time.sleep(args.sample_s / 10)
        if time.monotonic() >= next_sample:
            sample()
    sample()
    report = tracker.run.finish()
    emit(
        tracker="beacon",
        records=logged,
        seconds=samples[-1]["t"],
        log_seconds=last_log - started,
        ms_per_log=1000 * inside / logged,
        outage_t=outage_t,
        samples=samples,
        delivered=report.delivered,
        runtime=str(Path(sys.modules["beacon"].__file__ or "").parent),  # which `beacon` ran (bench/release.py)
    )


def mirror(args: argparse.Namespace) -> None:
    tracker = BeaconTracker(
        args.run_id, mirrors=("mlflow",), mlflow_tracking_uri=args.tracking_uri, mlflow_experiment="bench-mirror"
    )
    timed_steps(tracker, 0, args.steps, args.step_s)
    report = tracker.run.finish()
    lag = report.mirrors["mlflow"].lag_summary()
    emit(
        tracker="beacon-mlflow-mirror",
        steps=args.steps,
        step_s=args.step_s,
        lag_s=lag,
        behind=report.mirrors["mlflow"].behind,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("cost", "sustained", "mirror"))
    parser.add_argument("tracker", choices=("beacon", "mlflow", "tensorboard", "wandb"))
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--run-id", default="bench")
    parser.add_argument("--tracking-uri", default="")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kill-steps", type=int, default=100)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--outage-at", type=int, default=0)
    parser.add_argument("--sample-s", type=float, default=1.0)
    # A training loop logs far slower than the spool takes records; this one logs as fast as a thread can, so
    # it lets at most this many wait in memory (0.1 s of its logging). 20,000 measured +67.6 MB over 4.5M records
    # through the outage, of which some 18 MB were the bench's own queue (5,000: +49.0 MB, 40,946 records/s).
    parser.add_argument("--queued", type=int, default=5_000, help="records let wait in memory for the spool")
    args = parser.parse_args()
    {"cost": cost, "sustained": sustained, "mirror": mirror}[args.mode](args)


if __name__ == "__main__":
    main()
