"""The demo's picture: the loss curve, and the heartbeat/progress timeline beside it."""

from __future__ import annotations

from pathlib import Path

import matplotlib
from beacon import contract

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def render_png(
    path: Path,
    records: list[contract.Record],
    heartbeats: list[tuple[float, float]],
    progress: list[tuple[float, float]],
) -> Path:
    figure, (loss_axis, time_axis) = plt.subplots(1, 2, figsize=(11, 4))
    history = contract.history(records)
    live = [r for r in history.live if r.loss is not None]
    loss_axis.plot([r.step for r in live], [r.loss for r in live], color="tab:blue")
    # A restart's superseded past stays visible, faint, where it diverged from the live history.
    for attempt in sorted({r.attempt for r in history.superseded}):
        past = [r for r in history.superseded if r.attempt == attempt and r.loss is not None]
        loss_axis.plot([r.step for r in past], [r.loss for r in past], color="tab:gray", alpha=0.4, linewidth=1)
    loss_axis.set(title="Loss (live history, read back from S3)", xlabel="step", ylabel="cross-entropy")
    start = min([t for t, _ in heartbeats] + [t for t, _ in progress] or [0.0])
    time_axis.plot(
        [t - start for t, _ in progress], [v for _, v in progress], color="tab:orange", label="progress age (s)"
    )
    for t, _ in heartbeats:
        time_axis.axvline(t - start, color="tab:green", alpha=0.25, linewidth=1)
    time_axis.plot([], [], color="tab:green", alpha=0.5, label="heartbeat")
    time_axis.set(title="Heartbeat and progress (from CloudWatch)", xlabel="seconds since first beat", ylabel="s")
    time_axis.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
