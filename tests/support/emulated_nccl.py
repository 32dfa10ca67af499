"""The job as it runs on GPUs with nccl, on a CPU box.

nccl does not exist here, but its limit does: a group bound to gloo for `cuda` only serves no CPU
tensor ("No backend type associated with device type cpu"), exactly like an nccl group. So the
backend the job would choose for a CUDA device is taken, and nccl in it replaced by gloo bound to the
same device types. `python -m tests.support.emulated_nccl <job flags>` runs smoke_job.train that way (under
torchrun too); `emulated_with_gloo` serves in-process tests.
"""

from __future__ import annotations

import runpy

import torch
from beacon.process import distributed


def emulated_with_gloo(backend: str) -> str:
    """The same device coverage as `backend`, with gloo in place of nccl; bare "nccl" is CUDA-only."""
    pairs = []
    for part in backend.split(","):
        device, _, name = part.rpartition(":")
        pairs.append(f"{device or 'cuda'}:gloo" if name == "nccl" else part)
    return ",".join(pairs)


_job_backend_for = distributed.backend_for


def gpu_backend_on_cpu() -> str:
    return emulated_with_gloo(_job_backend_for(torch.device("cuda", 0)))


if __name__ == "__main__":
    distributed.backend_for = lambda device: gpu_backend_on_cpu()
    runpy.run_module("smoke_job.train", run_name="__main__", alter_sys=True)
