"""The Hugging Face Trainer with BeaconCallback: a tiny BERT built from a config (nothing is
downloaded) on synthetic sentences. Settings come from BEACON_*.

    python examples/hf_trainer.py --steps 60
    torchrun --nproc-per-node 2 examples/hf_trainer.py --steps 60
"""

from __future__ import annotations

import argparse

import torch
from beacon.integrations.huggingface import BeaconCallback
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Sentences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "attention_mask": torch.ones_like(tokens), "labels": tokens[0] % 2}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20, help="steps between evaluations and saves")
    parser.add_argument("--output-dir", default="hf_output")
    args = parser.parse_args()
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=args.every,
        save_steps=args.every,
        report_to=[],  # Beacon records what the Trainer logs
    )
    beacon_callback = BeaconCallback("hf-example")  # the run starts inside Trainer(...), on every rank
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=training,
        train_dataset=Sentences(),
        eval_dataset=Sentences(),
        callbacks=[beacon_callback],
    )
    with beacon_callback:  # an exception in training is recorded as failed
        trainer.train(resume_from_checkpoint=beacon_callback.run.resume_checkpoint)


if __name__ == "__main__":
    main()
