"""`make bench` -> .beacon/bench/report.json and a table. Every speed figure is a ratio of two
things measured in the same run, interleaved (A B A B ...), median of several repetitions."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from beacon import contract
from beacon.checkpoint import AsyncCheckpointer, Uploader, save_file
from smoke_job.model import SmallConvNet

from beacon_ops.doctor.diagnosis import Diagnosis, DoctorInputs, diagnose
from beacon_ops.evidence.alarms import alarm_set_for_run
from beacon_ops.evidence.verify import recorded_samples
from beacon_ops.local.moto import REGION, EmbeddedAws
from beacon_ops.local.processes import end_process_tree
from beacon_ops.local.sandbox import Sandbox, open_sandbox
from beacon_ops.templates import load_templates
from bench.cost import bench_idle_cost
from bench.doctor import bench_doctor
from bench.mlflow_server import MlflowServer
from bench.release import RELEASE_TAG, bench_against_release
from bench.trackers import bench_firehose, bench_mirror_lag, bench_sustained, bench_trackers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".beacon" / "bench"
CDK = ["npx", "--no-install", "cdk"]
ENV = {**os.environ, "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20"}
BUCKET = "beacon-bench"
# AWS list prices, us-east-1, as published on 2026-12-01 (check current prices for your region).
PRICES = {
    "put_metric_data_per_1000_requests": 0.01,
    "custom_metric_per_month": 0.30,
    "high_resolution_alarm_per_month": 0.30,
    "composite_alarm_per_month": 0.50,
    "s3_put_per_1000_requests": 0.005,
}
HOURS_PER_MONTH = 730


def median_of(values: list[float]) -> float:
    return float(statistics.median(values))


def interleaved(a: Callable[[], float], b: Callable[[], float], rounds: int) -> tuple[list[float], list[float]]:
    first, second = [], []
    for _ in range(rounds):
        first.append(a())
        second.append(b())
    return first, second


# --- synth --------------------------------------------------------------------------------
def synth_seconds(app_dir: Path, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run([*CDK, "synth", "--quiet", "-o", str(out)], cwd=app_dir, env=ENV, check=True, capture_output=True)
    return time.perf_counter() - started


def empty_app(directory: Path) -> Path:
    (directory / "app.py").write_text("from aws_cdk import App, Stack\napp = App()\nStack(app, 'Empty')\napp.synth()\n")
    cdk = {
        "app": f"{ROOT / '.venv/bin/python'} app.py",
        "notices": False,
        "versionReporting": False,
        "context": {"cli-telemetry": False},
    }
    (directory / "cdk.json").write_text(json.dumps(cdk))
    (directory / "node_modules").symlink_to(ROOT / "node_modules")
    return directory


def bench_synth(rounds: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        empty = empty_app(Path(scratch))
        full, bare = interleaved(
            lambda: synth_seconds(ROOT, Path(scratch) / "full.out"),
            lambda: synth_seconds(empty, Path(scratch) / "empty.out"),
            rounds,
        )
    return {
        "synth_ratio": median_of(full) / median_of(bare),
        "synth_s": median_of(full),
        "empty_synth_s": median_of(bare),
    }


# --- the job against a moto in its own process ------------------------------------------------
@dataclass
class Bench:
    """The one sandbox (`beacon_ops.local.sandbox`: moto in its own process, the demo team provisioned, IAM
    enforced), and what the bench adds: the monitoring template's alarms, and the smoke job as it runs it."""

    sandbox: Sandbox
    monitoring: Any

    @property
    def aws(self) -> EmbeddedAws:
        return self.sandbox.aws

    @property
    def writer(self) -> dict[str, str]:
        return self.sandbox.credentials

    @property
    def reader(self) -> dict[str, str]:
        return self.sandbox.reader

    @property
    def workdir(self) -> Path:
        return self.sandbox.workdir

    def env(self) -> dict[str, str]:
        return self.sandbox.job_env(self.sandbox.credentials)

    def command(self, run: str, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "smoke_job.train",
            "--bucket",
            BUCKET,
            "--run-id",
            run,
            "--workers",
            "0",
            "--spool-dir",
            str(self.workdir / "spool"),
            "--checkpoint-dir",
            str(self.workdir / "ckpt"),
            "--heartbeat-file",
            str(self.workdir / f"hb-{run}"),
            *extra,
        ]

    def run(self, run: str, *extra: str) -> dict[str, Any]:
        done = subprocess.run(self.command(run, *extra), cwd=ROOT, env=self.env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench job {run} failed: {done.stderr[-1000:]}")
        line = next(x for x in done.stdout.splitlines() if x.startswith('{"beacon": "job-finished"'))
        return dict(json.loads(line))

    def doctor(self, run: str) -> str:
        return self.diagnosis(run).diagnosis

    def diagnosis(self, run: str) -> Diagnosis:
        return diagnose(
            DoctorInputs(
                team="demo",
                experiment="smoke",
                run=run,
                bucket=BUCKET,
                region=REGION,
                s3=self.aws.client("s3", **self.reader),
                cloudwatch=self.aws.client("cloudwatch", **self.reader),
            )
        )


def open_bench(workdir: Path) -> Bench:
    templates = load_templates(ROOT / "cdk.out")
    sandbox = open_sandbox(templates, "demo", bucket=BUCKET, workdir=workdir)
    return Bench(sandbox, templates["beacon-demo-monitoring"])


def bench_telemetry(bench: Bench, rounds: int = 9, steps: int = 300) -> dict[str, Any]:
    common = (
        "--steps",
        str(steps),
        "--batch-size",
        "64",
        "--checkpoint-interval",
        str(steps * 10),
        "--alarms",
        "false",
    )
    counter = iter(range(1000))

    def rate(telemetry: bool) -> Callable[[], float]:
        def measure() -> float:
            summary = bench.run(f"tput-{next(counter)}", *common, "--telemetry", str(telemetry).lower())
            summaries[telemetry].append(summary)
            return float(summary["last_step"] + 1) / float(summary["loop_seconds"])

        return measure

    summaries: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    on, off = interleaved(rate(True), rate(False), rounds)
    per_step_ms = [1000 * s["telemetry_seconds_on_loop"] / (s["last_step"] + 1) for s in summaries[True]]
    return {
        "telemetry_throughput_ratio": median_of(on) / median_of(off),
        "telemetry_ms_per_step": median_of(per_step_ms),
        "steps_per_second_on": median_of(on),
        "steps_per_second_off": median_of(off),
        "step_ms": 1000 / median_of(off),
    }


def bench_checkpoint(bench: Bench, rounds: int = 7) -> dict[str, Any]:
    """Loop blocked by one async checkpoint ÷ the same checkpoint done synchronously on the loop:
    written to the volume (fsync'd) and uploaded to S3, which is what the checkpoint thread does."""
    model = SmallConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    ballast = {f"layer{i}": torch.randn(1024, 1024) for i in range(16)}  # 64 MB, a modest real model
    state = {"model": {**model.state_dict(), **ballast}, "optimizer": optimizer.state_dict(), "step": 1}
    blocked, synchronous = [], []
    with tempfile.TemporaryDirectory(dir=ROOT / ".beacon") as scratch:
        directory = Path(scratch)
        # One checkpointer for the run, as in the job: the first save allocates its staging memory.
        upload = Uploader(bench.aws.client("s3", **bench.writer), BUCKET, "bench", "checkpoint")
        checkpointer = AsyncCheckpointer(
            directory / "async", upload=upload, wait_durable=lambda step, timeout: True, on_finished=lambda s: None
        )
        for index in range(rounds):
            started = time.perf_counter()
            checkpointer.save(index, state)
            blocked.append(time.perf_counter() - started)
            checkpointer.join(120)
            started = time.perf_counter()
            save_file(state, directory / f"sync-{index}.pt")
            upload(1000 + index, directory / f"sync-{index}.pt")
            synchronous.append(time.perf_counter() - started)
    return {
        "checkpoint_block_ratio": median_of(blocked) / median_of(synchronous),
        "checkpoint_first_blocked_ms": 1000 * blocked[0],
        "checkpoint_blocked_ms": 1000 * median_of(blocked),
        "checkpoint_sync_ms": 1000 * median_of(synchronous),
        "checkpoint_state_mb": 64,
    }


def time_until(predicate: Callable[[], bool], limit: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < limit:
        if predicate():
            return time.monotonic() - started
        time.sleep(1.0)
    return float("inf")


def bench_detection(bench: Bench) -> dict[str, Any]:
    """Production heartbeat (15 s): freeze one job (SIGSTOP), hang another's loop; time the verdicts."""
    results: dict[str, Any] = {"heartbeat_interval_s": 15}
    silent = bench.command("detect-silent", "--steps", "1000000", "--step-sleep", "0.05")
    process: subprocess.Popen[str] = subprocess.Popen(
        silent,
        text=True,
        cwd=ROOT,
        env=bench.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        time_until(lambda: bench.doctor("detect-silent") == "healthy", 120)
        time.sleep(20)  # a few production heartbeats first
        os.killpg(process.pid, signal.SIGSTOP)
        frozen = time.time()
        results["silent_detection_s"] = time_until(lambda: bench.doctor("detect-silent") == "silent", 300)
        alarms = alarm_set_for_run(bench.monitoring, "smoke", "detect-silent")
        samples = recorded_samples(bench.aws.client("cloudwatch", **bench.reader), alarms)
        alarm = contract.run_alarm_name("demo", "smoke", "detect-silent", contract.RunAlarm.SILENT)
        at = alarms.first_alarm(alarm, samples, frozen, frozen + 600)
        results["silent_alarm_s"] = (at - frozen) if at else float("inf")
    finally:
        end_process_tree(process.pid)
        process.wait()
    # past warm-up and the baseline's 50 steps after it, with room: the run's threshold is its pace's (30 s)
    stalled = bench.command("detect-stall", "--steps", "1000000", "--step-sleep", "0.05", "--hang-after-step", "150")
    process = subprocess.Popen(
        stalled,
        cwd=ROOT,
        env=bench.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "hanging after step" in line:
                break
        hung = time.time()
        # A stall the doctor names: `stalled`, or the rank itself with its stack (`rank-hung`, its document and dump
        # past `stall_dump_after`; `paused` before that is not yet a stall)
        said: list[str] = []

        def named_stall() -> bool:
            said.append(bench.doctor("detect-stall"))
            return said[-1] in ("stalled", "rank-hung")

        results["stall_detection_s"] = time_until(named_stall, 400)
        results["stall_detection_verdict"] = said[-1] if said else ""
        # The alarm needs the heartbeats that keep coming: record past its budget, then evaluate.
        time.sleep(max(0.0, hung + contract.STALLED_BUDGET_S + 5 - time.time()))
        alarms = alarm_set_for_run(bench.monitoring, "smoke", "detect-stall")
        samples = recorded_samples(bench.aws.client("cloudwatch", **bench.reader), alarms)
        alarm = contract.run_alarm_name("demo", "smoke", "detect-stall", contract.RunAlarm.STALLED)
        at = alarms.first_alarm(alarm, samples, hung, time.time())
        results["stall_alarm_short_steps_s"] = (at - hung) if at else float("inf")
    finally:
        end_process_tree(process.pid)
        process.wait()
    return results


class TwoNodes:
    """Four ranks of the smoke job as two torchrun nodes on CPU (gloo), pods train-0 and train-1 on nodes node-0 and
    node-1, the production heartbeat (15 s), no run alarms of their own (the bench evaluates the synthesized ones).
    Node 1's stderr (ranks 2 and 3) is read from the start, each line's time kept (`said`): a full pipe would block
    the ranks' own logging, and their evidence with it."""

    def __init__(self, bench: Bench, run: str, *job: str) -> None:
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        command = bench.command(run, "--steps", "1000000", "--alarms", "false", *job)[3:]
        port = free_port()
        self.nodes: list[subprocess.Popen[str]] = []
        for node in (0, 1):
            rendezvous = ["--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}"]
            env = {**bench.env(), "BEACON_POD_NAME": f"train-{node}", "BEACON_NODE_NAME": f"node-{node}"}
            self.nodes.append(subprocess.Popen(
                [torchrun, *rendezvous, "--nproc-per-node=2", "-m", "smoke_job.train", *command], cwd=ROOT,
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE if node else subprocess.DEVNULL,
                text=True, start_new_session=True,
            ))  # fmt: skip
        self._lines: list[tuple[float, str]] = []
        self._read = threading.Condition()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        stderr = self.nodes[1].stderr
        assert stderr is not None
        for line in stderr:
            with self._read:
                self._lines.append((time.time(), line))
                self._read.notify_all()

    def said(self, words: str, limit: float = 1800) -> float:
        """When node 1's ranks logged `words` (epoch seconds); inf if not within `limit` seconds."""
        deadline = time.monotonic() + limit
        with self._read:
            while True:
                found = next((at for at, line in self._lines if words in line), None)
                if found is not None:
                    return found
                if not self._read.wait(timeout=max(0.0, deadline - time.monotonic())):
                    return float("inf")

    def end(self) -> None:
        for process in self.nodes:
            if process.returncode is None:  # not yet ended and reaped here: its pid is still its own
                end_process_tree(process.pid)
                process.wait()


def seconds_after(since: float, predicate: Callable[[], bool], limit: float) -> float:
    """Seconds from `since` (epoch) until `predicate` holds, polled every second for `limit` seconds; inf if never."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return time.time() - since
        time.sleep(1.0)
    return float("inf")


def alarm_at(bench: Bench, run: str, kind: contract.RunAlarm, since: float) -> float | None:
    """When the synthesized run alarm `kind` is first in ALARM on the run's recorded metrics (the project's evaluator:
    moto evaluates none), from `since`; None yet."""
    alarms = alarm_set_for_run(bench.monitoring, "smoke", run)
    samples = recorded_samples(bench.aws.client("cloudwatch", **bench.reader), alarms)
    return alarms.first_alarm(contract.run_alarm_name("demo", "smoke", run, kind), samples, since, time.time())


def bench_hang_named(bench: Bench, *, step_s: float = 1.0, hang_after: int = 120) -> dict[str, Any]:
    """Issue 31: four ranks as two torchrun nodes (`TwoNodes`), steps of about `step_s`; rank 3 hangs in the team's
    code after `hang_after` steps (past warm-up and the baseline). Seconds from the hang until the doctor names rank
    3 (its stack in S3, from the live snapshot): `hang_named_s`; until its stalled alarm is in ALARM:
    `stall_alarm_s`."""
    run = "detect-hang-paced"
    nodes = TwoNodes(bench, run, "--step-sleep", str(step_s), "--hang-after-step", str(hang_after), "--hang-rank", "3")
    try:
        hung = nodes.said("hanging after step")  # rank 3 is node 1's

        def rank_3_named() -> bool:  # `paused` before stall_dump_after (90 s), `rank-hung` after: named either way
            found = bench.diagnosis(run)
            rank = found.stopped_rank
            named = rank is not None and rank.rank == 3 and bool(rank.stack)
            return named and found.diagnosis in ("paused", "rank-hung")

        named = time_until(rank_3_named, 300)
        # The stalled alarm on the run's threshold (30 s at this pace): the heartbeats past it, then evaluated
        time.sleep(max(0.0, hung + contract.STALLED_BUDGET_S + 5 - time.time()))
        at = alarm_at(bench, run, contract.RunAlarm.STALLED, hung)
        alarmed = (at - hung) if at else float("inf")
        return {"hang_named_s": named, "hang_named_step_s": step_s, "stall_alarm_s": alarmed}
    finally:
        nodes.end()


def bench_slow(bench: Bench, *, step_s: float = 1.0) -> dict[str, Any]:
    """Issue 31, two runs side by side, each four ranks as two torchrun nodes (`TwoNodes`) calling `run.watch` on
    their DDP model, steps of about `step_s`:
    - one rank of four 1.5x slower in its own work after step 60 (every rank's step interval stays the slowest's):
      seconds until the doctor names rank 2 (`rank-slow`) and its slow alarm is in ALARM, `slow_rank_named_s`;
    - every rank 1.6x slower after step 360 (past the run's first full window, its baseline): seconds until the
      doctor says `run-slowed` and its slowed alarm is in ALARM, `run_slowed_named_s`."""
    rank_run, whole_run = "detect-slow-rank", "detect-run-slowed"
    sleep = ["--step-sleep", str(step_s)]
    ranks = TwoNodes(bench, rank_run, *sleep, "--slow-after-step", "60", "--slow-rank", "2", "--slow-by", "1.5")
    whole = TwoNodes(bench, whole_run, *sleep, "--slow-after-step", "360", "--slow-by", "1.6")
    try:
        one_slowed = ranks.said("slowing by")  # rank 2 is node 1's

        def rank_2_named() -> bool:
            found = bench.diagnosis(rank_run)
            (check,) = [v for v in found.verdicts if v.check == "rank"]
            return found.diagnosis == "rank-slow" and check.evidence.startswith("rank 2 ")

        named = seconds_after(one_slowed, rank_2_named, 900)
        alarmed = seconds_after(
            one_slowed, lambda: alarm_at(bench, rank_run, contract.RunAlarm.SLOW, one_slowed) is not None, 900
        )
        ranks.end()  # measured: its CPU to the other run
        slowed_at = whole.said("slowing by")
        said = seconds_after(slowed_at, lambda: bench.doctor(whole_run) == "run-slowed", 1200)
        whole_alarmed = seconds_after(
            slowed_at, lambda: alarm_at(bench, whole_run, contract.RunAlarm.SLOWED, slowed_at) is not None, 1200
        )
        return {
            "slow_rank_named_s": max(named, alarmed),  # the doctor's verdict and the alarm, both
            "slow_rank_doctor_s": named,
            "slow_rank_alarm_s": alarmed,
            "run_slowed_named_s": max(said, whole_alarmed),
            "run_slowed_doctor_s": said,
            "run_slowed_alarm_s": whole_alarmed,
        }
    finally:
        ranks.end()
        whole.end()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bench_cost(bench: Bench, minutes: float = 1.0) -> dict[str, Any]:
    """Requests a job sends per minute at the production heartbeat, and what an hour of that costs."""
    steps = int(minutes * 60 / 0.05)
    summary = bench.run(
        "cost", "--steps", str(steps), "--step-sleep", "0.05", "--heartbeat-interval", "15", "--flush-interval", "10"
    )
    seconds = summary["loop_seconds"]
    by_service = summary["aws_requests_by_service"]
    cloudwatch = by_service.get("monitoring", 0) + by_service.get("cloudwatch", 0)
    s3 = by_service.get("s3", 0)
    per_minute = cloudwatch / (seconds / 60)
    s3_per_hour = s3 / (seconds / 3600)
    metrics = len(contract.JOB_METRICS) + len(contract.TEAM_ROLLUP_METRICS) + 1  # StepTimeRatio, once it has a baseline
    hourly = {
        "put_metric_data": per_minute * 60 * PRICES["put_metric_data_per_1000_requests"] / 1000,
        "custom_metrics": metrics * PRICES["custom_metric_per_month"] / HOURS_PER_MONTH,
        # silent, stalled, slow and slowed (30 s periods: high resolution), and the composite that notifies
        "alarms": (
            len(contract.RunAlarm.metric_alarms()) * PRICES["high_resolution_alarm_per_month"]
            + PRICES["composite_alarm_per_month"]
        )
        / HOURS_PER_MONTH,
        "s3_puts": s3_per_hour * PRICES["s3_put_per_1000_requests"] / 1000,
    }
    return {
        "cloudwatch_requests_per_job_minute": per_minute,
        "s3_requests_per_job_hour": s3_per_hour,
        "telemetry_cost_per_job_hour_usd": sum(hourly.values()),
        "telemetry_cost_breakdown_usd_per_hour": hourly,
        "prices_usd": PRICES,
    }


def bench_demo(rounds: int = 3) -> dict[str, Any]:
    """`beacon local` end to end, median of `rounds` runs: one run on a shared machine swings by 15 s."""
    walls, ok = [], True
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "beacon_ops.cli", "local", "--workdir", str(OUT / "demo")],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
        )
        walls.append(time.perf_counter() - started)
        ok = ok and done.returncode == 0
    return {"demo_wall_s": median_of(walls), "demo_wall_rounds_s": walls, "demo_ok": ok}


def bench_rank_signal(rounds: int = 7, steps: int = 20_000, ranks: int = 4) -> dict[str, Any]:
    """Issue 17: what the per-rank progress signal adds on the training thread. The loop's own part is
    the step it stores for the signal (`Run.mark_step`); the signal threads of 4 ranks (one process
    here, rewriting every 20 ms instead of 5 s, so contention shows) run beside it. Timed inside the
    call, median of rounds, with and without the signals, interleaved."""
    from beacon.evidence.progress import ProgressClock
    from beacon.evidence.ranks import RankSignal

    def loop(with_signals: bool) -> float:
        progress = ProgressClock()
        with tempfile.TemporaryDirectory() as directory:
            signals = [
                RankSignal(
                    Path(directory), rank=r, local_rank=r, world_size=ranks, progress=progress,
                    interval=0.02, stall_dump_after=3600,
                ).start()
                for r in range(ranks)
            ] if with_signals else []  # fmt: skip
            spent = 0.0
            for step in range(steps):
                started = time.perf_counter()
                progress.dispatched_step = step  # what mark_step adds for the signal
                progress.step_finished()
                spent += time.perf_counter() - started
            for signal in signals:
                signal.stop()
        return spent / steps * 1000

    without, with_signals = interleaved(lambda: loop(False), lambda: loop(True), rounds)
    # The goal bounds what the signal adds; the whole stored-step call, signals running, bounds that.
    return {
        "rank_signal_ms_per_step": median_of(with_signals),
        "rank_signal_added_ms_per_step": median_of(with_signals) - median_of(without),
    }


GOALS = {
    "synth_ratio": ("<=", 2.0),
    "telemetry_throughput_ratio": (">=", 0.99),
    "telemetry_ms_per_step": ("<=", 0.03),
    "checkpoint_block_ratio": ("<=", 0.10),
    "silent_detection_s": ("<=", 120),
    "silent_alarm_s": ("<=", 120),
    "stall_detection_s": ("<=", 180),
    "stall_alarm_short_steps_s": ("<=", 75),  # 0.05 s steps: the run's threshold is 30 s
    "hang_named_s": ("<=", 45),  # at 1 s steps: the stall threshold follows the pace (issue 31)
    "stall_alarm_s": ("<=", 75),  # the same hang, the synthesized stalled alarm on its recorded metrics
    "slow_rank_named_s": ("<=", 360),  # one rank of four 1.5x slower: the doctor and its alarm (issue 31)
    "run_slowed_named_s": ("<=", 660),  # every rank 1.6x slower than the run's baseline
    "demo_wall_s": ("<=", 90),
    "beacon_log_ms_per_step": ("<=", 0.01),
    "beacon_records_lost_after_sigkill": ("<=", 0),
    "sustained_records_per_s": (">=", 20_000),
    "sustained_rss_growth_mb": ("<=", 64),
    "firehose_rss_growth_mb": ("<=", 128),
    "mirror_lag_median_s": ("<=", 1.0),
    "sustained_records_per_s_ratio": (">=", 0.95),  # this runtime over the release before the redesign
    "rank_signal_ms_per_step": ("<=", 0.01),
    "doctor_long_run_s": ("<=", 10),
}


def cpu_model() -> str:
    """The CPU's model name (Linux), so a reader elsewhere knows which machine the figures come from."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown"


def bench_library(bench: Bench, records: int, outage_s: float) -> dict[str, Any]:
    """Issue 14's figures: Beacon beside MLflow, TensorBoard and W&B offline in one run (the same loop,
    10 metrics a step), sustained records/s to S3 with memory through an S3 outage, the MLflow mirror's lag."""
    report: dict[str, Any] = {}
    env = {**bench.env(), "BEACON_ALARMS": "false"}
    with tempfile.TemporaryDirectory(dir=ROOT / ".beacon") as scratch:
        mlflow = MlflowServer(Path(scratch))
        mlflow.start()
        try:
            print("bench: Beacon, MLflow, TensorBoard, W&B offline: the same loop, then SIGKILL", flush=True)
            report.update(bench_trackers(env, s3=bench.aws.client("s3", **bench.writer), bucket=BUCKET, mlflow=mlflow))
            beacon = report["trackers"]["beacon"]
            report["beacon_log_ms_per_step"] = beacon["ms_per_step"]
            report["beacon_records_lost_after_sigkill"] = beacon["records_lost_after_sigkill"]
            print("bench: the MLflow mirror's lag in steady state", flush=True)
            report.update(bench_mirror_lag(env, bucket=BUCKET, mlflow=mlflow))
        finally:
            mlflow.stop()
    print(f"bench: sustained records/s to S3, {records} records, a {outage_s:.0f} s S3 outage half-way", flush=True)
    report.update(bench_sustained(env, s3_endpoint=bench.aws.url, bucket=BUCKET, records=records, outage_s=outage_s))
    print("bench: the firehose, 2,000,000 records never held back (the memory bound at work)", flush=True)
    report.update(bench_firehose(env, s3_endpoint=bench.aws.url, bucket=BUCKET))
    print(f"bench: this runtime against the release before the redesign ({RELEASE_TAG}), interleaved", flush=True)
    report.update(bench_against_release(env, s3_endpoint=bench.aws.url, bucket=BUCKET))
    return report


def print_trackers(trackers: dict[str, Any]) -> None:
    print(f"\n{'tracker':12} {'ms/step':>9} {'durable s':>10} {'lost/logged after SIGKILL':>27}")
    for name, row in trackers.items():
        lost = f"{row['records_lost_after_sigkill']}/{row['records_logged']}"
        print(f"{name:12} {row['ms_per_step']:9.4f} {row['durable_s']:10.3f} {lost:>27}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run")
    parser.add_argument("--records", type=int, default=1_000_000, help="records for the sustained figure")
    parser.add_argument("--outage-s", type=float, default=60.0, help="the S3 outage during the sustained run")
    parser.add_argument("--only-library", action="store_true", help="only issue 14's figures (the library's)")
    parser.add_argument("--only-doctor", action="store_true", help="only the doctor on a 1,000,000-record run")
    parser.add_argument(
        "--only-hang", action="store_true", help="only hang_named_s and stall_alarm_s (four ranks, two nodes)"
    )
    parser.add_argument(
        "--only-slow", action="store_true", help="only slow_rank_named_s and run_slowed_named_s (about 17 minutes)"
    )
    parser.add_argument(
        "--only-detection", action="store_true", help="only the production heartbeat's silent and stall figures"
    )
    args = parser.parse_args()
    if args.only_hang or args.only_slow or args.only_detection:
        with tempfile.TemporaryDirectory(dir=ROOT / ".beacon") as scratch:
            bench = open_bench(Path(scratch))
            try:
                if args.only_detection:
                    print(json.dumps(bench_detection(bench)), flush=True)
                else:
                    print(json.dumps(bench_hang_named(bench) if args.only_hang else bench_slow(bench)), flush=True)
            finally:
                bench.aws.stop()
        return
    args.only_library = args.only_library or args.only_doctor
    OUT.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "system": platform.platform()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if not args.only_library:
        print("bench: synth (full app vs empty app, interleaved)", flush=True)
        report.update(bench_synth())
        print(
            "bench: idle cost of both profiles from their templates (rewrites docs/cost.md and the README)", flush=True
        )
        with tempfile.TemporaryDirectory(dir=ROOT / ".beacon") as scratch:
            report.update(bench_idle_cost(Path(scratch)))
    with tempfile.TemporaryDirectory(dir=ROOT / ".beacon") as scratch:
        bench = open_bench(Path(scratch))
        try:
            if not args.only_library:
                print("bench: checkpoint (async hand-over vs the same save and upload on the loop)", flush=True)
                report.update(bench_checkpoint(bench))
                print("bench: telemetry on vs off (moto in its own process)", flush=True)
                report.update(bench_telemetry(bench))
                print("bench: detection with the production heartbeat (takes a few minutes)", flush=True)
                report.update(bench_detection(bench))
                print("bench: a hang at 1 s steps, four ranks on two nodes, named by the doctor", flush=True)
                report.update(bench_hang_named(bench))
                print("bench: a slow rank, and a slowed run, at 1 s steps on two nodes (about 17 minutes)", flush=True)
                report.update(bench_slow(bench))
                print("bench: requests and cost per job", flush=True)
                report.update(bench_cost(bench))
            if not args.only_doctor:
                report.update(bench_library(bench, args.records, args.outage_s))
                print("bench: the per-rank progress signal's cost on the training thread (4 ranks)", flush=True)
                report.update(bench_rank_signal())
            print("bench: the doctor on a 1,000,000-record run of 2,000 chunks (its index and tail)", flush=True)
            report.update(
                bench_doctor(
                    s3_writer=bench.aws.client("s3", **bench.writer),
                    s3_reader=bench.aws.client("s3", **bench.reader),
                    cloudwatch=bench.aws.client("cloudwatch", **bench.reader),
                    bucket=BUCKET,
                    region=REGION,
                )
            )
        finally:
            bench.aws.stop()
    if not args.only_library:
        print("bench: beacon local end to end", flush=True)
        report.update(bench_demo())
    goals = {name: goal for name, goal in GOALS.items() if name in report}
    report["goals"] = {
        name: {"goal": f"{op} {limit}", "met": report[name] <= limit if op == "<=" else report[name] >= limit}
        for name, (op, limit) in goals.items()
    }
    (OUT / "report.json").write_text(json.dumps(report, indent=2))
    print(f"\n{'figure':36} {'value':>12}  goal")
    for name, (op, limit) in goals.items():
        met = "ok" if report["goals"][name]["met"] else "MISSED"
        print(f"{name:36} {report[name]:12.3f}  {op} {limit}  {met}")
    for name in (
        "cloudwatch_requests_per_job_minute",
        "telemetry_cost_per_job_hour_usd",
        "idle_cost_per_month_usd",
        "idle_cost_lean_per_month_usd",
    ):
        if name in report:
            print(f"{name:36} {report[name]:12.4f}")
    if "trackers" in report:
        print_trackers(report["trackers"])
    print(f"\nreport: {OUT / 'report.json'}")


if __name__ == "__main__":
    main()
