"""The smoke-training job: a small CNN trained through Beacon's public API, as a team's loop would be.

`beacon.init` does preflight, the resume point and the sinks; this file only trains."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import beacon
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from smoke_job.config import JobConfig
from smoke_job.model import SmallConvNet, StepSampler, SyntheticImages

log = logging.getLogger("beacon.job")
EXIT_OK, EXIT_UNDELIVERED, EXIT_SPOOL_FULL, EXIT_CRASHED = 0, 75, 74, 70
EXIT_SPOOL_DISK_FAILING = 71  # the spool's volume kept failing (EIO, ...) though not full
MAX_WORKERS = 4


@dataclass
class Job:
    config: JobConfig
    run: beacon.Run

    def train(self) -> dict[str, Any]:
        """Train, checkpoint and finish the run; the summary every rank prints."""
        config, run = self.config, self.run
        try:
            model, optimizer, batches = self._prepare()
        except Exception as error:
            log.exception("setup failed; draining what was recorded before exiting")
            return self._summary(run.finish(error=error), EXIT_CRASHED, [], 0.0, 0.0)
        losses: list[float] = []
        step = run.resume_step - 1
        log_seconds = 0.0
        loop_started = time.perf_counter()
        exit_code = EXIT_OK
        error_seen: Exception | None = None
        loss_fn = nn.CrossEntropyLoss()
        try:
            for step, (images, labels) in zip(range(run.resume_step, config.steps), batches, strict=False):
                if run.should_stop():
                    step -= 1
                    break
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(images.to(run.world.device)), labels.to(run.world.device))
                loss.backward()
                optimizer.step()
                losses.append(float(loss.item()))  # the summary's loss; Beacon reads its own copy off the loop
                entered = time.perf_counter()
                run.log({"loss": loss.detach()}, step)
                log_seconds += time.perf_counter() - entered
                if (step + 1) % config.checkpoint_interval == 0:
                    self._checkpoint(step, model, optimizer)
                if config.step_sleep:
                    time.sleep(config.step_sleep * self._slowed_by(step))
                if config.min_duration:
                    self._pace(loop_started, step - run.resume_step + 1, config.steps - run.resume_step)
                if step == config.hang_after_step and config.hang_rank in (-1, run.world.rank):
                    log.warning("hanging after step %d (--hang-after-step); the heartbeat goes on", step)
                    run.stop.wait()
        except beacon.SpoolFullError as error:
            log.error("%s; stopping: records already acknowledged are safe in S3", error)
            exit_code, error_seen = EXIT_SPOOL_FULL, error
        except beacon.SpoolDiskError as error:
            log.error("%s; stopping: records already acknowledged are safe in S3", error)
            exit_code, error_seen = EXIT_SPOOL_DISK_FAILING, error
        except Exception as error:  # a process-group timeout, a CUDA error, ...: what was recorded still goes out
            log.exception("training failed at step %d; draining what was recorded before exiting", step + 1)
            exit_code, error_seen = EXIT_CRASHED, error
        loop_seconds = time.perf_counter() - loop_started
        if step >= run.resume_step and exit_code == EXIT_OK:
            self._checkpoint(step, model, optimizer)
        report = run.finish(error=error_seen)
        if exit_code == EXIT_OK and not report.delivered:
            exit_code = EXIT_UNDELIVERED
            if report.delivery.unacknowledged_records:
                log.error(
                    "%d records wait in the spool; rerun with --run-id %s to deliver them",
                    report.delivery.unacknowledged_records,
                    run.id,
                )
            if report.delivery.values_set_aside:
                log.error("values set aside, not in S3 (by metric): %s", report.delivery.values_set_aside)
        return self._summary(report, exit_code, losses, loop_seconds, log_seconds)

    def _prepare(self) -> tuple[nn.Module, torch.optim.Optimizer, Iterator[tuple[torch.Tensor, torch.Tensor]]]:
        """Model, optimizer, resumed state and the batches, workers started: the setup phase's work."""
        config, run = self.config, self.run
        torch.set_num_threads(1)
        torch.manual_seed(config.seed)
        model: nn.Module = SmallConvNet().to(run.world.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=0.9)
        state = run.load_checkpoint()
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        if run.world.distributed:
            model = DistributedDataParallel(model)
            run.watch(model)  # each step's wait in the gradient all_reduce: names a slow rank
        loader = DataLoader(
            SyntheticImages(config.seed),
            batch_size=config.batch_size,
            sampler=StepSampler(
                start_step=run.resume_step,
                steps=config.steps,
                batch_size=config.batch_size,
                rank=run.world.rank,
                world_size=run.world.size,
            ),
            num_workers=min(config.workers, MAX_WORKERS),
            multiprocessing_context="spawn" if config.workers else None,  # fork deadlocks with threads
            persistent_workers=config.workers > 0,
            worker_init_fn=beacon.worker_init_fn if config.workers else None,
        )
        batches = iter(loader)  # starts the workers (spawn: seconds each)
        if config.setup_sleep:
            log.warning("setup takes %.1f s longer (--setup-sleep)", config.setup_sleep)
            run.stop.wait(config.setup_sleep)
        return model, optimizer, batches

    def _slowed_by(self, step: int) -> float:
        """--slow-by on this rank's own work once past --slow-after-step (a straggler, or every rank alike), else 1."""
        config = self.config
        if config.slow_after_step < 0 or step <= config.slow_after_step:
            return 1.0
        if config.slow_rank not in (-1, self.run.world.rank):
            return 1.0
        if step == config.slow_after_step + 1:
            log.warning("slowing by %.2f after step %d (--slow-after-step)", config.slow_by, config.slow_after_step)
        return config.slow_by

    def _pace(self, loop_started: float, done: int, total: int) -> None:
        """Spread the steps over --min-duration; a stop request ends the wait at once."""
        behind = loop_started + self.config.min_duration * done / max(total, 1) - time.perf_counter()
        if behind > 0:
            self.run.stop.wait(behind)

    def _checkpoint(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        self.run.checkpoint({"model": inner.state_dict(), "optimizer": optimizer.state_dict()}, step)

    def _summary(
        self, report: beacon.FinishReport, exit_code: int, losses: list[float], loop_s: float, log_s: float
    ) -> dict[str, Any]:
        run = self.run
        return {
            "exit_code": exit_code,
            "final_state": report.state.value,
            "rank": run.world.rank,
            "world_size": run.world.size,
            "run": run.id,
            "experiment": run.experiment,
            "start_step": run.resume_step,
            "last_step": report.last_step if report.last_step >= 0 else run.resume_step - 1,
            "stopped_by_signal": run.stop.is_set(),
            "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "checkpoints": report.checkpoints,
            "checkpoints_skipped": report.checkpoints_skipped,
            "checkpoint_abandoned": report.checkpoint_abandoned,
            "aws_requests": sum(report.aws_requests.values()),
            "aws_requests_by_service": report.aws_requests,
            "writes_sinks": run.is_writer and self.config.telemetry,
            "delivery": vars(report.delivery),
            "loop_seconds": loop_s,
            "telemetry_seconds_on_loop": log_s,
        }
