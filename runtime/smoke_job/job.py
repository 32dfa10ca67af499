"""The smoke-training job: build (preflight, resume) and run (train, checkpoint, drain)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from beacon import aws, contract
from beacon.checkpoint import AsyncCheckpointer, Uploader, checkpoint_name, load_resume_point
from beacon.config import JobConfig
from beacon.contract import Phase
from beacon.distributed import World
from beacon.lifeline import dataloader_worker_dies_with_its_rank
from beacon.preflight import PreflightError, run_preflight
from beacon.progress import ProgressClock
from beacon.reconcile import RunConflictError, reconcile
from beacon.run_alarms import RunAlarms
from beacon.spool import Spool, SpoolDiskError, SpoolFullError
from beacon.telemetry import NullTelemetry, Telemetry
from botocore.exceptions import BotoCoreError, ClientError
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from smoke_job.model import SmallConvNet, StepSampler, SyntheticImages

log = logging.getLogger("beacon.job")
EXIT_OK, EXIT_UNDELIVERED, EXIT_SPOOL_FULL, EXIT_CRASHED = 0, 75, 74, 70
EXIT_SPOOL_DISK_FAILING = 71  # the spool's volume kept failing (EIO, ...) though not full
MAX_WORKERS = 4


@dataclass
class Job:
    config: JobConfig
    world: World
    stop: threading.Event
    progress: ProgressClock
    telemetry: NullTelemetry
    checkpointer: AsyncCheckpointer | None
    resumed_after_step: int
    # The last step whose record is durable (spool or S3), on every rank: no rank resumes past it.
    resume_limit: int | None = None

    @classmethod
    def build(cls, config: JobConfig, world: World, stop: threading.Event) -> Job:
        torch.set_num_threads(1)
        progress = ProgressClock()
        progress.enter(Phase.SETUP)  # left once the first step can start (run)
        run_dir = f"{config.experiment}/{config.run}"
        checkpoint_dir = config.checkpoint_dir / run_dir
        telemetry: NullTelemetry = NullTelemetry()
        checkpointer: AsyncCheckpointer | None = None
        resumed_after_step = -1
        failure = ""
        if world.is_writer:
            try:
                telemetry, resumed_after_step = cls._writer_telemetry(config, world, progress)
            except PreflightError as error:
                failure = str(error)
            if not failure:
                s3 = getattr(telemetry, "s3", None)
                checkpointer = AsyncCheckpointer(
                    checkpoint_dir,
                    upload=Uploader(s3, config.bucket, config.experiment, config.run) if s3 is not None else None,
                    wait_durable=telemetry.wait_durable,
                    on_finished=telemetry.checkpoint_finished,
                )
        failure = world.broadcast(failure)  # every rank stops if rank 0's preflight failed
        if failure:
            raise PreflightError(failure)
        limit = world.broadcast(str(resumed_after_step) if config.telemetry else "")
        resume_limit = int(limit) if limit else None
        return cls(config, world, stop, progress, telemetry, checkpointer, resumed_after_step, resume_limit)

    @staticmethod
    def _writer_telemetry(config: JobConfig, world: World, progress: ProgressClock) -> tuple[NullTelemetry, int]:
        if not config.telemetry:
            return NullTelemetry(), -1
        spool_dir = config.spool_dir / config.experiment / config.run
        s3 = aws.client("s3", config.region)
        cloudwatch = aws.client("cloudwatch", config.region)
        ssm = aws.client("ssm", config.region) if config.alarms else None
        fast = {"attempts": 1, "connect_timeout": 2, "read_timeout": 5}  # preflight retries within its budget
        started = time.monotonic()
        record = run_preflight(
            config,
            spool_dir=spool_dir,
            world_size=world.size,
            s3=aws.client("s3", config.region, **fast),
            cloudwatch=aws.client("cloudwatch", config.region, **fast),
            ssm=aws.client("ssm", config.region, **fast) if config.alarms else None,
        )
        log.info("preflight passed in %.1f s: spool on %s", time.monotonic() - started, record.spool_filesystem)
        spool = Spool(spool_dir)
        if spool.recovered_records:
            log.info("recovered %d records from an interrupted chunk", spool.recovered_records)
        try:
            reconciled = reconcile(s3, bucket=config.bucket, experiment=config.experiment, run=config.run, spool=spool)
        except RunConflictError as error:
            raise PreflightError(str(error)) from None
        except (ClientError, BotoCoreError) as error:
            raise PreflightError(
                f"run {config.run!r}: cannot read what s3://{config.bucket}/"
                f"{contract.run_prefix(config.experiment, config.run)} already holds ({error})"
            ) from None
        if reconciled.continued_after_chunk >= 0:
            log.info(
                "S3 holds %d chunks of this run: continuing after chunk %d (step %d)",
                reconciled.chunks_in_s3,
                reconciled.continued_after_chunk,
                spool.last_step,
            )
        alarms = RunAlarms(cloudwatch, ssm, config.team, config.experiment, config.run) if ssm is not None else None
        telemetry = Telemetry(
            config,
            s3=s3,
            cloudwatch=cloudwatch,
            progress=progress,
            spool=spool,
            run_alarms=alarms,
            resumed_after_step=spool.last_step,
        )
        return telemetry, spool.last_step

    # --- running ---------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        config, world = self.config, self.world
        self.telemetry.start()  # heartbeats from the start of setup: a long setup is not silence
        try:
            model, optimizer, start_step, batches = self._prepare()
        except Exception:
            log.exception("setup failed; draining what was recorded before exiting")
            return {**self._shutdown(-1, 0, [], EXIT_CRASHED), "loop_seconds": 0.0, "telemetry_seconds_on_loop": 0.0}
        self.progress.leave(Phase.SETUP)
        losses: list[float] = []
        step = start_step - 1
        telemetry_seconds = 0.0
        loop_started = time.perf_counter()
        exit_code = EXIT_OK
        loss_fn = nn.CrossEntropyLoss()
        try:
            for step, (images, labels) in zip(range(start_step, config.steps), batches, strict=False):
                if self._should_stop():
                    step -= 1
                    break
                optimizer.zero_grad(set_to_none=True)
                loss = loss_fn(model(images.to(world.device)), labels.to(world.device))
                loss.backward()
                optimizer.step()
                value = float(loss.item())
                losses.append(value)
                entered = time.perf_counter()
                self.progress.step_finished()
                self.telemetry.record(step, value)
                telemetry_seconds += time.perf_counter() - entered
                if world.is_writer and step % contract.PROGRESS_LOG_INTERVAL == 0:
                    log.info(contract.progress_line(step, value))
                if (step + 1) % config.checkpoint_interval == 0:
                    self._checkpoint(step, model, optimizer)
                if config.step_sleep:
                    time.sleep(config.step_sleep)
                if config.min_duration:
                    self._pace(loop_started, step - start_step + 1, config.steps - start_step)
                if step == config.hang_after_step:
                    log.warning("hanging after step %d (--hang-after-step); the heartbeat goes on", step)
                    self.stop.wait()
        except SpoolFullError as error:
            log.error("%s; stopping: records already acknowledged are safe in S3", error)
            exit_code = EXIT_SPOOL_FULL
        except SpoolDiskError as error:
            log.error("%s; stopping: records already acknowledged are safe in S3", error)
            exit_code = EXIT_SPOOL_DISK_FAILING
        except Exception:  # a process-group timeout, a CUDA error, ...: what was recorded still goes out
            log.exception("training failed at step %d; draining what was recorded before exiting", step + 1)
            exit_code = EXIT_CRASHED
        loop_seconds = time.perf_counter() - loop_started
        if step >= start_step and exit_code == EXIT_OK:
            self._checkpoint(step, model, optimizer)
        summary = self._shutdown(step, start_step, losses, exit_code)
        summary["loop_seconds"] = loop_seconds
        summary["telemetry_seconds_on_loop"] = telemetry_seconds
        return summary

    def _prepare(self) -> tuple[nn.Module, torch.optim.Optimizer, int, Iterator[tuple[torch.Tensor, torch.Tensor]]]:
        """Model, optimizer, resume step and the batches, workers started: the setup phase's work."""
        config, world = self.config, self.world
        torch.manual_seed(config.seed)
        model: nn.Module = SmallConvNet().to(world.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.learning_rate, momentum=0.9)
        start_step = self._resume(model, optimizer)
        if world.distributed:
            model = DistributedDataParallel(model)
        loader = DataLoader(
            SyntheticImages(config.seed),
            batch_size=config.batch_size,
            sampler=StepSampler(
                start_step=start_step,
                steps=config.steps,
                batch_size=config.batch_size,
                rank=world.rank,
                world_size=world.size,
            ),
            num_workers=min(config.workers, MAX_WORKERS),
            multiprocessing_context="spawn" if config.workers else None,  # fork deadlocks with threads
            persistent_workers=config.workers > 0,
            worker_init_fn=dataloader_worker_dies_with_its_rank if config.workers else None,
        )
        batches = iter(loader)  # starts the workers (spawn: seconds each)
        if config.setup_sleep:
            log.warning("setup takes %.1f s longer (--setup-sleep)", config.setup_sleep)
            self.stop.wait(config.setup_sleep)
        return model, optimizer, start_step, batches

    def _pace(self, loop_started: float, done: int, total: int) -> None:
        """Spread the steps over --min-duration; a stop request ends the wait at once."""
        behind = loop_started + self.config.min_duration * done / max(total, 1) - time.perf_counter()
        if behind > 0:
            self.stop.wait(behind)

    def _should_stop(self) -> bool:
        return self.world.any_rank(self.stop.is_set())

    def _resume(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        directory = self.config.checkpoint_dir / self.config.experiment / self.config.run
        resume_point = load_resume_point(directory, at_most=self.resume_limit)
        if resume_point is None:
            return 0
        step, state = resume_point
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        log.info("rank %d resumed from %s (step %d)", self.world.rank, directory / checkpoint_name(step), step)
        return step + 1

    def _checkpoint(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.checkpointer is None:
            return
        inner = model.module if isinstance(model, DistributedDataParallel) else model
        with self.progress.phase(Phase.CHECKPOINT):
            self.checkpointer.save(
                step, {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
            )

    def _shutdown(self, step: int, start_step: int, losses: list[float], exit_code: int) -> dict[str, Any]:
        deadline = time.monotonic() + self.config.shutdown_budget
        checkpoint_done = True
        if self.checkpointer is not None:
            # Finish the in-flight checkpoint if the budget allows; otherwise abandon it (its temp file
            # never became `latest`, so a resume uses the previous one).
            checkpoint_done = self.checkpointer.join(timeout=max(0.0, (deadline - time.monotonic()) / 2))
        report = self.telemetry.close(budget=max(1.0, deadline - time.monotonic()))
        if exit_code == EXIT_OK and report.unacknowledged_records:
            exit_code = EXIT_UNDELIVERED
            log.error(
                "%d records wait in the spool; rerun with --run %s to deliver them",
                report.unacknowledged_records,
                self.config.run,
            )
        summary = {
            "exit_code": exit_code,
            "rank": self.world.rank,
            "world_size": self.world.size,
            "run": self.config.run,
            "experiment": self.config.experiment,
            "start_step": start_step,
            "last_step": step,
            "stopped_by_signal": self.stop.is_set(),
            "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "checkpoints": self.checkpointer.saved if self.checkpointer else [],
            "checkpoint_abandoned": not checkpoint_done,
            "aws_requests": aws.REQUESTS.total,
            "aws_requests_by_service": dict(aws.REQUESTS.by_service),
            "writes_sinks": self.world.is_writer and self.config.telemetry,
            "delivery": vars(report),
        }
        if exit_code == EXIT_OK:
            self.telemetry.publish_final(summary)
        return summary
