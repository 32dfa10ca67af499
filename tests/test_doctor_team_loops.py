"""The doctor on a team's own loop (issue 27): the verdict from all the evidence it holds, not the smoke job's.

A plain two-rank DDP script on gloo under torchrun, against the embedded AWS: rank 1 hangs in the team's own code
at step 100, rank 0 waits inside `loss.backward()`, where DDP's reducer runs the gradient all_reduce from C++ hooks
(its Python stack shows `backward`, no collective). The stall dump comes after 3 s here (90 s in a Job).

A step logged in two calls (finding 5) is one step: the contract's history merges them. A start that failed its
preflight says so in its record, and the doctor counts it apart (finding 4); a killed run synced afterwards has its
end written by `beacon.sync`, under the one final-state rule, and is named at its newest step (finding 3)."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from beacon import contract
from beacon.contract.rank_evidence import FLIGHT_RECORDER_PREFIX, RankProgress

from beacon_ops.doctor.diagnosis import DoctorInputs, diagnose
from beacon_ops.doctor.flight_recorder import ranks_in_a_collective
from beacon_ops.doctor.rank_verdict import which_rank
from beacon_ops.evidence.reading import read_run
from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, keys_under, signal_group, wait_for
from tests.support.stacks import stall_dump
from tests.support.synth import ROOT

DDP_LOOP = """
import os, time
import torch
from torch.distributed.fsdp import fully_shard
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


def sharded(model):  # FSDP2: each linear layer its own group, then the root
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def train():
    run = beacon.init("ddp")
    model = WRAPPED(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
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


def line_of(text: str) -> int:
    """The line of the training script that holds `text`, as its stack shows it."""
    lines = textwrap.dedent(DDP_LOOP).splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


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


def diagnosed_while_it_hangs(as_writer: WriterSession, strict_aws: str, tmp_path: Path, run: str, body: str) -> Any:
    """The doctor on the team's loop under torchrun while one rank hangs, once it reads both ranks' evidence."""
    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)
    job = start(harness, tmp_path, run, body)
    prefix = contract.run_prefix("ddp", run) + f"{contract.RANKS}/"
    try:
        as_writer.aws.reset_auth_only()  # read as the admin
        s3 = as_writer.aws.client("s3")

        def live() -> bool:
            return any(k.endswith(contract.LIVE_SNAPSHOT_COMPLETE) for k in keys_under(s3, as_writer.bucket, prefix))

        assert wait_for(live, timeout=180), "rank 0's live snapshot of the stall reached S3"
        # A first snapshot can precede a rank's own dumps (each rank dumps its stacks and its flight recorder at its
        # own stall age): the doctor, like the alarm function, reads again until the evidence of both ranks is in
        readings: list[Any] = []

        def names_the_rank_from_both_ranks() -> bool:
            readings.append(doctor(as_writer, "ddp", run))
            rank = {v.check: v for v in readings[-1].verdicts}.get("rank")
            return readings[-1].diagnosis == "rank-hung" and rank is not None and "no dump from" not in rank.evidence

        wait_for(names_the_rank_from_both_ranks, timeout=90, interval=2)
        return readings[-1]
    finally:
        signal_group(job, signal.SIGKILL)
        job.communicate(timeout=60)


@pytest.mark.parametrize("hang", ["team-code", "data-loader"])
def test_a_rank_hung_in_a_ddp_loop_is_named_where_it_hangs_and_rank_0_waits_in_ddps_gradient_all_reduce(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path, hang: str
) -> None:
    """It was `stalled ... py-spy dump the rank 0 process`, and "none stands out" beside the flight recorder's own
    "rank(s) 1 did not join" (issue 27, finding 1); and `silent` at 1 s heartbeats (finding 2)."""
    body = DDP_LOOP.replace("HANG_WHERE", hang).replace("WRAPPED", "DDP")
    diagnosis = diagnosed_while_it_hangs(as_writer, strict_aws, tmp_path, f"ddp-{hang}", body)
    verdicts = {v.check: v for v in diagnosis.verdicts}
    assert diagnosis.diagnosis == "rank-hung", [(v.check, v.verdict, v.evidence) for v in diagnosis.verdicts]
    named = verdicts["rank"].evidence
    # Both documents say step 39, the last either finished: rank 1 hangs inside step 40. Its DataLoader's worker
    # hangs: the rank's main thread waits for it where the loop asks for the next batch.
    if hang == "data-loader":
        where = f"{tmp_path}/train.py:{line_of('loss = model(next(batches))')} in train, waiting for its DataLoader"
    else:
        where = f"{tmp_path}/train.py:{line_of('# the team')} in train"
    expected = f"rank 1 hung at step 40 in training ({where}); rank 0 waits in DDP's gradient all_reduce; "
    assert named.startswith(expected + "first mismatched collective: gloo:all_reduce #"), named
    assert named.endswith(", joined by rank(s) 0; rank(s) 1 did not join"), "the flight recorders say so too"
    # Live at 1 s heartbeats, stalled past the run's own threshold (3 s here), and no py-spy the pod cannot run
    assert (verdicts["liveness"].verdict, verdicts["liveness"].status) == ("stalled", "fail"), verdicts["liveness"]
    assert "(> 3 s)" in verdicts["liveness"].evidence and "py-spy" not in verdicts["liveness"].fix


def test_a_rank_hung_in_an_fsdp2_loop_is_named_and_rank_0_waits_in_fsdps_collectives(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path
) -> None:
    """The loop's model sharded with `fully_shard` (FSDP2, gloo on CPU): rank 1 hangs in the team's code before step
    40's forward, rank 0 waits in FSDP's all_gather of the parameters, issued from its pre-forward hook."""
    body = DDP_LOOP.replace("HANG_WHERE", "team-code").replace("WRAPPED", "sharded")
    diagnosis = diagnosed_while_it_hangs(as_writer, strict_aws, tmp_path, "fsdp2", body)
    named = {v.check: v for v in diagnosis.verdicts}["rank"].evidence
    assert diagnosis.diagnosis == "rank-hung", [(v.check, v.verdict, v.evidence) for v in diagnosis.verdicts]
    where = f"{tmp_path}/train.py:{line_of('# the team')} in train"
    expected = f"rank 1 hung at step 40 in training ({where}); rank 0 waits in FSDP's all_gather; "
    assert named.startswith(expected + "first mismatched collective: gloo:"), named
    assert named.endswith(", joined by rank(s) 0; rank(s) 1 did not join"), "the flight recorders say so too"


# --- a rank inside backward: DDP's gradient all_reduce only where its flight recorder says a collective is in flight
TORCH = "/venv/lib/python3.11/site-packages/torch"
IN_BACKWARD = (f"{TORCH}/autograd/graph.py:_engine_run_backward", f"{TORCH}/autograd/__init__.py:backward",
               f"{TORCH}/_tensor.py:backward", "/app/train.py:train")  # fmt: skip
IN_TEAM_CODE = ("/app/train.py:train",)
IN_ALL_REDUCE = (f"{TORCH}/distributed/distributed_c10d.py:all_reduce", "/app/train.py:train")


def stacks_at(rank: int, *main_frames: str) -> str:
    """A rank's stall dump 3 s after step 39, its frames at line 9."""
    return stall_dump(rank, *main_frames, line=9, step=39, stalled_s=3)


def flight_recorder_dump(enqueued: int, completed: int) -> bytes:
    """A rank's flight-recorder dump as torch 2.13 writes it on gloo, its entries left out."""
    status = {
        "last_enqueued_collective": enqueued,
        "last_started_collective": -1,
        "last_completed_collective": completed,
    }
    return pickle.dumps({"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
                         "pg_status": {"0": status}, "entries": []})  # fmt: skip


def two_ranks() -> list[RankProgress]:
    return [RankProgress(r, r, 2, 39, "training", 3.0, 100.0, 97.0, 1, "", "", "", 1) for r in (0, 1)]


def test_a_rank_inside_backward_with_a_collective_in_flight_waits_in_ddps_gradient_all_reduce() -> None:
    dumps = {f"p/ranks/attempt-00000/live-00000/{FLIGHT_RECORDER_PREFIX}{r}": flight_recorder_dump(96 - r, 95)
             for r in (0, 1)}  # fmt: skip
    in_flight = ranks_in_a_collective(dumps)
    assert in_flight == {0}, "rank 0 issued collective 96, the reducer's bucket all_reduce; rank 1 never did"
    stacks = {0: stacks_at(0, *IN_BACKWARD), 1: stacks_at(1, *IN_TEAM_CODE)}
    verdict = which_rank(two_ranks(), stacks, in_flight=in_flight)
    assert verdict is not None and verdict.line() == (
        "rank 1 hung at step 40 in training (/app/train.py:9 in train); rank 0 waits in DDP's gradient all_reduce"
    )


def test_a_rank_inside_a_backward_of_its_own_is_not_waiting_in_ddp() -> None:
    """No collective in flight on it (a model of its own, a custom autograd function that blocks): backward is its
    own work, and the rank waiting in its explicit all_reduce is the one its peer stopped."""
    dumps = {f"p/ranks/attempt-00000/{FLIGHT_RECORDER_PREFIX}{r}": flight_recorder_dump(95 + r, 95) for r in (0, 1)}
    in_flight = ranks_in_a_collective(dumps)
    assert in_flight == {1}
    stacks = {0: stacks_at(0, *IN_BACKWARD), 1: stacks_at(1, *IN_ALL_REDUCE)}
    for evidence in (in_flight, set()):  # nor without any flight recorder
        verdict = which_rank(two_ranks(), stacks, in_flight=evidence)
        assert verdict is not None and verdict.line() == (
            "rank 0 hung at step 40 in training (/app/train.py:9 in train); rank 1 waits in all_reduce"
        ), evidence
    assert "DDP" not in str(which_rank(two_ranks()[:1], {0: stacks_at(0, *IN_BACKWARD)})), "nor a run of one rank"


def test_a_rank_in_fsdps_hooks_waits_in_the_collective_its_frames_show() -> None:
    """FSDP2's pre-forward all_gather of the parameters, and its post-backward reduce_scatter of the gradients."""
    fsdp = f"{TORCH}/distributed/fsdp/_fully_shard"
    gathering = (
        f"{TORCH}/distributed/distributed_c10d.py:all_gather_single",
        f"{fsdp}/_fsdp_collectives.py:foreach_all_gather",
        f"{fsdp}/_fsdp_param_group.py:unshard",
        f"{fsdp}/_fsdp_state.py:_pre_forward",
        f"{TORCH}/nn/modules/module.py:_call_impl",
        *IN_TEAM_CODE,
    )
    scattering = (f"{TORCH}/distributed/distributed_c10d.py:reduce_scatter_tensor",
                  f"{fsdp}/_fsdp_collectives.py:foreach_reduce", f"{fsdp}/_fsdp_param_group.py:post_backward",
                  *IN_BACKWARD)  # fmt: skip
    for frames, collective in ((gathering, "FSDP's all_gather"), (scattering, "FSDP's reduce_scatter")):
        verdict = which_rank(two_ranks(), {0: stacks_at(0, *frames), 1: stacks_at(1, *IN_TEAM_CODE)})
        assert verdict is not None and verdict.line().endswith(f"; rank 0 waits in {collective}"), verdict


def test_a_flight_recorder_dump_that_is_not_one_shows_no_collective_in_flight() -> None:
    forged = {b"[]", b"not a pickle", pickle.dumps({"pg_status": {"0": {"last_enqueued_collective": "9"}}}),
              pickle.dumps({"pg_status": []}), pickle.dumps(RankProgress)}  # fmt: skip
    assert ranks_in_a_collective({f"p/{FLIGHT_RECORDER_PREFIX}0": body for body in forged}) == set()


# --- what the runtime writes (findings 3, 4) ------------------------------------------------------------------------


def run_script(
    harness: JobHarness, tmp_path: Path, run: str, body: str, **extra: str
) -> subprocess.CompletedProcess[str]:
    """A team's one-process script, configured as the Job configures it."""
    script = tmp_path / f"{run}.py"
    script.write_text(textwrap.dedent(body))
    env = {
        **harness.env(),
        "BEACON_BUCKET": harness.bucket, "BEACON_RUN_ID": run, "BEACON_SPOOL_DIR": str(tmp_path / "spool"),
        "BEACON_CHECKPOINT_DIR": str(tmp_path / "checkpoints"), "BEACON_HEARTBEAT_FILE": str(tmp_path / "hb"),
        "BEACON_HEARTBEAT_INTERVAL": "1", "BEACON_FLUSH_INTERVAL": "0.5", "BEACON_ALARMS": "false", **extra,
    }  # fmt: skip
    command = [sys.executable, str(script)]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


KILLED_LOOP = """
import os, signal, time
import beacon

run = beacon.init("team")
for step in range(300):
    run.log({"loss": 1.0 / (step + 1)}, step)
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer, at step 299; no finish()
"""


def test_a_killed_run_synced_afterwards_is_named_at_its_newest_step_and_its_end_is_written(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path
) -> None:
    """It said `rank-died: rank 0 died at step 233` (its rank document's step, rewritten every few seconds) while
    its own timeline's newest record was step 294."""
    from tests.test_sync import aged, sync

    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)
    killed = run_script(harness, tmp_path, "killed", KILLED_LOOP)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    synced = sync(harness, aged(tmp_path / "spool" / "team" / "killed"))
    assert synced.returncode == 0, synced.stderr[-2000:]
    as_writer.aws.reset_auth_only()  # read as the admin
    key = contract.final_status_key("team", "killed")
    assert key in keys_under(as_writer.aws.client("s3"), as_writer.bucket, key), "nothing writes a killed run's end"
    final = as_writer.aws.client("s3").get_object(Bucket=as_writer.bucket, Key=key)
    end = json.loads(final["Body"].read())
    assert (end["state"], end["last_step"]) == ("failed", 299) and "no clean exit" in end["error"], end
    diagnosis = doctor(as_writer, "team", "killed")
    assert "step 299" in diagnosis.headline() and "step 2" not in diagnosis.headline().replace("step 299", ""), (
        diagnosis.headline()
    )


FAILED_THEN_PASSED = """
import beacon

run = beacon.init("team")
for step in range(5):
    run.log({"loss": 1.0 / (step + 1)}, step)
run.finish()
"""


def test_a_start_that_failed_its_preflight_is_a_failed_start_not_a_passed_attempt(
    moto_server: Any, tmp_path: Path
) -> None:
    """The first start stops at the alarm template, after its preflight record is written (a bare S3 with no
    monitoring stack); the second, without the run's alarms, runs. It read `attempt 0 passed its preflight` and
    `restarted 1 time(s)`."""
    moto_server.client("s3").create_bucket(Bucket="bare")
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    harness = JobHarness(moto_server.url, "bare", tmp_path, credentials)
    first = run_script(harness, tmp_path, "twice", FAILED_THEN_PASSED, BEACON_ALARMS="true")
    assert first.returncode == 1 and "ssm:GetParameter" in first.stderr, first.stderr[-2000:]
    second = run_script(harness, tmp_path, "twice", FAILED_THEN_PASSED)
    assert second.returncode == 0, second.stderr[-2000:]
    s3 = moto_server.client("s3")
    prefix = contract.run_prefix("team", "twice") + f"{contract.PREFLIGHT}/"
    records = [json.loads(s3.get_object(Bucket="bare", Key=k)["Body"].read()) for k in keys_under(s3, "bare", prefix)]
    assert len(records) == 2
    failed = [r for r in records if r.get("failed")]
    assert len(failed) == 1 and "ssm:GetParameter" in failed[0]["failed"], records
    diagnosis = diagnose(DoctorInputs(team="demo", experiment="team", run="twice", bucket="bare", region="us-east-1",
                                      s3=s3, cloudwatch=moto_server.client("cloudwatch")))  # fmt: skip
    evidence = " ".join(v.evidence for v in diagnosis.verdicts)
    assert diagnosis.diagnosis == "finished" and "restarted" not in evidence, evidence
    assert "1 start failed its preflight" in evidence, evidence


EVALUATED_LOOP = """
import beacon

run = beacon.init("team")
for step in range(50):
    run.log({"loss": 1.0 / (step + 1)}, step)
    if step % 10 == 9:
        run.log({"val_loss": 2.0 / (step + 1)}, step)  # the evaluation, logged at the step it ran after
run.finish()
"""


def test_an_evaluation_logged_at_its_step_is_part_of_that_step_not_a_second_writer(
    as_writer: WriterSession, strict_aws: str, tmp_path: Path
) -> None:
    """Several run.log calls for one step are one step: it read `rank-collision: records from ranks [0], 5
    duplicated step(s)`, and val_loss was left out of the live history (finding 5)."""
    harness = JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)
    done = run_script(harness, tmp_path, "evaluated", EVALUATED_LOOP)
    assert done.returncode == 0, done.stderr[-2000:]
    as_writer.aws.reset_auth_only()
    diagnosis = doctor(as_writer, "team", "evaluated")
    assert diagnosis.diagnosis == "finished", diagnosis.headline()
    live = contract.history(read_run(as_writer.aws.client("s3"), as_writer.bucket, "team", "evaluated").records)
    by_step = {r.step: r.metrics for r in live.live}
    assert all("val_loss" in by_step[step] and "loss" in by_step[step] for step in range(9, 50, 10)), by_step
