"""Every collective of the job works on a process group shaped like GPU training's (nccl serves
CUDA tensors only), emulated on this CPU box with gloo bound to the same device types."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from beacon.evidence.progress import ProgressClock
from beacon.process.distributed import World, backend_for
from beacon.process.liveness import Liveness
from beacon.run import Run
from beacon.settings import RunSettings
from beacon.telemetry import NullTelemetry

from tests.support.emulated_nccl import emulated_with_gloo, gpu_backend_on_cpu
from tests.support.job_harness import JobResult
from tests.support.synth import ROOT


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_emulation_keeps_nccls_device_coverage() -> None:
    assert emulated_with_gloo("nccl") == "cuda:gloo"
    assert emulated_with_gloo("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:gloo"


def test_gpus_get_gloo_for_cpu_values_and_nccl_for_cuda_tensors() -> None:
    assert backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl"
    assert backend_for(torch.device("cpu")) == "gloo"


@pytest.fixture
def gpu_shaped_group() -> Iterator[World]:
    """A one-process group with the backend the job picks on GPUs (nccl emulated), as a world whose
    every collective path is taken."""
    dist.init_process_group(
        backend=gpu_backend_on_cpu(), init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield World(rank=0, local_rank=0, size=1, device=torch.device("cpu"), grouped=True)
    finally:
        dist.destroy_process_group()


def test_the_stop_flag_collective_works_on_a_gpu_shaped_group(gpu_shaped_group: World, tmp_path: Path) -> None:
    run = Run(
        settings=RunSettings(telemetry=False),
        world=gpu_shaped_group,
        progress=ProgressClock(),
        telemetry=NullTelemetry(),
        checkpointer=None,
        resume_limit=None,
        liveness=Liveness(tmp_path / "heartbeat", local_rank=0, interval=1.0),
        stop=threading.Event(),
    )
    assert run.should_stop() is False
    run.stop.set()
    assert run.should_stop() is True


def test_rank_0s_values_are_broadcast_on_a_gpu_shaped_group(gpu_shaped_group: World) -> None:
    assert gpu_shaped_group.broadcast("run-1") == "run-1"


def test_a_two_rank_job_on_a_gpu_shaped_group_trains_checkpoints_and_exits_0(tmp_path: Path) -> None:
    """Run id and preflight broadcasts, DDP, the per-step stop flag and the final checkpoint, on
    two ranks. On 6cb2f94 (backend "nccl") the first collective failed."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    done = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "tests.support.emulated_nccl",
            "--telemetry",
            "false",
            "--steps",
            "6",
            "--batch-size",
            "4",
            "--workers",
            "0",
            "--checkpoint-interval",
            "3",
            "--checkpoint-dir",
            str(tmp_path / "checkpoints"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = {s["rank"]: s for s in JobResult(done.returncode, done.stdout, done.stderr, 0.0).summaries}
    assert sorted(summaries) == [0, 1]
    assert all(s["last_step"] == 5 and s["exit_code"] == 0 for s in summaries.values())
    assert summaries[0]["checkpoints"], "rank 0 checkpointed"


@pytest.mark.skipif(torch.cuda.is_available(), reason="proves the message of a machine without a GPU")
def test_gpu_check_without_a_gpu_says_so_in_one_line_and_fails() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "no CUDA device: gpu-check needs one"


def test_gpu_checks_forced_nccl_timeout_passes_only_when_the_dump_names_rank_1() -> None:
    """The verdict of `make gpu-check`'s forced nccl timeout (it runs only with 2 GPUs): rank 0's dump must exist,
    and PyTorch's analyser must name rank 1 as the rank that missed the all_reduce (or rank 1 left no dump)."""
    from beacon_ops.doctor.flight_recorder import FlightRecorderReading, Mismatch
    from bench.gpu_check import forced_nccl_timeout, timeout_verdict

    keys = [f"flight-recorder-rank-{rank}" for rank in (0, 1)]
    missed = Mismatch(operation="nccl:all_reduce", sequence_id=6, group="0:default_pg", joined=[0], missing=[1])
    assert timeout_verdict(-6, FlightRecorderReading(keys, mismatch=missed, world_size=2)) == []
    assert timeout_verdict(-6, FlightRecorderReading(keys[:1], world_size=2)) == [], "rank 1 left none: named absent"
    assert timeout_verdict(-6, None) == ["no flight-recorder dump was written where the Job points nccl"]
    assert timeout_verdict(0, FlightRecorderReading(keys, world_size=2)) == [
        "torchrun exited 0: the lone all_reduce did not time out",
        "both ranks dumped, yet no mismatch: flight recorder of rank(s) 0, 1: no mismatched collective",
    ]
    assert "no dump from rank 0" in timeout_verdict(-6, FlightRecorderReading(keys[1:], world_size=2))[0]
    assert forced_nccl_timeout(1, {}) == {"status": "skipped: nccl needs 2 GPUs for 2 ranks, found 1"}
