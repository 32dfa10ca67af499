"""`python -m tests.support.hf_job` (or under torchrun): a tiny BERT built from a config, trained by
the Hugging Face Trainer with BeaconCallback, configured by BEACON_* alone, with the failures the
integration tests ask for. Nothing is downloaded."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
from beacon.integrations.huggingface import BeaconCallback
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

SAMPLES, SEQUENCE = 16, 8


class SyntheticSentences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.randint(0, 50, (SEQUENCE,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "attention_mask": torch.ones(SEQUENCE, dtype=torch.long), "labels": tokens[0] % 2}


class Trouble(TrainerCallback):
    """Placed before BeaconCallback: raises or SIGTERMs itself at a step, or holds evaluation open
    until the heartbeat sent metrics inside it (a wait on the sender, not a sleep)."""

    def __init__(self, beacon_callback: BeaconCallback, fail_at: int, sigterm_at: int, hold_evaluation: bool) -> None:
        self.beacon_callback, self.fail_at, self.sigterm_at = beacon_callback, fail_at, sigterm_at
        self.hold_evaluation = hold_evaluation
        self.held_at = -1

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step == self.fail_at:
            raise ValueError("a bug in the team's data")

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if state.global_step == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # as an eviction would

    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.hold_evaluation and state.is_world_process_zero and self.held_at != state.global_step:
            self.held_at = state.global_step
            report = self.beacon_callback.run.telemetry.report  # type: ignore[attr-defined]
            sent = report.metric_batches
            while report.metric_batches < sent + 2:
                time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--sigterm-at", type=int, default=-1)
    parser.add_argument("--hold-evaluation", action="store_true")
    parser.add_argument("--slow-rank", type=int, default=-1, help="this rank's every forward is --slow-by s longer")
    parser.add_argument("--slow-by", type=float, default=0.0)
    options = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    config = BertConfig(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=50,
        max_position_embeddings=SEQUENCE,
    )
    args = TrainingArguments(
        output_dir=options.output_dir,
        max_steps=options.steps,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=3,
        save_strategy="steps",
        save_steps=3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = BertForSequenceClassification(config)
    if int(os.environ.get("RANK", "0")) == options.slow_rank:  # a throttled GPU: its own work is slower
        model.register_forward_pre_hook(lambda *_: time.sleep(options.slow_by))
    beacon_callback = BeaconCallback("hf")
    trouble = Trouble(beacon_callback, options.fail_at, options.sigterm_at, options.hold_evaluation)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=SyntheticSentences(),
        eval_dataset=SyntheticSentences(),
        callbacks=[trouble, beacon_callback],
    )
    with beacon_callback:
        trainer.train(resume_from_checkpoint=beacon_callback.run.resume_checkpoint)
    # One write of the whole line: print() writes its pieces apart, and two ranks share the pipe.
    sys.stdout.write(f"train returned {beacon_callback.run.world.rank}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
