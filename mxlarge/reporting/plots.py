"""Every plot of mxlarge: a run's training curves (logged by :mod:`mxlarge.tracking`) and the PNGs
of a sweep report (the labels compared, validation error, final error vs batch, loss and LR,
noise scale, the study).

Matplotlib on the headless Agg backend, imported when a plot is drawn (code that draws nothing does
not pay for it), one figure per file saved at 100 dpi by :func:`save`: the same runs give the same
bytes.
"""
from __future__ import annotations

import statistics
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlarge.breakdown import describe
from mxlarge.reporting.runs import RunData, by_label
from mxlarge.reporting.study import StudyRow
from mxlarge.reporting.summary import (
    NO_ESTIMATE,
    Summary,
    best_accuracy,
    mean_curve,
    mean_std,
    run_final_error,
)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save(fig: Any, path: str | Path, suptitle: str = "") -> None:
    """Writes ``fig`` (titled ``suptitle`` if given) to ``path`` at 100 dpi and closes it."""
    if suptitle:
        fig.suptitle(suptitle)
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
    save(fig, path, title)


def plot_breakdown(ranks: Sequence[dict[str, float]], hosts: Sequence[str], path: str | Path,
                   title: str = "") -> None:
    """PNG: per worker rank (labelled with its host), a stacked bar of its parts' medians in ms
    (:mod:`mxlarge.breakdown`: waiting for data, forward+backward, waiting for the exchange,
    update), topped up to its whole step's median (hatched: time the parts' medians miss, as
    when a worker is slowed now and then in whichever part runs); the run's
    :func:`~mxlarge.breakdown.describe` above."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(7.5, 1.2 * len(ranks) + 5), 4.2))
    labels = {"data": "waiting for data", "compute": "forward+backward",
              "exchange": "waiting for the exchange", "update": "update"}
    bottom = [0.0] * len(ranks)
    xs = [f"rank {r}\n{host}" for r, host in enumerate(hosts)]
    for part, label in labels.items():
        values = [r[part] for r in ranks]
        ax.bar(xs, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.bar(xs, [max(0.0, r["step"] - b) for r, b in zip(ranks, bottom)], bottom=bottom,
           color="none", edgecolor="grey", hatch="//", label="rest of the step's median")
    ax.set_ylabel("ms per step (median of the last sampled steps)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    ax.set_title(textwrap.fill(describe(ranks, hosts), 90), fontsize=8)
    save(fig, path, title or "where each worker rank's step goes")


def _log_panel(ax: Any, xlabel: str, ylabel: str, title: str) -> None:
    """The finish of a one-panel sweep plot: log y axis, labels, grid, legend, title."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)


def plot_val_error(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Validation top-1 error vs epoch, mean over seeds, one curve per label (Goyal Fig. 2)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, group) in enumerate(by_label(runs).items()):
        curve = mean_curve([[(x["train/epoch"], 100 * x["val/error_top1"]) for x in r.rows
                             if "train/epoch" in x and "val/error_top1" in x] for r in group])
        if curve:
            ax.plot(*zip(*curve), label=f"{label} (n={len(group)})", lw=2.2 if i == 0 else 1.4,
                    color="black" if i == 0 else None)
    _log_panel(ax, "epoch", "validation top-1 error (%), mean over seeds",
               title or "validation error")
    save(fig, path)


def plot_error_vs_batch(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Final error vs global batch: one dot per seed, mean ± sample std per label.

    Labels are dodged sideways by a factor 2^(0.05·i) so that those sharing a batch stay
    readable; the axis is log2, so the true batch is the nearest tick.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups = by_label(runs)
    for i, (label, group) in enumerate(groups.items()):
        dodge = 2 ** (0.05 * (i - (len(groups) - 1) / 2))
        pts = [(r.global_batch * dodge, 100 * e) for r in group
               if r.global_batch is not None and (e := run_final_error(r.rows)) is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        dots = ax.scatter(xs, ys, s=14, alpha=0.5)
        mean, std = mean_std(ys)
        ax.errorbar([statistics.median(xs)], [mean], yerr=[std or 0.0], fmt="o", capsize=4,
                    color=dots.get_facecolor()[0], label=label)
    ax.set_xscale("log", base=2)
    # log y: a diverged label at 60 % must not flatten the 1-4 % differences
    _log_panel(ax, "global batch (param plan.global_batch)", "final top-1 error (%)",
               title or "final error vs global batch")
    save(fig, path)


def plot_loss_lr(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Per label, for its lowest seed: training loss and the LR, as logged per step, vs step."""
    plt = pyplot()
    groups = by_label(runs)
    cols = min(3, max(1, len(groups)))
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.3 * nrows), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.axis("off")
    for ax, (label, group) in zip(axes.flat, groups.items()):
        run = min(group, key=lambda r: r.seed)
        if run.loss:
            ax.plot(*zip(*sorted(dict(run.loss).items())), lw=1, color="tab:blue")
        ax.set_ylabel("training loss", color="tab:blue")
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        twin = ax.twinx()
        if run.lr:
            twin.plot(*zip(*sorted(dict(run.lr).items())), color="tab:red", lw=1)
        twin.set_ylabel("learning rate", color="tab:red")
        ax.set_title(f"{label}, seed {run.seed}", fontsize=9)
    save(fig, path, title)


def plot_noise_scale(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """B_simple over steps (one seed per label) with each label's global batch as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, group in by_label(runs).items():
        r = next((x for x in group if x.gns), None)
        if r is None:
            continue
        # the estimate is negative or infinite while |G|² is still estimated <= 0
        pts = sorted((s, v) for s, v in r.gns if 0 < v < NO_ESTIMATE)
        if not pts:
            continue
        steps, values = zip(*pts)
        line, = ax.plot(steps, values, label=f"{label}: B_simple")
        if r.global_batch:
            ax.axhline(r.global_batch, ls="--", color=line.get_color(), lw=1,
                       label=f"{label}: global batch {r.global_batch}")
    _log_panel(ax, "step", "batch size (images)", title)
    save(fig, path)


def plot_study(study: Sequence[StudyRow], path: str | Path, title: str = "") -> None:
    """Final error (mean, 95% interval) and MLPerf steps to target vs global batch.

    Recipe labels are joined by a line; ablations are single markers at their batch (a ▲ at the
    top edge of the steps panel: target not reached by the MLPerf rule); B_simple
    of the recipe runs (median) is a dotted vertical line (where the batch stops paying: far above
    it, a larger batch saves few steps).
    """
    plt = pyplot()
    fig, (ax_err, ax_steps) = plt.subplots(1, 2, figsize=(13, 4.8), sharex=True)
    recipe = sorted((r for r in study if r.label.endswith("recipe") and r.global_batch),
                    key=lambda r: r.global_batch or 0)
    for ax in (ax_err, ax_steps):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("global batch")
        ax.grid(alpha=0.3, which="both")
    # the recipe's own trajectory: an ablation that trains badly measures another state
    b_values = [r.b_simple for r in recipe if r.b_simple is not None]
    if b_values:
        b = statistics.median(b_values)
        for ax in (ax_err, ax_steps):
            ax.axvline(b, ls=":", color="gray", label=f"B_simple (median of the recipe "
                                                      f"runs) ≈ {b:.0f}")
    for i, r in enumerate(study):
        if r.global_batch is None:
            continue
        is_recipe = r in recipe
        dodge = 1.0 if is_recipe else 2 ** (0.04 * (i % 9 - 4))
        if r.final_errors:  # none when every run diverged: then only the steps panel shows it
            mean = 100 * statistics.fmean(r.final_errors)
            lo, hi = (100 * r.interval[0], 100 * r.interval[1]) if r.interval else (mean, mean)
            lo = max(lo, mean / 10)  # a t interval can reach below 0 %; the axis is logarithmic
            ax_err.errorbar([r.global_batch * dodge], [mean], yerr=[[mean - lo], [hi - mean]],
                            fmt="o" if is_recipe else "x", capsize=3,
                            color="black" if is_recipe else None,
                            label=None if is_recipe else r.label)
        if r.steps.value is not None:
            ax_steps.scatter([r.global_batch * dodge], [r.steps.value],
                             marker="o" if is_recipe else "x",
                             color="black" if is_recipe else None,
                             label=None if is_recipe else r.label)
        else:  # shown at the top edge: a configuration that misses the target is a result
            ax_steps.scatter([r.global_batch * dodge], [0.97], marker="^",
                             transform=ax_steps.get_xaxis_transform(), clip_on=False,
                             color="black" if is_recipe else None,
                             label=f"{r.label}: " + (f"diverged ({r.diverged} of "
                                                           f"{len(r.seeds)})" if r.diverged
                                                           == len(r.seeds) else r.steps.why))
    if recipe:
        ax_err.plot([r.global_batch for r in recipe],
                    [100 * statistics.fmean(r.final_errors) for r in recipe], "k-",
                    label="recipe")
        reached = [r for r in recipe if r.steps.value is not None]
        ax_steps.plot([r.global_batch for r in reached], [r.steps.value for r in reached],
                      "k-", label="recipe")
    ax_err.set_ylabel("final top-1 error (%), mean and 95% interval")
    # log scales (a failed ablation at 60% must not flatten the 0.3-point gaps), only where
    # there is something positive to draw: matplotlib cannot log-scale an empty panel
    if any(r.final_errors and statistics.fmean(r.final_errors) > 0 for r in study):
        ax_err.set_yscale("log")
    ax_steps.set_ylabel("steps to target (MLPerf mean)")
    if any(r.steps.value for r in study):
        ax_steps.set_yscale("log")
    ax_err.legend(fontsize=7)
    ax_steps.legend(fontsize=7)
    save(fig, path, title)


def compare_panels(summary: Summary, runs: Sequence[RunData]
                   ) -> list[tuple[str, list[list[float]]]]:
    """What :func:`plot_compare` draws: per quantity, its name and each label's values (in the
    order of ``summary.rows``): the final errors of its seeds in %, its best validation accuracy
    in % (over its seeds and epochs), its images/s (the mean over seeds of each run's median);
    [] where a label has none."""
    best = {r.label: max((b for run in runs if run.label == r.label
                          if (b := best_accuracy(run.rows)) is not None), default=None)
            for r in summary.rows}
    return [("final error (%), mean ± std", [[100 * e for e in r.final_errors]
                                             for r in summary.rows]),
            ("best accuracy (%)", [[] if (b := best[r.label]) is None else [100 * b]
                                   for r in summary.rows]),
            ("images/s (median)", [[] if r.images_per_sec is None else [r.images_per_sec]
                                   for r in summary.rows])]


def plot_compare(summary: Summary, runs: Sequence[RunData], path: str | Path,
                 title: str = "") -> None:
    """The labels side by side: a panel per quantity of :func:`compare_panels`, every label on
    its x axis, a bar at the mean (± the sample std, each seed a dot when there are several),
    "n/a" where a label has no value."""
    plt = pyplot()
    labels = [r.label for r in summary.rows]
    many = len(labels) > 3
    fig, axes = plt.subplots(1, 3, figsize=(max(9.0, 3 * (1.5 + 0.45 * len(labels))), 3.6))
    colors = [f"C{i % 10}" for i in range(len(labels))]
    for ax, (name, values) in zip(axes, compare_panels(summary, runs)):
        xs = list(range(len(labels)))
        means = [statistics.fmean(v) if v else 0.0 for v in values]
        stds = [(mean_std(v)[1] or 0.0) if v else 0.0 for v in values]
        ax.bar(xs, means, yerr=stds if any(stds) else None, color=colors, alpha=0.8, capsize=4)
        tops = [max([m + sd, *v]) for v, m, sd in zip(values, means, stds)]
        for x, v, m, top in zip(xs, values, means, tops):
            if len(v) > 1:
                ax.scatter([x] * len(v), v, s=10, color="black", zorder=3)
            ax.annotate(f"{m:.4g}" if v else "n/a", (x, top), xytext=(0, 3),
                        textcoords="offset points", ha="center", fontsize=8)
        ax.set_ylim(0, 1.15 * (max(tops, default=0.0) or 1.0))
        ax.set_xticks(xs, labels, rotation=30 if many else 0, ha="right" if many else "center",
                      fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
    save(fig, path, title)
