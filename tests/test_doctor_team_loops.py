"""The doctor on a team's own loop (issue 27): the verdict from all the evidence it holds, not the smoke job's.

A plain two-rank DDP script on gloo under torchrun, against the embedded AWS: rank 1 hangs in the team's own code
at step 100, rank 0 waits inside `loss.backward()`, where DDP's reducer runs the gradient all_reduce from C++ hooks
(its Python stack shows `backward`, no collective). The stall dump comes after 3 s here (90 s in a Job)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from beacon import contract

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, keys_under, signal_group, wait_for
from tests.support.synth import ROOT

DDP_LOOP = """
import os, time
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
import beacon

HANG = "HANG_WHERE"


class Batches(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, index):
        if HANG == "data-loader" and index == 40 and int(os.environ["RANK"]) == 1:
            time.sleep(10_000)  # rank 1's data pipeline stops (a stuck read, a dead mount)
        return torch.randn(32)


def train():
    run = beacon.init("ddp")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = iter(DataLoader(Batches(), batch_size=1, num_workers=1))
    for step in range(run.resume_step, 100_000):
        if HANG == "team-code" and step == 40 and run.world.rank == 1:
            time.sleep(10_000)  # the team's own code hangs here
        loss = model(next(batches)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log({"loss": loss.item()}, step)
        time.sleep(0.01)
        if run.should_stop():
            break
    run.finish()


train()
"""


def start(harness: JobHarness, tmp_path: Path, run: str, body: str) -> subprocess.Popen[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    env = {
        **harness.env(),
        "BEACON_BUCKET": harness.bucket, "BEACON_RUN_ID": run, "BEACON_SPOOL_DIR": str(tmp_path / "spool"),
        "BEACON_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "BEACON_HEARTBEAT_FILE": str(tmp_path / "hb"),
        "BEACON_HEARTBEAT_INTERVAL": "1", "BEACON_FLUSH_INTERVAL": "0.5", "BEACON_ALARMS": "false",
        "BEACON_STALL_DUMP_AFTER": "3",
    }  # fmt: skip
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return subprocess.Popen(
        [torchrun, "--standalone", "--nproc-per-node=2", str(script)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def doctor(as_writer: WriterSession, experiment: str, run: str) -> Any:
    return diagnose(DoctorInputs(team="demo", experiment=experiment, run=run, bucket=as_writer.bucket,
                                 region="us-east-1", s3=as_writer.aws.client("s3"),
                                 cloudwatch=as_writer.aws.client("cloudwatch")))  # fmt: skip


@pytest.mark.parametrize("hang", ["team-code", "data-loader"])
def test_a_rank_hung_in_a_ddp_loop_is_named_where_it_hangs_and_rank_0_waits_in_ddps_gradient_all_reduce(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path, hang: str
) -> None:
    """It was `stalled ... py-spy dump the rank 0 process`, and "none stands out" beside the flight recorder's own
    "rank(s) 1 did not join" (issue 27, finding 1); and `silent` at 1 s heartbeats (finding 2)."""
    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)
    run = f"ddp-{hang}"
    job = start(harness, tmp_path, run, DDP_LOOP.replace("HANG_WHERE", hang))
    prefix = contract.run_prefix("ddp", run) + f"{contract.RANKS}/"
    try:
        as_writer.aws.reset_auth_only()  # read as the admin
        s3 = as_writer.aws.client("s3")

        def live() -> bool:
            return any(k.endswith(contract.LIVE_SNAPSHOT_COMPLETE) for k in keys_under(s3, as_writer.bucket, prefix))

        assert wait_for(live, timeout=180), "rank 0's live snapshot of the stall reached S3"
        diagnosis = doctor(as_writer, "ddp", run)
    finally:
        signal_group(job, signal.SIGKILL)
        job.communicate(timeout=60)
    verdicts = {v.check: v for v in diagnosis.verdicts}
    assert diagnosis.diagnosis == "rank-hung", [(v.check, v.verdict, v.evidence) for v in diagnosis.verdicts]
    named = verdicts["rank"].evidence
    # Its DataLoader's worker hangs: the rank's main thread waits for it where the loop asks for the next batch
    where = "in train, waiting for its DataLoader)" if hang == "data-loader" else "in train)"
    assert named.startswith("rank 1 hung at step ") and f"{tmp_path}/train.py:" in named and where in named, named
    assert "; 1 rank(s) wait in DDP's gradient all_reduce (backward) (0)" in named, named
    assert "rank(s) 1 did not join" in named, "the flight recorders say so too"
    # Live at 1 s heartbeats, stalled past the run's own threshold (3 s here), and no py-spy the pod cannot run
    assert (verdicts["liveness"].verdict, verdicts["liveness"].status) == ("stalled", "fail"), verdicts["liveness"]
    assert "(> 3 s)" in verdicts["liveness"].evidence and "py-spy" not in verdicts["liveness"].fix
