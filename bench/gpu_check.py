"""`make gpu-check`: the job on CUDA with nccl, as a GPU node runs it, against an embedded AWS.

torchrun starts one rank per GPU (at least one). BEACON_FORCE_PROCESS_GROUP=1 makes a process group
even for one rank, so a one-GPU machine still takes every collective path (the stop flag, the
broadcasts, DDP) on a "cpu:gloo,cuda:nccl" group. Each rank runs the real job with `run.log`
(which the job hands the loss as a CUDA tensor) under `torch.cuda.set_sync_debug_mode("error")`,
so a host-device synchronisation on the training thread fails the check. The script then checks
the loop finished and delivered, the checkpoint staging is pinned memory, and the heartbeat ran;
it prints one JSON line and exits 0 only when all of that holds. The smoke job calls `run.watch`: with more than one
rank, each rank's waits in DDP's all_reduce must be read from its CUDA events (issue 31). Without a GPU it exits 1
with one line.

With two GPUs or more it also forces an nccl timeout (issue 17: the evidence kept before anything is
killed): two ranks on two GPUs, the recorder on as the stack's Job sets it, a short group timeout, and
rank 1 missing one all_reduce. nccl's watchdog must dump rank 0's flight recorder where the Job points it
(`flight-recorder-rank-<r>`), and the doctor's reader (PyTorch's analyser) must name rank 1 as the rank that
did not join. With one GPU that part says it was skipped: nccl will not put two ranks on one GPU.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import beacon
import torch
import torch.distributed as dist
from beacon import contract
from beacon.contract.rank_evidence import FLIGHT_RECORDER_ENTRIES, FLIGHT_RECORDER_PREFIX
from beacon.process.distributed import backend_for
from smoke_job.config import parse_args
from smoke_job.job import Job

from beacon_ops.doctor.flight_recorder import FlightRecorderReading, ranks_of, read_flight_recorder
from beacon_ops.local.moto import ADMIN, REGION, EmbeddedAws

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = "no CUDA device: gpu-check needs one"
RANK_RESULT = "gpu-check-rank "
WORKER = "--rank-worker"
BUCKET = "beacon-gpu-check"
STEPS = 60
CHECKPOINT_INTERVAL = 20
RUN_TIMEOUT_S = 420
TIMEOUT_WORKER = "--nccl-timeout-worker"
NCCL_TIMEOUT_S = 10  # the group's timeout: the watchdog fires this long after rank 0 enters the lone all_reduce
AGREED_ALL_REDUCES = 5  # both ranks issue these; rank 1 then misses number 6
TIMEOUT_RUN_S = 240


def guard_log(run: beacon.Run) -> dict[str, Any]:
    """Run every `run.log` call in sync-debug mode "error"; count the calls and the synchronisations."""
    original = run.log
    counts: dict[str, Any] = {"calls": 0, "syncs": []}

    def log(metrics: Any, step: int) -> None:
        counts["calls"] += 1
        torch.cuda.set_sync_debug_mode("error")
        try:
            original(metrics, step)
        except RuntimeError as error:  # the check reports it; the run goes on to report the rest
            counts["syncs"].append(str(error).splitlines()[0])
        finally:
            torch.cuda.set_sync_debug_mode("default")

    setattr(run, "log", log)  # noqa: B010  (replacing a bound method)
    return counts


def sync_detector_works() -> bool:
    """The guard would see a synchronisation: `.item()` on a CUDA tensor raises in "error" mode."""
    probe = torch.ones(1, device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        probe.item()
    except RuntimeError:
        return True
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return False


def rank_worker(argv: list[str]) -> int:
    """One rank: smoke_job.train's main, with the log guard and a result line."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)
    config = parse_args(argv)
    run = beacon.init(settings=config.settings)
    counts = guard_log(run)
    world = run.world
    process_group = dist.get_backend_config() if dist.is_initialized() else None
    summary = Job(config, run).train()
    pace = run.progress.pace.of_rank(world.rank)  # the smoke job's run.watch: DDP's waits, on the GPU's events
    staged = run.checkpointer.staged_tensors() if run.checkpointer is not None else []
    result = {
        "rank": world.rank,
        "device": str(world.device),
        "process_group": process_group,
        "expected_process_group": backend_for(world.device),
        "exit_code": summary["exit_code"],
        "last_step": summary["last_step"],
        "checkpoints": summary["checkpoints"],
        "staged_tensors": len(staged),
        "staging_pinned": bool(staged) and all(t.is_pinned() for t in staged),
        "record_calls": counts["calls"],
        "record_syncs": counts["syncs"][:3],
        "sync_detector_works": sync_detector_works(),
        "unacknowledged_records": summary["delivery"]["unacknowledged_records"],
        "metric_batches": summary["delivery"]["metric_batches"],
        "pace_steps": pace.steps,
        "pace_wait_s": pace.wait_s if pace.wait_s == pace.wait_s else None,  # NaN: not read
        "pace_timed": run.progress.pace.timing,
    }
    print(RANK_RESULT + json.dumps(result), flush=True)
    return int(summary["exit_code"])


def nccl_timeout_worker(folder: Path) -> int:
    """One of two ranks: a few all_reduces together, then rank 1 stays away from the next and rank 0 waits in it
    until nccl's watchdog times the collective out, dumps the flight recorder and aborts the process."""
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timedelta(seconds=NCCL_TIMEOUT_S), device_id=device)
    tensor = torch.ones(1, device=device)
    for _ in range(AGREED_ALL_REDUCES):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    if rank == 1:
        time.sleep(NCCL_TIMEOUT_S * 12)  # away; torchrun stops it once rank 0 has failed
        return 0
    dist.all_reduce(tensor)
    torch.cuda.synchronize()  # never returns: the watchdog aborts the process
    print(f"rank 0's lone all_reduce completed: no timeout ({folder})", file=sys.stderr)
    return 1


def timeout_verdict(exit_code: int, reading: FlightRecorderReading | None) -> list[str]:
    """What failed of the forced timeout, one phrase each; empty when the dump named rank 1."""
    failed = []
    if exit_code == 0:
        failed.append("torchrun exited 0: the lone all_reduce did not time out")
    if reading is None:
        return [*failed, "no flight-recorder dump was written where the Job points nccl"]
    if 0 not in ranks_of(reading.keys):
        failed.append(f"no dump from rank 0, which timed out: {reading.line()}")
    if reading.unread:
        failed.append(f"dumps not analysed: {reading.unread}")
    elif reading.mismatch is not None:
        if 1 not in reading.mismatch.missing or reading.mismatch.operation != "nccl:all_reduce":
            failed.append(f"the analyser did not name rank 1 missing an all_reduce: {reading.line()}")
    elif 1 in ranks_of(reading.keys):
        failed.append(f"both ranks dumped, yet no mismatch: {reading.line()}")
    return failed


def forced_nccl_timeout(gpus: int, env: dict[str, str]) -> dict[str, Any]:
    if gpus < 2:
        return {"status": f"skipped: nccl needs 2 GPUs for 2 ranks, found {gpus}"}
    with tempfile.TemporaryDirectory(prefix="beacon-nccl-timeout-") as scratch:
        folder = Path(scratch)
        recorder = {  # as the stack's Job sets them (workloads/manifests.py)
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(folder / FLIGHT_RECORDER_PREFIX),
        }
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        command = [torchrun, "--standalone", "--nproc-per-node=2", "-m", "bench.gpu_check", TIMEOUT_WORKER, scratch]
        started = time.monotonic()
        done = subprocess.run(
            command, cwd=ROOT, env={**env, **recorder}, capture_output=True, text=True, timeout=TIMEOUT_RUN_S
        )
        dumps = {path.name: path.read_bytes() for path in folder.glob(f"{FLIGHT_RECORDER_PREFIX}*")}
        reading = read_flight_recorder(dumps, world_size=2)
        failed = timeout_verdict(done.returncode, reading)
    return {
        "status": "passed" if not failed else "failed",
        "failed": failed,
        "seconds": round(time.monotonic() - started, 1),
        "dumps": sorted(dumps),
        "verdict": reading.line() if reading is not None else "",
        "stderr_tail": done.stderr[-1500:] if failed else "",
    }


def verdicts(ranks: list[dict[str, Any]], gpus: int, heartbeat: Path, started: float, aws: Any, run: str) -> list[str]:
    """What failed, one short phrase each; empty when the check passed."""
    failed = []
    if sorted(r["rank"] for r in ranks) != list(range(gpus)):
        failed.append(f"ranks reporting {sorted(r['rank'] for r in ranks)}, expected {gpus}")
    for r in ranks:
        tag = f"rank {r['rank']}"
        same_group = set(str(r["process_group"]).split(",")) == set(r["expected_process_group"].split(","))
        if not r["device"].startswith("cuda") or not same_group:
            failed.append(f"{tag}: device {r['device']}, process group {r['process_group']}")
        if r["exit_code"] != 0 or r["last_step"] != STEPS - 1:
            failed.append(f"{tag}: exit {r['exit_code']} at step {r['last_step']}")
        if r["record_syncs"] or not r["sync_detector_works"]:
            failed.append(f"{tag}: run.log synchronised: {r['record_syncs'] or 'detector inactive'}")
        if r["pace_timed"] and (r["pace_wait_s"] is None or not 0 <= r["pace_wait_s"] < 60):
            failed.append(f"{tag}: its waits in DDP's all_reduce, timed on the GPU, read {r['pace_wait_s']}")
    writer = next((r for r in ranks if r["rank"] == 0), None)
    if writer is not None:
        if not writer["checkpoints"] or not writer["staging_pinned"]:
            failed.append(f"checkpoints {writer['checkpoints']}, staging pinned {writer['staging_pinned']}")
        if writer["unacknowledged_records"] or writer["record_calls"] < STEPS:
            failed.append(f"records: {writer['record_calls']} recorded, {writer['unacknowledged_records']} unsent")
        if writer["metric_batches"] < 2:
            failed.append(f"{writer['metric_batches']} metric batches")
    for local_rank in range(gpus):
        alive = Path(contract.liveness_file(str(heartbeat), local_rank))
        if not alive.exists() or alive.stat().st_mtime < started:
            failed.append(f"liveness file {alive.name} never touched")
    cloudwatch = aws.client("cloudwatch")
    listed = cloudwatch.list_metrics(Namespace=contract.metric_namespace("demo"), MetricName=contract.HEARTBEAT.name)[
        "Metrics"
    ]
    if not any({"Name": contract.Dim.RUN.value, "Value": run} in m["Dimensions"] for m in listed):
        failed.append("no Heartbeat metric in CloudWatch")
    return failed


def main(argv: list[str]) -> int:
    if argv[:1] == [WORKER]:
        return rank_worker(argv[1:])
    if argv[:1] == [TIMEOUT_WORKER]:
        return nccl_timeout_worker(Path(argv[1]))
    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 1
    gpus = max(1, torch.cuda.device_count())
    run = f"gpu-check-{secrets.token_hex(3)}"
    aws = EmbeddedAws.start_process()
    try:
        aws.client("s3").create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory(prefix="beacon-gpu-check-") as scratch:
            work = Path(scratch)
            env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "BEACON_"))}
            env.update(
                AWS_ENDPOINT_URL=aws.url,
                AWS_REGION=REGION,
                AWS_ACCESS_KEY_ID=ADMIN["aws_access_key_id"],
                AWS_SECRET_ACCESS_KEY=ADMIN["aws_secret_access_key"],
                BEACON_FORCE_PROCESS_GROUP="1",
                PYTHONUNBUFFERED="1",
            )
            job = [
                *("--bucket", BUCKET, "--run-id", run, "--steps", str(STEPS), "--batch-size", "64"),
                *("--checkpoint-interval", str(CHECKPOINT_INTERVAL), "--workers", "0", "--alarms", "false"),
                *("--heartbeat-interval", "1", "--flush-interval", "1", "--min-duration", "4"),
                *("--spool-dir", str(work / "spool"), "--checkpoint-dir", str(work / "checkpoints")),
                *("--heartbeat-file", str(work / "heartbeat")),
            ]
            torchrun = str(Path(sys.executable).with_name("torchrun"))
            command = [torchrun, "--standalone", f"--nproc-per-node={gpus}", "-m", "bench.gpu_check", WORKER, *job]
            started = time.time()
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            lines = done.stdout.splitlines()
            ranks = [json.loads(line.removeprefix(RANK_RESULT)) for line in lines if line.startswith(RANK_RESULT)]
            failed = verdicts(ranks, gpus, work / "heartbeat", started, aws, run)
            if done.returncode != 0:
                failed.insert(0, f"torchrun exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
            timeout = forced_nccl_timeout(gpus, env)
            failed.extend(f"forced nccl timeout: {phrase}" for phrase in timeout.get("failed", []))
    finally:
        aws.stop()
    result = {
        "gpu_check": "passed" if not failed else "failed",
        "gpus": gpus,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "failed": failed,
        "ranks": ranks,
        "forced_nccl_timeout": timeout,
    }
    print(json.dumps(result))
    if failed:
        sys.stderr.write(done.stderr[-4000:])
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
