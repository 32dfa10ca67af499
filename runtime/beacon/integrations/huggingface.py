"""Beacon inside the Hugging Face Trainer (`pip install beacon[transformers]`):

    beacon_callback = BeaconCallback("bert")                 # the run starts inside Trainer(...)
    trainer = Trainer(model, args, train_dataset=train, eval_dataset=held_out, callbacks=[beacon_callback])
    with beacon_callback:                                    # an exception in training is recorded as failed
        trainer.train(resume_from_checkpoint=beacon_callback.run.resume_checkpoint)

What the Trainer logs is recorded one record per step (numbers only; its training, evaluation and
summary logs of one step are merged), evaluation and checkpoint saving are phases (work, not a
stall), each save is committed as the resume point once the records through its step are durable,
and the end of training writes the final state. On several ranks (torchrun) only rank 0 writes.

Signals are Beacon's (the Trainer has no SIGTERM handling): SIGTERM on any rank makes every rank
save, stop at the same step and record the run as `preempted`.
"""

from __future__ import annotations

import inspect
import logging
import os
from types import TracebackType
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

import beacon
from beacon.contract import Phase
from beacon.integrations.common import PhaseMarks, StepRecords, numeric_metrics
from beacon.settings import RunSettings, SettingsError

log = logging.getLogger(__name__)


def _trainer_calling(callback: TrainerCallback) -> Any:
    """The Trainer up the calling frames whose callback handler holds `callback` (the one running its event), else
    None."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            owner = frame.f_locals.get("self")
            handler = getattr(owner, "callback_handler", None)
            if any(each is callback for each in getattr(handler, "callbacks", None) or ()):
                return owner
            frame = frame.f_back
        return None
    finally:
        del frame


class BeaconCallback(TrainerCallback):
    """A TrainerCallback that runs a Beacon run alongside the Trainer. Pass a run made with
    `beacon.init`, or the run's settings (`beacon.init`'s arguments): then the run starts when the
    Trainer is made, on every rank, once the Trainer's process group exists."""

    def __init__(
        self,
        experiment: str | None = None,
        *,
        run: beacon.Run | None = None,
        run_id: str | None = None,
        handle_signals: bool = True,
        **settings: Any,
    ) -> None:
        if run is not None and (experiment is not None or run_id is not None or settings):
            raise SettingsError("BeaconCallback: pass either a run or its settings, not both")
        self._settings = (
            run.settings if run is not None else RunSettings.resolve(experiment=experiment, run=run_id, **settings)
        )
        self._run = run
        self._handle_signals = handle_signals
        self._training = False
        self._watched = False
        self.steps = StepRecords()
        self.phases = PhaseMarks()

    @property
    def run(self) -> beacon.Run:
        if self._run is None:
            raise RuntimeError("BeaconCallback: the run starts when the Trainer is made with this callback")
        return self._run

    def _start(self) -> beacon.Run:
        if self._run is None:
            self._run = beacon.init(settings=self._settings, handle_signals=self._handle_signals)
        return self._run

    # --- the run's start and end ---------------------------------------------------------------
    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._start()  # every rank; TrainingArguments made the process group under torchrun

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        run = self._start()  # a callback added after the Trainer was made
        self._training = True
        if args.world_size > 1 and not self._watched:
            self._watched = True
            self._watch(run)
        if state.is_world_process_zero:
            model_config = getattr(kwargs.get("model"), "config", None)
            to_dict = getattr(model_config, "to_dict", None)
            run.log_hyperparams(
                {"training_arguments": args.to_sanitized_dict(), "model_config": to_dict() if to_dict else {}}
            )

    def _watch(self, run: beacon.Run) -> None:
        """Each rank times what it waits for the others (`run.watch`, so a rank they wait for is named): DDP's gradient
        all_reduce where the Trainer wrapped the model in a DistributedDataParallel with no communication hook of its
        own (DDP takes one), and the collectives the model calls through torch.distributed. The callbacks are handed
        the unwrapped model alone; the wrapper is the Trainer's `model_wrapped`, found on the Trainer that calls this
        callback."""
        from torch.nn.parallel import DistributedDataParallel

        try:  # the Trainer's internals: what it does not have, the collectives alone are timed
            wrapped = getattr(_trainer_calling(self), "model_wrapped", None)
        except Exception as error:
            wrapped = None
            log.warning("BeaconCallback: the Trainer's model not found (%s); DDP's all_reduce is not timed", error)
        wrapped = getattr(wrapped, "_orig_mod", wrapped)  # torch.compile's wrapper around the DDP module
        if isinstance(wrapped, DistributedDataParallel) and not getattr(wrapped, "_comm_hooks", None):
            run.watch(wrapped)
            return
        log.warning(
            "BeaconCallback: no DistributedDataParallel of the Trainer's without a communication hook of its own "
            "(%s): a slow rank is named only by the collectives the model calls through torch.distributed",
            type(wrapped).__name__,
        )
        run.watch()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Every rank: the last step's metrics (and the Trainer's summary), then the final state."""
        self._training = False
        self._end(None)

    def __enter__(self) -> BeaconCallback:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _trace: TracebackType | None
    ) -> None:
        self._end(error)

    def _end(self, error: BaseException | None) -> None:
        if self._run is None:
            return
        self.phases.leave_all()
        self.steps.flush(self._run)
        self._run.finish(error=error)  # preempted after SIGTERM, failed with an error, else finished

    # --- steps -----------------------------------------------------------------------------------
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.steps.flush(self.run)  # the previous step's logs are all in

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        run = self.run
        run.mark_step(state.global_step)
        if run.should_stop():  # a collective: every rank calls it here, every step
            control.should_training_stop = True
            control.should_save = args.save_strategy != SaveStrategy.NO  # what was trained is kept
        # The Trainer logs, evaluates, then saves right after this hook.
        if control.should_evaluate:
            self.phases.enter(run, Phase.EVALUATION)
        elif control.should_save:
            self.phases.enter(run, Phase.CHECKPOINT)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if state.is_world_process_zero and logs:
            self.steps.add(self.run, state.global_step, numeric_metrics(logs))

    # --- evaluation and checkpoints ------------------------------------------------------------
    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.phases.enter(self.run, Phase.EVALUATION)  # `trainer.evaluate()` called outside training

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self.phases.leave(Phase.EVALUATION)
        if self._training and control.should_save:
            self.phases.enter(self.run, Phase.CHECKPOINT)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """The Trainer wrote checkpoint-<step> (synchronously): it becomes the resume point once the
        records through its step are durable (on a thread of Beacon's; rank 0)."""
        self.phases.leave(Phase.CHECKPOINT)
        folder = os.path.join(args.output_dir or "", f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.run.commit_checkpoint(state.global_step, path=folder)
