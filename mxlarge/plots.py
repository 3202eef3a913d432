"""Matplotlib plumbing shared by the run artifacts (:mod:`mxlarge.tracking`) and the sweep
reports (:mod:`mxlarge.report`): a headless backend, one save path, the per-run curves."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot().close(fig)


def plot_training_curves(history: list[dict[str, float]], path: str | Path,
                         title: str = "") -> None:
    """PNG with training loss, validation error and LR per epoch."""
    plt = pyplot()
    epochs = [h["train/epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    series = [("train/loss", "training loss"), ("val/error_top1", "validation top-1 error"),
              ("train/lr", "learning rate (end of epoch)")]
    for ax, (key, label) in zip(axes, series):
        pts = [(e, h[key]) for e, h in zip(epochs, history) if key in h]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3)
        ax.set_xlabel("epoch")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    save(fig, path)
