"""Ranks from torchrun's environment; the backend from the device."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    rank: int
    local_rank: int
    size: int
    device: torch.device

    @property
    def is_writer(self) -> bool:
        """Only rank 0 touches the sinks: records, event files, TensorBoard, CloudWatch."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def finish_together(self, timeout_s: float) -> None:
        """Wait, bounded, until every rank is done before any tears the process group down.

        Rank 0 drains for up to its shutdown budget after the others have nothing left to do; a rank
        that destroyed its group and exited meanwhile left rank 0 holding a dead peer inside the
        group. gloo's monitored barrier also names a rank that never arrives."""
        if not self.distributed:
            return
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
        except RuntimeError as error:
            logging.getLogger("beacon.distributed").error("ranks did not finish together: %s", error)

    def broadcast(self, value: str) -> str:
        """Rank 0's value, on every rank."""
        if not self.distributed:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return str(holder[0])


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


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
    if size > 1:
        dist.init_process_group(backend=backend_for(device))
    try:
        yield World(rank=rank, local_rank=local_rank, size=size, device=device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
