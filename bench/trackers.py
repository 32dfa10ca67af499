"""Beacon beside MLflow, TensorBoard and W&B offline: the same loop (bench/loop.py), 10 metrics a step.

Each tracker's loop runs in a process of its own, against the same local endpoints: the moto S3 the
bench started, a real `mlflow server` on 127.0.0.1 (bench/mlflow_server.py). After its timed rounds
and its wait for durability, the loop logs `kill_steps` more steps and says `ready` right after the
last log call; the bench SIGKILLs that process (the training process alone: a tracker's helper
process, W&B's service, may finish what it was handed) and counts what survived:
- Beacon: the spool pushed with `beacon.sync` (`sync_spool`, as `python -m beacon.sync` does, without
  its 60 s quiet wait), then the records in S3;
- MLflow: the server's metric history of the run;
- TensorBoard: the scalar events in the event file;
- W&B offline: the history records in the run's `.wandb` transaction log (bench/wandb_log.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from beacon import contract
from beacon.sync import sync_spool

from bench.loop import METRICS
from bench.mlflow_server import MlflowServer, group_members
from bench.wandb_log import read_offline_run

TRACKERS = ("beacon", "mlflow", "tensorboard", "wandb")
EXPERIMENT = "bench"  # bench/loop.py's Beacon experiment
LEFTOVER_WAIT_S = 30.0


def loop_env(base: dict[str, str], workdir: Path, bucket: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("BEACON_", "MLFLOW_", "WANDB_"))}
    env.update(
        BEACON_BUCKET=bucket,
        BEACON_SPOOL_DIR=str(workdir / "spool"),
        BEACON_CHECKPOINT_DIR=str(workdir / "checkpoints"),
        BEACON_HEARTBEAT_FILE=str(workdir / "heartbeat"),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(workdir),
        PYTHONUNBUFFERED="1",
    )
    return env


def start_loop(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.loop", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def read_json(stream: Iterable[str]) -> dict[str, Any]:
    for line in stream:
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError("the loop ended before it reported")


def end_group(process: subprocess.Popen[str], wait_s: float) -> None:
    """Let what the killed process left behind (W&B's service) finish for `wait_s`, then end it."""
    deadline = time.monotonic() + wait_s
    while group_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- what survived a SIGKILL ------------------------------------------------------------------------
def s3_steps(s3: Any, bucket: str, run: str) -> set[int]:
    steps: set[int] = set()
    prefix = contract.run_prefix(EXPERIMENT, run) + contract.EVENTS + "/"
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            steps.update(record.step for record in contract.records_of(body) if METRICS[0] in record.metrics)
    return steps


def beacon_survivors(identity: dict[str, str], s3: Any, bucket: str) -> set[int]:
    sync_spool(Path(identity["spool"]), s3=s3, bucket=bucket, quiet_s=0)
    return s3_steps(s3, bucket, identity["run"])


def mlflow_survivors(identity: dict[str, str], tracking_uri: str) -> set[int]:
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=tracking_uri).get_metric_history(identity["run"], METRICS[0])
    return {int(metric.step) for metric in history}


def tensorboard_survivors(identity: dict[str, str]) -> set[int]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps: set[int] = set()
    for path in Path(identity["dir"]).glob("events.out.tfevents.*"):
        with contextlib.suppress(Exception):  # a torn last event ends the file
            for event in EventFileLoader(str(path)).Load():
                if any(value.tag == METRICS[0] for value in event.summary.value):
                    steps.add(int(event.step))
    return steps


def wandb_survivors(identity: dict[str, str]) -> set[int]:
    path = Path(identity["file"])
    if not path.exists():
        return set()
    return {int(row["_step"]) for row in read_offline_run(path).history if METRICS[0] in row}


# --- the side-by-side table -------------------------------------------------------------------------
def one_tracker(
    tracker: str,
    env: dict[str, str],
    workdir: Path,
    *,
    s3: Any,
    bucket: str,
    tracking_uri: str,
    rounds: int,
    steps: int,
    kill_steps: int,
    step_s: float,
) -> dict[str, Any]:
    run_id = f"{tracker}-{int(time.time() * 1000)}"
    process = start_loop(
        env,
        "cost",
        tracker,
        f"--workdir={workdir}",
        f"--run-id={run_id}",
        f"--tracking-uri={tracking_uri}",
        f"--rounds={rounds}",
        f"--steps={steps}",
        f"--kill-steps={kill_steps}",
        f"--step-s={step_s}",
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        figures = read_json(process.stdout)
        ready = process.stdout.readline()
        if not ready.startswith("ready "):
            raise RuntimeError(f"{tracker} loop: {ready!r} {process.stderr.read()[-2000:]}")
        os.kill(process.pid, signal.SIGKILL)  # right after the last log call
        killed_at = time.monotonic()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stderr is not None:
            sys.stderr.write(process.stderr.read()[-3000:])
        raise
    end_group(process, LEFTOVER_WAIT_S)
    identity = figures["identity"]
    if tracker == "beacon":
        survivors = beacon_survivors(identity, s3, bucket)
    elif tracker == "mlflow":
        survivors = mlflow_survivors(identity, tracking_uri)
    elif tracker == "tensorboard":
        survivors = tensorboard_survivors(identity)
    else:
        survivors = wandb_survivors(identity)
    logged = int(ready.split()[1]) + 1
    return {
        "ms_per_step": figures["ms_per_step"],
        "ms_per_step_rounds": figures["ms_per_step_rounds"],
        "durable_s": figures["durable_s"],
        **({"spool_fsync_s": figures["spool_fsync_s"]} if "spool_fsync_s" in figures else {}),
        "records_logged": logged,
        "records_lost_after_sigkill": len(set(range(logged)) - survivors),
        # of the records the tracker had called durable before the last steps: none may be lost
        "durable_records_lost": len(set(range(rounds * steps)) - survivors),
        "leftover_processes_s": round(time.monotonic() - killed_at, 1),
    }


def bench_trackers(
    env: dict[str, str],
    *,
    s3: Any,
    bucket: str,
    mlflow: MlflowServer,
    rounds: int = 5,
    steps: int = 1000,
    kill_steps: int = 100,
    step_s: float = 0.01,
) -> dict[str, Any]:
    """Each tracker's loop once, in turn, in the same run: cost per step (median of `rounds` rounds of
    `steps` steps, timed inside the call), time until durable, records lost after a SIGKILL."""
    table: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trackers-") as scratch:
        for tracker in TRACKERS:
            workdir = Path(scratch) / tracker
            workdir.mkdir()
            table[tracker] = one_tracker(
                tracker,
                loop_env(env, workdir, bucket),
                workdir,
                s3=s3,
                bucket=bucket,
                tracking_uri=mlflow.url,
                rounds=rounds,
                steps=steps,
                kill_steps=kill_steps,
                step_s=step_s,
            )
    return {
        "trackers": table,
        "trackers_loop": {
            "metrics_per_step": len(METRICS),
            "rounds": rounds,
            "steps": steps,
            "kill_steps": kill_steps,
            "kill_step_s": step_s,
        },
    }


# --- the firehose: a loop faster than the spool, never held back -----------------------------------------
def bench_firehose(env: dict[str, str], *, s3_endpoint: str, bucket: str, records: int = 2_000_000) -> dict[str, Any]:
    """`run.log` as fast as one thread can for `records` records, never waiting for the spool: what the process
    holds past its start is the memory bound at work (the spool writer's, then the journal's backlog on disk)."""
    report = bench_sustained(env, s3_endpoint=s3_endpoint, bucket=bucket, records=records, outage_s=0, queued=records)
    return {
        "firehose_records": report["sustained_records"],
        "firehose_rss_growth_mb": report["sustained_rss_growth_mb"],
        "firehose_log_records_per_s": report["sustained_log_records_per_s"],
        "firehose_delivered": report["sustained_delivered"],
    }


# --- sustained records/s, memory, an S3 outage ------------------------------------------------------
def bench_sustained(
    env: dict[str, str],
    *,
    s3_endpoint: str,
    bucket: str,
    records: int = 1_000_000,
    outage_s: float = 60.0,
    queued: int = 5_000,
) -> dict[str, Any]:
    """`run.log` as fast as one thread can, 10 metrics a record, until `records`; then until S3
    acknowledged them all. Half-way, S3 is unreachable for `outage_s` (the fault proxy resets every S3
    connection) while the loop goes on logging. Resident memory is sampled every second. The rate is
    records S3-acknowledged per second up to the outage; the whole run's, outage included, beside it."""
    from tests.support.fault_proxy import FaultPlan, FaultProxy

    proxy = FaultProxy(s3_endpoint, FaultPlan(max_requests=10_000_000, max_lifetime_s=24 * 3600.0)).start()
    try:
        with tempfile.TemporaryDirectory(prefix="bench-sustained-") as scratch:
            workdir = Path(scratch)
            process = start_loop(
                {**loop_env(env, workdir, bucket), "AWS_ENDPOINT_URL": proxy.url},
                "sustained",
                "beacon",
                f"--workdir={workdir}",
                f"--run-id=sustained-{int(time.time() * 1000)}",
                f"--records={records}",
                f"--outage-at={records // 2 if outage_s > 0 else 0}",
                f"--queued={queued}",
                "--sample-s=1",
            )
            assert process.stdin is not None and process.stdout is not None and process.stderr is not None
            outage: dict[str, float] = {}
            try:
                for line in process.stdout:
                    event = json.loads(line) if line.startswith("{") else {}
                    if event.get("event") == "outage":
                        outage["from_s"] = time.monotonic()
                        proxy.unreachable(outage_s, ("s3",))
                        time.sleep(outage_s)
                        process.stdin.write("\n")
                        process.stdin.flush()
                        outage["until_s"] = time.monotonic()
                    elif event.get("tracker"):
                        result = event
                        break
                else:
                    raise RuntimeError(f"sustained loop: {process.stderr.read()[-2000:]}")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    finally:
        proxy.stop()
    samples = result["samples"]
    # The rate while S3 is up: records acknowledged by the outage (or the end) over the time it took.
    outage_t = samples[-1]["t"] if math.isnan(result["outage_t"]) else result["outage_t"]
    steady = max((sample for sample in samples if sample["t"] <= outage_t), key=lambda sample: sample["t"])
    base = samples[0]["rss_mb"]
    peak = max(sample["rss_mb"] for sample in samples)
    return {
        "sustained_records": result["records"],
        "sustained_records_per_s": steady["acked"] / steady["t"] if steady["t"] > 0 else 0.0,
        "sustained_with_outage_records_per_s": result["records"] / result["seconds"],
        "sustained_log_records_per_s": result["records"] / result["log_seconds"],
        "sustained_ms_per_log": result["ms_per_log"],
        "sustained_rss_growth_mb": peak - base,
        "sustained_rss_start_mb": base,
        "sustained_outage_s": outage_s,
        "sustained_delivered": result["delivered"],
        "sustained_runtime": result["runtime"],
        "sustained_samples": samples,
    }


def bench_mirror_lag(
    env: dict[str, str], *, bucket: str, mlflow: MlflowServer, steps: int = 3000, step_s: float = 0.01
) -> dict[str, Any]:
    """Beacon with its MLflow mirror: `steps` steps at `step_s`; seconds from `run.log` to the local
    MLflow server holding the point (the mirror's own lag: the oldest record of each batch)."""
    with tempfile.TemporaryDirectory(prefix="bench-mirror-") as scratch:
        workdir = Path(scratch)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.loop",
                "mirror",
                "beacon",
                f"--workdir={workdir}",
                f"--run-id=mirror-{int(time.time() * 1000)}",
                f"--tracking-uri={mlflow.url}",
                f"--steps={steps}",
                f"--step-s={step_s}",
            ],
            cwd=Path(__file__).resolve().parent.parent,
            env={**loop_env(env, workdir, bucket), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"},
            capture_output=True,
            text=True,
            timeout=steps * step_s + 600,
        )
    if done.returncode != 0:
        raise RuntimeError(f"mirror loop failed: {done.stderr[-2000:]}")
    result = read_json(done.stdout.splitlines())
    return {
        "mirror_lag_median_s": result["lag_s"].get("median", float("inf")),
        "mirror_lag_p95_s": result["lag_s"].get("p95", float("inf")),
        "mirror_lag_max_s": result["lag_s"].get("max", float("inf")),
        "mirror_behind_at_finish": result["behind"],
        "mirror_steps": steps,
        "mirror_step_s": step_s,
    }
