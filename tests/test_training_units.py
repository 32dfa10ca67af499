"""The job's parts in isolation: spool recovery, the progress signal, the sampler, async checkpoints."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from beacon import contract
from beacon.checkpoint import AsyncCheckpointer, latest_checkpoint, load_resume_point
from beacon.contract import Phase
from beacon.evidence.progress import ProgressClock
from beacon.log.spool import OPEN, Spool, SpoolDiskError, SpoolFullError
from beacon.process.distributed import World, backend_for
from beacon.process.liveness import Liveness
from beacon.run import Run
from beacon.settings import RunSettings
from beacon.telemetry import DeliveryReport, NullTelemetry
from smoke_job.config import parse_args
from smoke_job.job import EXIT_CRASHED, EXIT_SPOOL_DISK_FAILING, EXIT_SPOOL_FULL, Job
from smoke_job.model import StepSampler, SyntheticImages


def records(steps: range) -> list[contract.Record]:
    return [contract.Record("e", "r", s, {"loss": 1.0}, 0.0) for s in steps]


def test_sealed_chunks_are_numbered_and_leave_only_when_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(range(3)))
    first = spool.seal()
    spool.append(records(range(3, 5)))
    second = spool.seal()
    assert first is not None and second is not None
    assert [c.sequence for c in spool.pending()] == [0, 1]
    assert spool.unacknowledged_records() == 5
    spool.acknowledge(first)
    assert [c.sequence for c in spool.pending()] == [1]
    assert [record.seq for record in contract.records_of(second.body())] == [3, 4]


def test_after_a_crash_the_open_chunk_is_sealed_without_its_torn_line_and_numbering_continues(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(range(4)))
    spool.seal()
    spool.append(records(range(4, 7)))
    spool.sync()
    with open(tmp_path / OPEN, "ab") as handle:
        handle.write(b'{"run":"r","step":7,"lo')  # killed mid-write
    recovered = Spool(tmp_path)  # a new process, same volume
    assert recovered.recovered_records == 3
    assert recovered.last_step == 6 and recovered.next_seq == 7
    assert [c.sequence for c in recovered.pending()] == [0, 1]
    recovered.append(records(range(7, 8)))
    chunk = recovered.seal()
    assert chunk is not None and chunk.sequence == 2
    assert contract.Record.from_line(chunk.body()).seq == 7


def records_of_attempts(*attempts: tuple[int, range]) -> list[contract.Record]:
    records: list[contract.Record] = []
    for attempt, steps in attempts:
        for step in steps:
            records.append(contract.Record("e", "r", step, {"loss": float(step)}, 1.0, len(records), attempt=attempt))
    return records


def test_the_live_history_is_what_the_model_went_through_across_resumes() -> None:
    """Attempt 0 reached step 59; attempt 1 resumed from the checkpoint of step 40 and died at 45;
    attempt 2 resumed from 40 again and finished. Steps 41-59 of attempt 0 and 41-45 of attempt 1
    are a past the model no longer has: kept and marked, never in the live history."""
    records = records_of_attempts((0, range(0, 60)), (1, range(41, 46)), (2, range(41, 100)))
    history = contract.history(reversed(records))
    assert history.live_steps == list(range(100))
    assert [r.attempt for r in history.live] == [0] * 41 + [2] * 59
    assert [(r.attempt, r.step) for r in history.superseded] == [(0, s) for s in range(41, 60)] + [
        (1, s) for s in range(41, 46)
    ]
    assert history.duplicated == [] and history.attempts == [0, 1, 2]


def test_a_restart_that_has_not_yet_caught_up_leaves_no_live_record_where_its_past_was_superseded() -> None:
    """Attempt 1 took over at step 41 and is at 45: attempt 0's steps 46-59 are superseded already,
    so the live history ends at 45 instead of mixing two pasts."""
    history = contract.history(records_of_attempts((0, range(0, 60)), (1, range(41, 46))))
    assert history.live_steps == list(range(46))
    assert {r.step for r in history.superseded} == set(range(41, 60))


def test_a_second_record_of_one_attempt_and_step_is_a_duplicate_and_old_lines_read_as_attempt_0() -> None:
    first, second = records_of_attempts((0, range(3)), (0, range(2, 3)))[2:]
    assert contract.history([first, second]).duplicated == [second]
    line = first.to_line()
    assert contract.Record.from_line(line) == first
    without_attempt = line.replace(b'"attempt":0,', b"")
    assert b"attempt" not in without_attempt and contract.Record.from_line(without_attempt).attempt == 0


def test_several_log_calls_for_one_step_are_one_step_and_only_a_metric_logged_again_is_a_duplicate() -> None:
    """An evaluation logged at the step it ran after merges into that step, in sequence order; a call that
    logs a metric its step already has is what a second writer does, and merges nothing."""
    train = contract.Record("e", "r", 9, {"loss": 0.5}, 1.0, 0)
    evaluation = contract.Record("e", "r", 9, {"val_loss": 0.7}, 1.1, 1)
    again = contract.Record("e", "r", 9, {"loss": 0.4, "lr": 0.1}, 1.2, 2)
    history = contract.history([again, evaluation, train])
    assert [r.metrics for r in history.live] == [{"loss": 0.5, "val_loss": 0.7}]
    assert history.live[0].seq == 0 and history.live[0].wall_time == 1.0, "the step is its first call's"
    assert history.duplicated == [again]


def test_each_restart_is_the_next_attempt_and_counts_its_own_durable_steps(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    assert spool.begin_attempt() == 0, "a fresh run is attempt 0"
    spool.append(records_of_attempts((0, range(10))))
    spool.sync()
    spool.seal()
    spool.close()
    again = Spool(tmp_path)
    assert (again.last_step, again.begin_attempt()) == (9, 1)
    assert again.durable_step == -1, "a checkpoint of attempt 1 waits for attempt 1's records"
    again.append([contract.Record("e", "r", 5, {"loss": 1.0}, 1.0, attempt=1)])
    again.sync()
    assert again.durable_step == 5
    again.close()


def test_progress_age_grows_when_steps_stop_but_not_during_a_checkpoint() -> None:
    now = [0.0]
    clock = ProgressClock(now=lambda: now[0])
    clock.step_finished()
    now[0] = 10.0
    assert clock.progress_age() == 10.0
    clock.checkpoint_started()
    now[0] = 100.0
    assert clock.progress_age() == 10.0 and clock.checkpoint_seconds() == 90.0
    assert clock.checkpoint_finished() == 90.0
    now[0] = 105.0
    assert clock.progress_age() == 15.0
    clock.step_finished()
    assert clock.progress_age() == 0.0


def test_setup_is_a_phase_outside_the_stall_clock_and_visible_as_such() -> None:
    now = [0.0]
    clock = ProgressClock(now=lambda: now[0])
    clock.enter(Phase.SETUP)
    now[0] = 200.0  # a large checkpoint load, torch.compile, workers starting
    assert clock.progress_age() == 0.0
    assert clock.phase_name() == Phase.SETUP and clock.current_phase() == (Phase.SETUP, 200.0)
    assert clock.leave(Phase.SETUP) == 200.0
    assert clock.phase_name() == Phase.TRAINING and clock.current_phase() is None
    now[0] = 205.0
    assert clock.progress_age() == 5.0, "the stall clock starts when setup ends"


def test_evaluation_between_steps_and_nested_phases_are_excluded_once() -> None:
    now = [0.0]
    clock = ProgressClock(now=lambda: now[0])
    clock.step_finished()
    now[0] = 3.0
    with clock.phase(Phase.EVALUATION):
        now[0] = 100.0
        clock.enter(Phase.CHECKPOINT)  # a checkpoint inside the evaluation
        now[0] = 130.0
        assert clock.current_phase() == (Phase.CHECKPOINT, 30.0) and clock.checkpoint_seconds() == 30.0
        assert clock.leave(Phase.CHECKPOINT) == 30.0
        assert clock.phase_name() == Phase.EVALUATION
        now[0] = 150.0
        assert clock.progress_age() == 3.0
    now[0] = 160.0
    assert clock.progress_age() == 13.0
    assert clock.leave(Phase.SETUP) == 0.0, "leaving a phase that is not open changes nothing"
    assert clock.progress_age() == 13.0


def test_the_sampler_resumes_at_any_step_and_ranks_never_share_a_sample() -> None:
    full = list(StepSampler(start_step=0, steps=10, batch_size=4, rank=0, world_size=2))
    resumed = list(StepSampler(start_step=6, steps=10, batch_size=4, rank=0, world_size=2))
    assert resumed == full[6 * 4 :]
    other = list(StepSampler(start_step=0, steps=10, batch_size=4, rank=1, world_size=2))
    assert not set(full) & set(other)


def test_the_synthetic_dataset_is_deterministic_across_instances() -> None:
    first, second = SyntheticImages(7)[123], SyntheticImages(7)[123]
    assert torch.equal(first[0], second[0]) and first[1] == second[1]


def test_backend_follows_the_device() -> None:
    assert backend_for(torch.device("cpu")) == "gloo"
    assert backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl", "CPU values travel on gloo beside nccl"


def test_a_checkpoint_returns_before_the_write_and_moves_latest_only_once_records_are_durable(tmp_path: Path) -> None:
    durable = threading.Event()
    finished: list[float] = []
    checkpointer = AsyncCheckpointer(
        tmp_path, upload=None, wait_durable=lambda step, timeout: durable.wait(timeout), on_finished=finished.append
    )
    weights = torch.randn(512, 512)
    state: dict[str, Any] = {"model": {"w": weights}, "step": 3}
    started = time.monotonic()
    assert checkpointer.save(3, state)
    handed_over = time.monotonic() - started
    weights.zero_()  # training goes on; the snapshot is a copy
    assert not checkpointer.save(4, state), "a second checkpoint while one is writing is skipped, not waited for"
    assert latest_checkpoint(tmp_path) is None
    durable.set()
    assert checkpointer.join(timeout=30)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest[0] == 3
    saved = torch.load(latest[1], weights_only=True)
    assert saved["model"]["w"].abs().sum() > 0
    assert checkpointer.skipped == [4] and len(finished) == 1
    assert handed_over < 5.0  # loose: the figure itself is measured by `make bench`


def test_a_spool_whose_seal_failed_on_a_full_disk_refuses_further_use_clearly(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append(records(range(2)))
    spool._open.close()  # what a seal interrupted by ENOSPC leaves behind
    with pytest.raises(SpoolFullError, match="unusable since the disk filled up"):
        spool.append(records(range(2, 3)))
    with pytest.raises(SpoolFullError):
        spool.seal()


@pytest.mark.parametrize("loss", [2.302585, 0.000123, 1.5e-07])
def test_sagemakers_metric_definitions_parse_the_jobs_progress_line(loss: float) -> None:
    line = f"2026-12-01 10:00:00 beacon.job INFO {contract.progress_line(170, loss)}"
    (step,) = re.findall(contract.PROGRESS_LOG_METRICS["step"], line)
    (parsed,) = re.findall(contract.PROGRESS_LOG_METRICS["loss"], line)
    assert int(step) == 170 and float(parsed) == pytest.approx(loss, abs=1e-6)


def promoted_when(durable: dict[int, bool], directory: Path) -> AsyncCheckpointer:
    """A checkpointer whose records through step N are durable in time only if durable[N]."""
    return AsyncCheckpointer(
        directory, upload=None, wait_durable=lambda step, timeout: durable[step], on_finished=lambda s: None
    )


def test_retention_never_deletes_the_checkpoint_latest_points_to(tmp_path: Path) -> None:
    """The exact sequence: latest=100; 150, 200 and 250 written but not promoted (records not durable
    in time); the job dies and resumes from 100; its next checkpoint, 150, is promoted. By step number
    alone retention kept 200 and 250 and deleted 150, so every later resume failed."""
    first = promoted_when({100: True, 150: False, 200: False, 250: False}, tmp_path)
    for step in (100, 150, 200, 250):
        assert first.save(step, {"w": torch.full((4,), float(step)), "step": step})
        assert first.join(timeout=30)
    assert latest_checkpoint(tmp_path) == (100, tmp_path / "step-00000100.pt")
    restarted = promoted_when({150: True}, tmp_path)  # a new process on the same volume
    assert restarted.save(150, {"w": torch.full((4,), 150.0), "step": 150})
    assert restarted.join(timeout=30)
    assert latest_checkpoint(tmp_path) == (150, tmp_path / "step-00000150.pt")
    assert sorted(p.name for p in tmp_path.glob("step-*.pt")) == ["step-00000100.pt", "step-00000150.pt"]
    resumed = load_resume_point(tmp_path)
    assert resumed is not None and resumed[0] == 150 and resumed[1]["w"][0] == 150.0


@pytest.mark.parametrize("damage", ["missing", "torn"])
def test_resume_falls_back_to_the_newest_readable_checkpoint_not_after_latest(tmp_path: Path, damage: str) -> None:
    checkpointer = promoted_when({50: True, 100: True, 150: False}, tmp_path)
    for step in (50, 100, 150):
        assert checkpointer.save(step, {"w": torch.full((4,), float(step)), "step": step})
        assert checkpointer.join(timeout=30)
    latest = tmp_path / "step-00000100.pt"
    if damage == "torn":
        latest.write_bytes(latest.read_bytes()[:100])  # killed mid-write on a volume without rename
    else:
        latest.unlink()
    resumed = load_resume_point(tmp_path)
    assert resumed is not None
    assert resumed[0] == 50, "150 was never promoted: records after latest may not be durable"


class FailingTelemetry(NullTelemetry):
    """Raises at one step, as a process-group timeout or a CUDA error would inside the loop."""

    def __init__(self, failing_step: int, error: Exception | None = None) -> None:
        self.failing_step = failing_step
        self.error = error or RuntimeError("[Gloo] Timed out waiting 1800000ms for recv operation")
        self.recorded: list[int] = []
        self.closed = False

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        if step == self.failing_step:
            raise self.error
        self.recorded.append(step)

    def close(self, budget: float) -> DeliveryReport:
        self.closed = True
        return DeliveryReport()


def run_on(telemetry: NullTelemetry, settings: RunSettings, tmp_path: Path) -> Run:
    """A one-rank run whose sink is `telemetry`, as `beacon.init` would assemble it."""
    return Run(
        settings=settings,
        world=World(rank=0, local_rank=0, size=1, device=torch.device("cpu")),
        progress=ProgressClock(),
        telemetry=telemetry,
        checkpointer=None,
        resume_limit=None,
        liveness=Liveness(tmp_path / "hb", local_rank=0, interval=1.0),
        stop=threading.Event(),
    )


def test_any_error_in_the_loop_still_drains_telemetry_and_exits_non_zero(tmp_path: Path) -> None:
    """6cb2f94 drained only after SpoolFullError: any other exception left run() with the spool
    undrained."""
    flags = ["--telemetry", "false", "--steps", "10", "--batch-size", "4", "--workers", "0"]
    config = parse_args([*flags, "--checkpoint-dir", str(tmp_path), "--heartbeat-file", str(tmp_path / "hb")])
    telemetry = FailingTelemetry(failing_step=3)
    summary = Job(config, run_on(telemetry, config.settings, tmp_path)).train()
    assert summary["exit_code"] == EXIT_CRASHED
    assert telemetry.closed and telemetry.recorded == [0, 1, 2]


@pytest.mark.parametrize(
    ("error", "exit_code"),
    [
        (SpoolFullError(28, "spool /v/smoke/r: No space left on device (ENOSPC)"), EXIT_SPOOL_FULL),
        (SpoolDiskError(5, "spool /v/smoke/r: Input/output error (EIO), 9 attempts in a row"), EXIT_SPOOL_DISK_FAILING),
    ],
)
def test_a_full_spool_and_a_failing_spool_volume_exit_with_codes_of_their_own(
    tmp_path: Path, error: OSError, exit_code: int
) -> None:
    """A volume that keeps failing is not a full one: the operator's fix differs, so does the code."""
    flags = ["--telemetry", "false", "--steps", "10", "--batch-size", "4", "--workers", "0"]
    config = parse_args([*flags, "--checkpoint-dir", str(tmp_path), "--heartbeat-file", str(tmp_path / "hb")])
    telemetry = FailingTelemetry(failing_step=3, error=error)
    summary = Job(config, run_on(telemetry, config.settings, tmp_path)).train()
    assert summary["exit_code"] == exit_code and telemetry.closed
    assert EXIT_SPOOL_DISK_FAILING != EXIT_SPOOL_FULL
