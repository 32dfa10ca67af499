"""Beacon inside frameworks: Lightning's logger and callback, the HF Trainer's callback, and checkpoints
a framework writes itself (`Run.commit_checkpoint`). Framework jobs run as real processes against the
strict embedded AWS, configured by BEACON_* alone, with tiny models built from a config."""

from __future__ import annotations

import json
import math
import queue
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import beacon
import pytest
import torch
from beacon import contract
from beacon.checkpoint import AsyncCheckpointer, framework_checkpoint
from beacon.contract.pace import straggler_of
from beacon.integrations.common import StepRecords, numeric_metrics

from beacon_ops.evidence.reading import read_run
from tests.conftest import WriterSession
from tests.support.job_harness import JobHarness, delivered_records
from tests.support.synth import ROOT


@pytest.fixture
def harness(as_writer: WriterSession, strict_aws: str, tmp_path: Path) -> JobHarness:
    return JobHarness(strict_aws, as_writer.bucket, tmp_path, as_writer.credentials)


def environment(harness: JobHarness, run: str, **extra: str) -> dict[str, str]:
    """What the stack's Job sets (BEACON_* and the AWS SDK chain), with a fast heartbeat and flush."""
    return {
        **harness.env(),
        "BEACON_BUCKET": harness.bucket,
        "BEACON_RUN_ID": run,
        "BEACON_SPOOL_DIR": str(harness.workdir / "spool"),
        "BEACON_CHECKPOINT_DIR": str(harness.workdir / "checkpoints"),
        "BEACON_HEARTBEAT_FILE": str(harness.workdir / "heartbeat"),
        "BEACON_HEARTBEAT_INTERVAL": "0.5",
        "BEACON_FLUSH_INTERVAL": "0.5",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **extra,
    }


def run_job(command: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def records_by_step(writer: WriterSession, experiment: str, run: str) -> dict[int, dict[str, float]]:
    """Every live record by step (a rerun's superseded records set apart); a step recorded twice by
    one attempt fails here."""
    history = contract.history(delivered_records(writer.client("s3"), writer.bucket, experiment, run))
    assert not history.duplicated, (
        f"a step recorded more than once: {[(r.attempt, r.step) for r in history.duplicated]}"
    )
    records = history.live
    assert {record.rank for record in records} == {0}, "only rank 0 writes"
    return {record.step: record.metrics for record in records}


def s3_json(writer: WriterSession, key: str) -> dict[str, Any]:
    return dict(json.loads(writer.client("s3").get_object(Bucket=writer.bucket, Key=key)["Body"].read()))


def latest_pointer(harness: JobHarness, experiment: str, run: str) -> dict[str, Any]:
    return dict(json.loads((harness.workdir / "checkpoints" / experiment / run / "latest.json").read_text()))


def phases_sent(writer: WriterSession, run: str) -> set[str]:
    """The Phase dimension of every PhaseSeconds datum this run's heartbeat sent."""
    writer.aws.reset_auth_only()  # the admin's view: the writer may not list metrics
    listed = writer.aws.client("cloudwatch").list_metrics(
        Namespace=contract.metric_namespace("demo"), MetricName=contract.PHASE_SECONDS.name
    )["Metrics"]
    phases: set[str] = set()
    for metric in listed:
        dimensions = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
        if dimensions.get(contract.Dim.RUN.value) == run:
            phases.add(dimensions[contract.Dim.PHASE.value])
    return phases


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_runtime_imports_a_framework_only_when_its_integration_is_imported() -> None:
    frameworks = "{'lightning', 'pytorch_lightning', 'transformers', 'accelerate'}"
    probe = (
        "import sys, beacon, beacon.integrations, beacon.integrations.common\n"
        f"print(sorted({{name.split('.')[0] for name in sys.modules}} & {frameworks}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]


class RecordingRun:
    """What StepRecords hands to `run.log`."""

    finished = None

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, Any]]] = []

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.logged.append((step, dict(metrics)))


def test_a_steps_log_calls_become_one_record_and_a_step_already_recorded_is_refused_aloud(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run: Any = RecordingRun()
    steps = StepRecords()
    steps.add(run, 3, {"loss": 1.0})
    steps.add(run, 3, {"val_loss": 2.0})  # validation at the same step
    steps.add(run, 4, {"loss": 0.5})  # a later step: step 3 is over
    steps.add(run, 3, {"late": 1.0})
    steps.flush(run)
    assert run.logged == [(3, {"loss": 1.0, "val_loss": 2.0}), (4, {"loss": 0.5})]
    assert "late for step 3 came after step 4: not recorded" in caplog.text


def test_only_numbers_are_recorded_under_names_run_log_accepts() -> None:
    logged = {"loss": 0.5, "step_count": 3, "acc": torch.tensor(0.75), "val acc": 0.5, "model": "bert"}
    numbers = numeric_metrics({**logged, "histogram": torch.ones(3)})
    assert numbers.keys() == {"loss", "step_count", "acc", "val_acc"}


# --- checkpoints a framework writes: Run.commit_checkpoint ----------------------------------------
def committer(directory: Path, wait_durable: Any = None) -> tuple[AsyncCheckpointer, queue.Queue[float]]:
    """A checkpointer whose records are durable at once unless told otherwise; the queue gets one
    item each time a commit is over (promoted, refused or failed)."""
    over: queue.Queue[float] = queue.Queue()
    checkpointer = AsyncCheckpointer(
        directory,
        upload=None,
        wait_durable=wait_durable or (lambda step, timeout: True),
        on_finished=over.put,
    )
    return checkpointer, over


def test_a_commit_waits_for_its_future_never_moves_latest_back_and_a_failed_save_leaves_it(tmp_path: Path) -> None:
    checkpointer, over = committer(tmp_path)
    slow: Future[None] = Future()
    checkpointer.commit(10, slow, "ten")
    checkpointer.commit(20, None, "twenty")  # written already, as HF Trainer's save is
    over.get(timeout=30)
    assert framework_checkpoint(tmp_path) == (20, "twenty"), "a pending save holds back no later one"
    slow.set_result(None)
    over.get(timeout=30)
    assert framework_checkpoint(tmp_path) == (20, "twenty"), "a save that ends later never moves latest back"
    failing: Future[None] = Future()
    checkpointer.commit(30, failing, "thirty")
    failing.set_exception(OSError("No space left on device"))
    over.get(timeout=30)
    assert framework_checkpoint(tmp_path) == (20, "twenty"), "a failed save is never the resume point"
    assert (sorted(checkpointer.saved), checkpointer.failures) == ([10, 20], 1), "10 is complete, just not latest"


def test_a_commit_moves_latest_only_once_the_records_through_its_step_are_durable(tmp_path: Path) -> None:
    durable, asked = threading.Event(), threading.Event()

    def wait_durable(step: int, timeout: float) -> bool:
        asked.set()
        return durable.wait(timeout)

    checkpointer, _ = committer(tmp_path, wait_durable)
    checkpointer.commit(5, None, "five")
    assert asked.wait(30), "the save is done: the commit now waits on the records"
    assert framework_checkpoint(tmp_path) is None
    durable.set()
    assert checkpointer.join(timeout=30)
    assert framework_checkpoint(tmp_path) == (5, "five")


def test_a_commit_after_the_last_record_waits_only_for_the_records_there_are(tmp_path: Path) -> None:
    """A framework need not log at the step it saves at: once the loop is over, the last record is
    the one a commit waits for."""
    checkpointer, _ = committer(tmp_path, lambda step, timeout: step <= 7)  # records through step 7, no more
    checkpointer.commit(12, None, "twelve")
    checkpointer.loop_over(7)
    assert checkpointer.join(timeout=30)
    assert framework_checkpoint(tmp_path) == (12, "twelve")


def test_a_save_still_pending_at_finish_is_abandoned_and_never_latest(tmp_path: Path) -> None:
    run = beacon.init(
        "commit",
        telemetry=False,
        checkpoint_dir=tmp_path / "checkpoints",
        heartbeat_file=tmp_path / "heartbeat",
        shutdown_budget=1.0,
        handle_signals=False,
    )
    run.log({"loss": 1.0}, 0)
    assert run.commit_checkpoint(0, Future(), path=tmp_path / "never-finished")
    report = run.finish()
    assert report.checkpoint_abandoned and report.checkpoints == []
    assert framework_checkpoint(run.settings.run_checkpoint_dir) is None


@pytest.mark.parametrize("present", [True, False])
def test_a_rerun_resumes_from_the_committed_checkpoint_only_while_it_exists(tmp_path: Path, present: bool) -> None:
    settings: dict[str, Any] = {
        "telemetry": False,
        "checkpoint_dir": tmp_path / "checkpoints",
        "heartbeat_file": tmp_path / "heartbeat",
        "handle_signals": False,
    }
    first = beacon.init("commit", "resume", **settings)
    saved = tmp_path / "checkpoint-7"
    saved.mkdir()
    first.log({"loss": 1.0}, 7)
    first.commit_checkpoint(7, path=saved)
    assert first.finish().checkpoints == [7]
    if not present:
        saved.rmdir()  # removed by the framework's own rotation, or a volume that lost it
    again = beacon.init("commit", "resume", **settings)
    again.finish()
    expected = (8, str(saved)) if present else (0, None)
    assert (again.resume_step, again.resume_checkpoint) == expected


def test_dcp_async_save_futures_become_the_resume_point_a_rerun_loads(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """A real `torch.distributed.checkpoint.async_save` in a one-rank gloo group: each future is
    committed; the rerun resumes after the last committed save and records each step once."""
    env = environment(harness, "dcp-1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    saves = tmp_path / "dcp"
    first = run_job([sys.executable, "-m", "tests.support.dcp_job", str(saves), "12", "1"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout.splitlines()[-1]) == {"state": "finished", "checkpoints": [4, 9]}
    assert latest_pointer(harness, "dcp", "dcp-1") == {"step": 9, "framework": str(saves / "step-9")}
    again = run_job([sys.executable, "-m", "tests.support.dcp_job", str(saves), "17", "2"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed 10 {saves / 'step-9'} 9.0" in again.stdout, "the weights of step 9, loaded by DCP"
    assert sorted(records_by_step(as_writer, "dcp", "dcp-1")) == list(range(17))
    hyperparams = s3_json(as_writer, contract.hyperparams_key("dcp", "dcp-1"))
    assert hyperparams == {"optimizer": "sgd", "attempt": 1}, "create-only: the rerun's values never replace them"


# --- Lightning ----------------------------------------------------------------------------------
LIGHTNING_JOB = [sys.executable, "-m", "tests.support.lightning_job"]


def test_lightning_records_each_step_once_with_validation_merged_and_evaluation_as_a_phase(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """Two epochs of 8 steps, validation after each, a ModelCheckpoint every 5 steps."""
    lightning_dir = tmp_path / "lightning"
    done = run_job(
        [*LIGHTNING_JOB, "--lightning-dir", str(lightning_dir), "--hold-evaluation"],
        environment(harness, "pl-fit"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = records_by_step(as_writer, "lightning", "pl-fit")
    assert sorted(records) == list(range(16)), "every step Lightning logged, once"
    assert {"loss", "lr", "epoch"} <= records[0].keys()
    assert {"loss", "val_loss"} <= records[7].keys() and {"loss", "val_loss"} <= records[15].keys(), (
        "validation at the end of an epoch is merged into that step's record"
    )
    final = s3_json(as_writer, contract.final_status_key("lightning", "pl-fit"))
    assert (final["state"], final["last_step"], final["checkpoints"]) == ("finished", 15, [4, 9, 14])
    hyperparams = s3_json(as_writer, contract.hyperparams_key("lightning", "pl-fit"))
    assert hyperparams["learning_rate"] == 0.05, "the module's save_hyperparameters() is kept with the run"
    latest = latest_pointer(harness, "lightning", "pl-fit")
    assert latest == {"step": 14, "framework": str(lightning_dir / "epoch=1-step=15.ckpt")}, (
        "the last ModelCheckpoint file is the resume point, at the step its weights include"
    )
    assert contract.Phase.EVALUATION in phases_sent(as_writer, "pl-fit"), "validation is work, not a stall"


def test_lightning_records_an_exception_as_failed_after_delivering_what_was_logged(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    done = run_job(
        [*LIGHTNING_JOB, "--lightning-dir", str(tmp_path / "lightning"), "--fail-at", "6"],
        environment(harness, "pl-fail"),
    )
    assert done.returncode == 1 and "ValueError: a bug in the team's training_step" in done.stderr
    final = s3_json(as_writer, contract.final_status_key("lightning", "pl-fail"))
    assert (final["state"], final["error"], final["last_step"]) == ("failed", "ValueError", 5)
    assert sorted(records_by_step(as_writer, "lightning", "pl-fail")) == list(range(6))


def test_lightning_records_its_own_sigterm_handling_as_preempted(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """Lightning owns SIGTERM (the run is made with handle_signals=False): it finishes the step, raises
    SIGTERMException on every rank and finalizes with "failed"; Beacon records the preemption."""
    done = run_job(
        [*LIGHTNING_JOB, "--lightning-dir", str(tmp_path / "lightning"), "--sigterm-at", "3"],
        environment(harness, "pl-term"),
    )
    assert done.returncode == 0, done.stderr[-3000:]  # SIGTERMException is a SystemExit without a code
    assert "fit returned" not in done.stdout
    final = s3_json(as_writer, contract.final_status_key("lightning", "pl-term"))
    assert (final["state"], final["signal"], final["error"]) == ("preempted", "SIGTERM", None)
    assert sorted(records_by_step(as_writer, "lightning", "pl-term")) == list(range(final["last_step"] + 1))
    assert final["last_step"] == 3, "the step that received the signal finished and was recorded"


def test_lightning_ddp_on_two_ranks_times_what_each_rank_waits_for_the_other(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """Issue 31: BeaconPhases calls run.watch with the strategy's DistributedDataParallel, so each rank's document
    carries its waits in DDP's gradient all_reduce (gloo), the straggler's evidence, with no line in the team's
    module."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    command = [torchrun, "--standalone", "--nproc-per-node=2", *LIGHTNING_JOB[1:], "--ddp", "--epochs", "1",
               "--lightning-dir", str(tmp_path / "lightning")]  # fmt: skip
    done = run_job(command, environment(harness, "pl-ddp"))
    assert done.returncode == 0, done.stderr[-3000:]
    documents, _ = read_run(as_writer.client("s3"), as_writer.bucket, "lightning", "pl-ddp").ranks()
    assert sorted(d.rank for d in documents) == [0, 1]
    for document in documents:
        assert document.pace_steps >= 3, document
        assert math.isfinite(document.pace.wait_s) and document.pace.wait_s >= 0, "its waits were timed"


# --- Hugging Face Trainer -------------------------------------------------------------------------
HF_JOB = ["-m", "tests.support.hf_job"]


def hf_command(output_dir: Path, *extra: str, ranks: int = 1) -> list[str]:
    if ranks == 1:
        return [sys.executable, *HF_JOB, "--output-dir", str(output_dir), *extra]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, "--standalone", f"--nproc-per-node={ranks}", *HF_JOB, "--output-dir", str(output_dir), *extra]


def test_hf_trainer_records_each_step_once_evaluation_as_a_phase_and_commits_its_saves(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """Six steps, logging every step, evaluation and a save every 3."""
    output_dir = tmp_path / "trainer"
    done = run_job(hf_command(output_dir, "--hold-evaluation"), environment(harness, "hf-1"))
    assert done.returncode == 0, done.stderr[-3000:]
    records = records_by_step(as_writer, "hf", "hf-1")
    assert sorted(records) == list(range(1, 7)), "every step the Trainer logged, once"
    assert {"loss", "learning_rate", "grad_norm", "eval_loss"} <= records[3].keys(), "evaluation merged into its step"
    assert {"loss", "eval_loss", "train_loss", "train_runtime"} <= records[6].keys(), "the summary joins the last step"
    final = s3_json(as_writer, contract.final_status_key("hf", "hf-1"))
    assert (final["state"], final["last_step"], final["checkpoints"]) == ("finished", 6, [3, 6])
    assert latest_pointer(harness, "hf", "hf-1") == {"step": 6, "framework": str(output_dir / "checkpoint-6")}
    hyperparams = s3_json(as_writer, contract.hyperparams_key("hf", "hf-1"))
    assert hyperparams["training_arguments"]["max_steps"] == 6 and hyperparams["model_config"]["hidden_size"] == 16
    assert contract.Phase.EVALUATION in phases_sent(as_writer, "hf-1"), "evaluation is work, not a stall"


def test_hf_trainer_on_two_ranks_writes_from_rank_0_alone_each_step_once_and_names_the_rank_it_waits_for(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """Issue 31: BeaconCallback finds the Trainer's DistributedDataParallel (the callbacks are handed the unwrapped
    model) and calls run.watch with it, so rank 1, slower in its every forward, is the one rank 0 waits for in DDP's
    gradient all_reduce, with no line in the team's script."""
    slow = ("--slow-rank", "1", "--slow-by", "0.2")
    done = run_job(hf_command(tmp_path / "trainer", *slow, ranks=2), environment(harness, "hf-2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train returned 0" in done.stdout and "train returned 1" in done.stdout
    records = records_by_step(as_writer, "hf", "hf-2")  # rank 0 alone, no step twice
    assert sorted(records) == list(range(1, 7))
    final = s3_json(as_writer, contract.final_status_key("hf", "hf-2"))
    assert (final["state"], final["world_size"], final["checkpoints"]) == ("finished", 2, [3, 6])
    documents, _ = read_run(as_writer.client("s3"), as_writer.bucket, "hf", "hf-2").ranks()
    waits = {d.rank: d.pace.wait_s for d in documents}
    assert all(math.isfinite(wait) for wait in waits.values()), f"every rank's waits were timed: {waits}"
    assert waits[0] >= 0.1 > waits[1], f"rank 0 waits for rank 1's 0.2 s: {waits}"
    straggler = straggler_of([d.pace for d in documents])
    assert straggler is not None and straggler.rank == 1, straggler


def test_hf_trainer_records_an_exception_as_failed_after_delivering_what_was_logged(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    done = run_job(hf_command(tmp_path / "trainer", "--fail-at", "4"), environment(harness, "hf-fail"))
    assert done.returncode == 1 and "ValueError: a bug in the team's data" in done.stderr
    final = s3_json(as_writer, contract.final_status_key("hf", "hf-fail"))
    assert (final["state"], final["error"], final["last_step"], final["checkpoints"]) == (
        "failed",
        "ValueError",
        4,
        [3],
    )
    assert sorted(records_by_step(as_writer, "hf", "hf-fail")) == list(range(1, 5))


def test_hf_trainer_stops_saves_and_records_preempted_on_sigterm(
    harness: JobHarness, as_writer: WriterSession, tmp_path: Path
) -> None:
    """The Trainer has no SIGTERM handling of its own: Beacon's stops it after the step, with a save."""
    output_dir = tmp_path / "trainer"
    done = run_job(hf_command(output_dir, "--sigterm-at", "2"), environment(harness, "hf-term"))
    assert done.returncode == 0, done.stderr[-3000:]
    final = s3_json(as_writer, contract.final_status_key("hf", "hf-term"))
    assert (final["state"], final["signal"], final["last_step"], final["checkpoints"]) == (
        "preempted",
        "SIGTERM",
        2,
        [2],
    )
    assert latest_pointer(harness, "hf", "hf-term") == {"step": 2, "framework": str(output_dir / "checkpoint-2")}
    assert sorted(records_by_step(as_writer, "hf", "hf-term")) == [1, 2]


def test_lightnings_float_step_is_a_step_and_a_fraction_is_none() -> None:
    """Lightning 2.4-2.5 hand log_metrics a float step when a module logs "step" (Lightning issue 20692); run.log
    refuses a step that is not an int, so the logger makes a whole float one, and a fraction is no step."""
    from types import SimpleNamespace

    from beacon.integrations.lightning import BeaconLogger

    logged: list[tuple[dict[str, float], object]] = []
    run = SimpleNamespace(settings=None, finished=None, log=lambda metrics, step: logged.append((dict(metrics), step)))
    logger = BeaconLogger(run=run)  # type: ignore[arg-type]
    logger.log_metrics({"loss": 1.0}, step=5.0)
    logger.log_metrics({"loss": 0.5}, step=6)
    logger.log_metrics({"acc": 0.9}, step=6.5)  # merged into the step being logged
    logger.steps.flush(run)  # type: ignore[arg-type]
    assert logged == [({"loss": 1.0}, 5), ({"loss": 0.5, "acc": 0.9}, 6)]
    assert all(type(step) is int for _, step in logged)
