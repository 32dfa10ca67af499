"""A LightningModule trained with Beacon's logger and phases. Settings come from BEACON_*.

python examples/lightning_module.py --epochs 3
"""

from __future__ import annotations

import argparse

import lightning.pytorch as pl
import torch
from beacon.integrations.lightning import BeaconLogger, BeaconPhases
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset


class Regression(pl.LightningModule):
    def __init__(self, learning_rate: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()  # kept with the run: params/hyperparams.json
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = functional.mse_loss(self.layer(inputs), targets)
        self.log("loss", loss)  # one Beacon record per step
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        inputs, targets = batch
        self.log("val_loss", functional.mse_loss(self.layer(inputs), targets))  # merged into its step

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["learning_rate"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--root", default="lightning_logs", help="Lightning's checkpoints: <root>/<experiment>/<run>/")
    args = parser.parse_args()
    torch.manual_seed(0)
    inputs = torch.randn(64, 8)
    data = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        logger=BeaconLogger("lightning-example"),  # the run starts in fit, on every rank
        callbacks=[BeaconPhases()],  # validation and checkpoints are work, not a stall
        default_root_dir=args.root,
        log_every_n_steps=1,
        enable_progress_bar=False,
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))


if __name__ == "__main__":
    main()
