"""`python -m tests.support.dcp_job DIR STEPS ATTEMPT`: a loop in a process group of its own (one
gloo rank) that checkpoints with `torch.distributed.checkpoint.async_save` into DIR every 5 steps and
commits each save's future to Beacon; a rerun resumes from what Beacon committed."""

from __future__ import annotations

import json
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import beacon
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict_loader import load
from torch.distributed.checkpoint.state_dict_saver import async_save


def main(root: Path, steps: int, attempt: int) -> None:
    dist.init_process_group("gloo")  # the team's own group, from MASTER_ADDR/PORT, RANK, WORLD_SIZE
    model = torch.nn.Linear(4, 2)
    run = beacon.init("dcp")
    run.log_hyperparams({"optimizer": "sgd", "attempt": attempt})
    if run.resume_checkpoint is not None:
        state = {"model": model.state_dict()}
        load(state, checkpoint_id=run.resume_checkpoint)
        model.load_state_dict(state["model"])
        print("resumed", run.resume_step, run.resume_checkpoint, float(model.weight[0, 0]), flush=True)
    saving: Future[Any] | None = None
    for step in range(run.resume_step, steps):
        with torch.no_grad():
            model.weight.fill_(float(step))  # what a step did, readable after a resume
        run.log({"loss": 1.0 / (step + 1)}, step)
        if (step + 1) % 5 == 0:
            if saving is not None:
                saving.result()  # one async save at a time, as DCP asks
            path = root / f"step-{step}"
            saved = async_save({"model": model.state_dict()}, checkpoint_id=path)
            saving = saved if isinstance(saved, Future) else saved.upload_completion
            run.commit_checkpoint(step, saved, path=path)
    report = run.finish()
    print(json.dumps({"state": report.state.value, "checkpoints": report.checkpoints}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
