"""`python -m tests.support.lightning_job`: a tiny LightningModule trained through BeaconLogger and
BeaconPhases, configured by BEACON_* alone, with the failures the integration tests ask for."""

from __future__ import annotations

import argparse
import os
import signal
import time

import lightning.pytorch as pl
import torch
from beacon.integrations.lightning import BeaconLogger, BeaconPhases
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

SAMPLES, BATCH = 16, 2  # 8 steps an epoch


class Regression(pl.LightningModule):
    def __init__(self, learning_rate: float, fail_at: int, sigterm_at: int, hold_evaluation: bool) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.hparams["fail_at"]:
            raise ValueError("a bug in the team's training_step")
        if self.global_step == self.hparams["sigterm_at"]:
            os.kill(os.getpid(), signal.SIGTERM)  # as an eviction would; Lightning stops after this step
        inputs, targets = batch
        loss = functional.mse_loss(self.layer(inputs), targets)
        self.log("loss", loss)
        self.log("lr", self.hparams["learning_rate"])
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        inputs, targets = batch
        self.log("val_loss", functional.mse_loss(self.layer(inputs), targets))
        if self.hparams["hold_evaluation"] and not self.trainer.sanity_checking and self.trainer.is_global_zero:
            hold_until_two_metric_batches(self.trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["learning_rate"])


def hold_until_two_metric_batches(trainer: pl.Trainer) -> None:
    """Evaluation lasts until the heartbeat sent metrics inside it: a wait on the sender, not a sleep."""
    logger = trainer.logger
    assert isinstance(logger, BeaconLogger)
    report = logger.run.telemetry.report  # type: ignore[attr-defined]
    sent = report.metric_batches
    while report.metric_batches < sent + 2:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fail-at", type=int, default=-1)
    parser.add_argument("--sigterm-at", type=int, default=-1)
    parser.add_argument("--hold-evaluation", action="store_true")
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--lightning-dir", required=True)
    parser.add_argument("--ddp", action="store_true", help="every rank torchrun started, strategy ddp (gloo)")
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(SAMPLES, 4)
    data = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if args.ddp else 1,
        strategy="ddp" if args.ddp else "auto",
        logger=BeaconLogger("lightning"),
        callbacks=[
            BeaconPhases(),
            pl.callbacks.ModelCheckpoint(
                dirpath=args.lightning_dir, every_n_train_steps=args.checkpoint_every, save_top_k=-1
            ),
        ],
        log_every_n_steps=1,
        num_sanity_val_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.lightning_dir,
    )
    module = Regression(0.05, args.fail_at, args.sigterm_at, args.hold_evaluation)
    trainer.fit(module, DataLoader(data, batch_size=BATCH), DataLoader(data, batch_size=8))
    print("fit returned", flush=True)


if __name__ == "__main__":
    main()
