"""A small vision model on a deterministic synthetic image dataset, generated in-process."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.data import Dataset, Sampler

IMAGE_SIZE = 32
CHANNELS = 3
CLASSES = 10


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """Each class is a fixed random pattern; a sample is its pattern plus noise, seeded by index.

    Deterministic (the same index always gives the same sample, in any process), learnable, and
    needing no download.
    """

    def __init__(self, seed: int, noise: float = 0.8) -> None:
        self.seed = seed
        self.noise = noise
        generator = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(CLASSES, CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=generator)

    def __len__(self) -> int:
        return 2**31 - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        label = int(torch.randint(CLASSES, (1,), generator=generator))
        noise = torch.randn(CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=generator) * self.noise
        return self.patterns[label] + noise, label


class StepSampler(Sampler[int]):
    """Indices for steps [start_step, steps) of one rank: resumable at any step, disjoint across ranks."""

    def __init__(self, *, start_step: int, steps: int, batch_size: int, rank: int, world_size: int) -> None:
        self.start_step, self.steps = start_step, steps
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size

    def __iter__(self) -> Iterator[int]:
        for step in range(self.start_step, self.steps):
            first = (step * self.world_size + self.rank) * self.batch_size
            yield from range(first, first + self.batch_size)

    def __len__(self) -> int:
        return max(0, self.steps - self.start_step) * self.batch_size


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(CHANNELS, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.head = nn.Linear(32 * 4 * 4, CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(images), 1))  # type: ignore[no-any-return]
