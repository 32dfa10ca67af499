"""Ranks from torchrun's environment; the backend from the device; every collective the job makes.

A group made with `backend="nccl"` serves CUDA tensors only, and the job also exchanges small CPU
values (the stop flag, rank 0's run id and preflight verdict). So on GPUs the group gets gloo for
the CPU and nccl for CUDA, and every collective goes through `World`, where that is checked once.
They call `distributed_c10d` itself: `run.watch` times the team's collectives through `torch.distributed`, never
Beacon's own (`beacon.evidence.step_pace`).
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

# "1" makes a process group (and takes every collective path) even for one rank, so a one-GPU
# machine still proves the collectives (`make gpu-check`).
FORCE_PROCESS_GROUP_ENV = "BEACON_FORCE_PROCESS_GROUP"


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device
    grouped: bool = False  # a process group exists (always when size > 1)
    # Beacon's own collectives carry CPU values. None: the default group serves CPU tensors (it was
    # made here, gloo beside nccl); else a gloo group beside a group the framework made (maybe nccl only).
    group: Any = None

    @classmethod
    def of_current_group(cls) -> World:
        """The ranks of a process group something else made (Lightning, Accelerate, a team's own
        init_process_group), with a gloo group of Beacon's own for its CPU collectives."""
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        gloo = dist.new_group(backend="gloo")  # a collective: every rank calls beacon.init
        return cls(dist.get_rank(), local_rank, dist.get_world_size(), device, grouped=True, group=gloo)

    @property
    def is_writer(self) -> bool:
        """Only rank 0 touches the sinks: records, event files, TensorBoard, CloudWatch."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1 or self.grouped

    def finish_together(self, timeout_s: float) -> None:
        """Wait, bounded, until every rank is done before any tears the process group down.

        Rank 0 drains for up to its shutdown budget after the others have nothing left to do; a rank
        that destroyed its group and exited meanwhile left rank 0 holding a dead peer inside the
        group. A CPU tensor, so gloo carries it beside nccl (monitored_barrier refuses a mixed group)."""
        if not self.distributed:
            return
        arrived = torch.ones(1, dtype=torch.int32)
        try:
            c10d.all_reduce(arrived, group=self.group, async_op=True).wait(timeout=timedelta(seconds=timeout_s))
        except RuntimeError as error:  # DistBackendError too: a peer gone or late
            logging.getLogger("beacon.distributed").error("ranks did not finish together: %s", error)

    def broadcast(self, value: str) -> str:
        """Rank 0's value, on every rank."""
        if not self.distributed:
            return value
        holder: list[object] = [value]
        # Pickled objects travel as CPU bytes: the group's CPU backend carries them.
        c10d.broadcast_object_list(holder, src=0, group=self.group, device=torch.device("cpu"))
        return str(holder[0])

    def any_rank(self, flag: bool) -> bool:
        """True on every rank if it is true on any: ranks leave the loop at the same step, or a
        collective hangs."""
        if not self.distributed:
            return flag
        tensor = torch.tensor([1 if flag else 0], dtype=torch.int32)  # CPU: no device sync per step
        c10d.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
        return bool(tensor.item())


def backend_for(device: torch.device) -> str:
    """gloo for CPU tensors always; nccl for CUDA tensors on GPUs."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


@contextmanager
def world_from_environment() -> Iterator[World]:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    grouped = size > 1 or os.environ.get(FORCE_PROCESS_GROUP_ENV) == "1"
    if grouped:
        dist.init_process_group(backend=backend_for(device))
    try:
        yield World(rank=rank, local_rank=local_rank, size=size, device=device, grouped=grouped)
    finally:
        if dist.is_initialized():
            # DDP's reducer sits in a reference cycle that holds the process group. Left to the
            # interpreter's exit, the group's gloo threads are torn down after Python is gone, and
            # the rank aborts ("terminate called without an active exception", exit -6): collect the
            # cycle while the interpreter is whole, then destroy the group.
            gc.collect()
            dist.destroy_process_group()
