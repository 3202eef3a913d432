"""Reporting: the numbers Goyal et al. report, and plots people would rather look at."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path


def final_error(val_errors: Sequence[float], last: int = 5) -> float:
    """Goyal et al.'s final error: the median of the last ``last`` epochs' validation error."""
    if not val_errors:
        raise ValueError("no validation errors")
    return float(statistics.median(val_errors[-last:]))


def plot_training_curves(history: list[dict[str, float]], path: str | Path,
                         title: str = "") -> None:
    """PNG with training loss, validation error and LR per epoch."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    series = [("train_loss", "training loss"), ("val_error_top1", "validation top-1 error"),
              ("lr", "learning rate (end of epoch)")]
    for ax, (key, label) in zip(axes, series):
        pts = [(e, h[key]) for e, h in zip(epochs, history) if key in h]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3)
        ax.set_xlabel("epoch")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
