"""Beacon inside PyTorch Lightning (`pip install beacon[lightning]`):

    trainer = L.Trainer(logger=BeaconLogger("resnet"), callbacks=[BeaconPhases()])
    trainer.fit(model, data)

`BeaconLogger` records what the LightningModule logs (`self.log`), one record per step, keeps the
hyperparameters, commits ModelCheckpoint's files as the resume point and writes the final state.
`BeaconPhases` marks validation and checkpoint saving as phases (work, not a stall), marks every
step for the stall clock, records a step's metrics as soon as the next step begins, and, on two
ranks or more, times what each rank waits for the others (`run.watch`: DDP's gradient all_reduce).

Signals are Lightning's: it catches SIGTERM itself, stops every rank at the same step and raises
SIGTERMException, so the run is made with `handle_signals=False` and that exception (or Ctrl-C) is
recorded as `preempted`. Any other exception is `failed`, with its type.
"""

from __future__ import annotations

import logging
import sys
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.nn.parallel import DistributedDataParallel

import beacon
from beacon.contract import FinalState, Phase
from beacon.integrations.common import PhaseMarks, StepRecords, numeric_metrics
from beacon.settings import RunSettings, SettingsError

log = logging.getLogger("beacon.integrations.lightning")
# Lightning's `finalize` statuses: "success" after fit, "failed" from its exception handler, and
# "finished" only from its SLURM handler, just before the job is requeued.
SUCCESS, FAILED, REQUEUED = "success", "failed", "finished"


def final_state(status: str, error: BaseException | None) -> tuple[FinalState, BaseException | None, str | None]:
    """(state, error, signal) for Lightning's `finalize(status)` while `error` is being handled."""
    if status == SUCCESS:
        return FinalState.FINISHED, None, None
    if isinstance(error, SIGTERMException):
        return FinalState.PREEMPTED, None, "SIGTERM"
    if isinstance(error, KeyboardInterrupt):
        return FinalState.PREEMPTED, None, "SIGINT"
    if status == FAILED:
        return FinalState.FAILED, error, None
    return FinalState.PREEMPTED, None, None  # REQUEUED, or a status Lightning may add for an interruption


class BeaconLogger(Logger):
    """A Lightning logger whose experiment is a Beacon run, made on every rank once Lightning's
    process group exists (beacon.init is collective). Pass a run made with `beacon.init(...,
    handle_signals=False)`, or the run's settings (`beacon.init`'s arguments)."""

    def __init__(
        self,
        experiment: str | None = None,
        *,
        run_id: str | None = None,
        run: beacon.Run | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        if run is not None and (experiment is not None or run_id is not None or settings):
            raise SettingsError("BeaconLogger: pass either a run or its settings, not both")
        self._settings = (
            run.settings if run is not None else RunSettings.resolve(experiment=experiment, run=run_id, **settings)
        )
        self._run = run
        self._hyperparams: dict[str, Any] | None = None
        self.steps = StepRecords()
        self.phases = PhaseMarks()
        self.async_checkpoints = False  # Lightning's AsyncCheckpointIO: a saved file is not written yet

    @property
    def experiment(self) -> beacon.Run:
        """The run. Lightning touches this on every rank in its setup hook, after making its process
        group and before anything is logged: that is when the run starts."""
        if self._run is None:
            self._run = beacon.init(settings=self._settings, handle_signals=False)
            if self._hyperparams is not None:
                self._run.log_hyperparams(self._hyperparams)
        return self._run

    @property
    def run(self) -> beacon.Run:
        return self.experiment

    @property
    def name(self) -> str:
        return self._settings.experiment

    @property
    def version(self) -> str | None:
        return self._run.id if self._run is not None else self._settings.run or None

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        self._hyperparams = dict(vars(params) if isinstance(params, Namespace) else params)
        if self._run is not None:
            self._run.log_hyperparams(self._hyperparams)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | float | None = None) -> None:
        run = self.experiment
        if isinstance(step, float):  # Lightning 2.4-2.5 pass a float when a module logs "step"
            step = int(step) if step.is_integer() else None  # a fraction is no step: the next one counts
        self.steps.add(run, self.steps.next_step() if step is None else step, numeric_metrics(metrics))

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        """ModelCheckpoint wrote a file: it becomes the resume point once the records through its last
        step are durable. Its global step counts steps done, the records count from 0."""
        self.phases.leave(Phase.CHECKPOINT)
        if self._run is None:
            return
        if self.async_checkpoints:
            log.warning("AsyncCheckpointIO: the file may not be written yet, so it is not committed as latest")
            return
        path = getattr(checkpoint_callback, "_last_checkpoint_saved", "")
        global_step = getattr(checkpoint_callback, "_last_global_step_saved", 0)
        if path and global_step > 0:
            self._run.commit_checkpoint(global_step - 1, path=path)

    def finalize(self, status: str) -> None:
        """Every rank (the run's end is collective): the last step's metrics, then the final state.
        On failure Lightning calls this while handling the exception, so the exception is at hand."""
        run = self._run
        if run is None:
            return
        self.phases.leave_all()
        self.steps.flush(run)
        state, error, stop_signal = final_state(status, sys.exception())
        if stop_signal is not None and run.stop_signal is None:
            run.request_stop(stop_signal)  # Lightning caught the signal itself: the final state names it
        run.finish(state, error=error)


class BeaconPhases(Callback):
    """Validation and checkpoint saving as Beacon phases; every training step marked; a step's
    metrics recorded when the next step begins. Needs a BeaconLogger among the Trainer's loggers."""

    def __init__(self) -> None:
        self._logger: BeaconLogger | None = None
        self._watched = False

    @property
    def logger(self) -> BeaconLogger:
        if self._logger is None:
            raise RuntimeError("BeaconPhases: used before the Trainer's setup")
        return self._logger

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._logger = next((each for each in trainer.loggers if isinstance(each, BeaconLogger)), None)
        if self._logger is None:
            raise SettingsError("BeaconPhases needs a BeaconLogger among the Trainer's loggers")
        self._logger.async_checkpoints = isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Each rank times what it waits for the others (`run.watch`, so a rank they wait for is named): DDP's
        gradient all_reduce where the strategy wrapped the module in a DistributedDataParallel and registered no
        communication hook of its own (DDP takes one), and the collectives the module calls through
        torch.distributed. Once per run, of two ranks or more."""
        if self._watched or trainer.world_size < 2:
            return
        self._watched = True
        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel) and getattr(trainer.strategy, "_ddp_comm_hook", None) is None:
            self.logger.run.watch(model)
        else:
            self.logger.run.watch()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        logger = self.logger
        logger.phases.leave(Phase.CHECKPOINT)  # ranks other than 0 hear of no finished save
        if trainer.is_global_zero:
            logger.steps.flush(logger.run)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.logger.run.mark_step(trainer.global_step - 1)  # the step Lightning logs this batch's metrics at

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.logger.phases.enter(self.logger.run, Phase.EVALUATION)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.logger.phases.leave(Phase.EVALUATION)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.logger.phases.enter(self.logger.run, Phase.CHECKPOINT)  # left once the file is written

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.logger.phases.leave(Phase.CHECKPOINT)
