"""A plain DDP loop with Beacon's five lines. Settings come from BEACON_* (the stack's Job sets them;
on a laptop: BEACON_BUCKET, BEACON_SPOOL_DIR, BEACON_CHECKPOINT_DIR, ...).

    python examples/plain_ddp.py --steps 200
    torchrun --nproc-per-node 2 examples/plain_ddp.py --steps 200
"""

from __future__ import annotations

import argparse

import beacon
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args()

    run = beacon.init("plain-ddp")  # 1: preflight, resume point, sinks (rank 0); the process group if torchrun
    torch.manual_seed(run.world.rank)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if (state := run.load_checkpoint()) is not None:  # what the previous attempt saved
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    trained = DistributedDataParallel(model) if run.world.distributed else model
    loss_fn = nn.MSELoss()

    for step in range(run.resume_step, args.steps):
        inputs = torch.randn(32, 16)
        loss = loss_fn(trained(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log({"loss": loss.detach(), "lr": 0.05}, step)  # 2: a queue append
        if (step + 1) % args.checkpoint_every == 0:  # 3: async; latest waits for durable records
            run.checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)
        if run.should_stop():  # 4: SIGTERM on any rank: every rank stops at this step
            break
    report = run.finish()  # 5: bounded drain, then the final state
    if run.is_writer:
        print(f"{report.state.value}: last step {report.last_step}, {report.delivery.records} records", flush=True)


if __name__ == "__main__":
    main()
