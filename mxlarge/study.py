"""The study section of ``mxlarge report``: per configuration, the numbers issue 18 asks for.

For a sweep with a ``target`` (see :mod:`mxlarge.sweep`), every label (configuration) gets:

* final error (median of the last 5 epochs, :func:`mxlarge.stats.final_error`) as mean ±
  sample std and a 95% t interval over seeds;
* Welch's t-test of its final errors against its comparison label: an ablation ``"<k>x ..."``
  against the recipe at the same global batch (the label ending in ``recipe``), a recipe at
  k > 1 against the target's reference (the small batch), a label with no recipe at its batch
  against the reference if that is at its batch (variants of one job: ``16-bit wire`` against
  ``float32`` in experiments/sweeps/mnist1d-precision.yaml);
* steps, epochs and training seconds to the target the MLPerf way (:func:`mxlarge.stats.
  mlperf_mean`), with the number of runs that reached it;
* B_simple (gradient noise scale): per run the median of its ``gns/b_simple`` measurements
  after the first 10% (the estimate swings at initialisation), then the median over seeds;

a run stopped by divergence (tag ``diverged``) counts as one that never reaches the target and
has no final error; the section states where the recipe holds (:func:`largest_within`: the
largest batch up to which every recipe batch's mean is within the tolerance of the reference's);
and a plot of final error and steps to target against the global batch, B_simple marked.
Target error = mean final error of the reference label + tolerance, fixed by the sweep file
before any run (not a fraction of the best run).
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxlarge import stats

# Runs are mxlarge.report.RunData records; not imported: report imports this module.
RunData = Any

_NO_ESTIMATE = 1e300


@dataclass(frozen=True)
class Target:
    reference: str
    tolerance: float
    error: float | None  # None when the reference label has no finished run


@dataclass(frozen=True)
class StudyRow:
    label: str
    global_batch: int | None
    peak_lr: float | None
    seeds: tuple[int, ...]
    final_errors: tuple[float, ...]
    interval: tuple[float, float] | None
    versus: str | None
    test: stats.Welch | None
    steps: stats.MLPerf
    epochs: stats.MLPerf
    seconds: stats.MLPerf
    b_simple: float | None
    diverged: int = 0  # runs stopped by divergence: no final error, never reach the target


def target_from_runs(runs: Sequence[RunData]) -> Target | None:
    """The sweep's target from the newest run's ``sweep_target`` tag; None if none has one."""
    newest = sorted(runs, key=lambda r: -r.start_time)
    spec = next((r.sweep_target for r in newest if r.sweep_target), None)
    if spec is None:
        return None
    parsed = json.loads(spec)
    ref = [e for r in runs if r.label == parsed["reference"]
           if (e := run_final_error(r.rows)) is not None]
    error = statistics.fmean(ref) + parsed["tolerance"] if ref else None
    return Target(parsed["reference"], float(parsed["tolerance"]), error)


def run_final_error(rows: Sequence[Mapping[str, float]]) -> float | None:
    """:func:`mxlarge.stats.final_error` of a run's evaluated epochs; None without any."""
    errors = [r["val/error_top1"] for r in rows if "val/error_top1" in r]
    return stats.final_error(errors) if errors else None


def _run_b_simple(run: RunData) -> float | None:
    values = [v for _, v in sorted(run.gns) if 0 < v < _NO_ESTIMATE]
    values = values[len(values) // 10:]
    return float(statistics.median(values)) if values else None


def _points(run: RunData) -> list[tuple[float, float, float, float | None]]:
    return [(r["step"], r["train/epoch"], r["val/error_top1"], r.get("perf/train_seconds"))
            for r in run.rows if "val/error_top1" in r and "train/epoch" in r]


def _versus(label: str, batch: int | None, batches: dict[str, int | None],
            reference: str) -> str | None:
    """A recipe is compared with the reference; another label with the recipe at its batch,
    else with the reference if that is at its batch (a variant of the reference itself, such as
    a precision setting of the same job)."""
    if label.endswith("recipe"):
        return reference if label != reference else None
    same = [name for name, b in batches.items() if name.endswith("recipe") and b == batch]
    if same:
        return same[0]
    at_batch = label != reference and batch is not None and batches.get(reference) == batch
    return reference if at_batch else None


def rows(runs: Sequence[RunData], target: Target, order: Sequence[str]) -> list[StudyRow]:
    """One :class:`StudyRow` per label, by global batch (the recipe first at each batch), then
    in ``order`` (labels not in it follow)."""
    groups: dict[str, list[RunData]] = {}
    for r in runs:
        groups.setdefault(r.label, []).append(r)
    batches = {name: _common([r.global_batch for r in g]) for name, g in groups.items()}
    listed = list(dict.fromkeys([*(o for o in order if o in groups), *groups]))
    # grouped by global batch, the recipe first in each group, then in the given order
    labels = sorted(listed, key=lambda n: (batches[n] is None, batches[n] or 0,
                                           not n.endswith("recipe"), listed.index(n)))
    errors = {name: [e for r in sorted(g, key=lambda r: r.seed)
                     if (e := run_final_error(r.rows)) is not None]
              for name, g in groups.items()}
    out = []
    for label in labels:
        group = sorted(groups[label], key=lambda r: r.seed)
        reached = [stats.first_reaching(_points(r), target.error)
                   if target.error is not None else None for r in group]
        versus = _versus(label, batches[label], batches, target.reference)
        b_simple = [b for b in map(_run_b_simple, group) if b is not None]
        out.append(StudyRow(
            label=label, global_batch=batches[label],
            peak_lr=_common([r.peak_lr for r in group]), seeds=tuple(r.seed for r in group),
            final_errors=tuple(errors[label]), interval=stats.t_interval(errors[label]),
            versus=versus,
            test=stats.welch(errors[label], errors[versus]) if versus in errors else None,
            steps=stats.mlperf_mean([x[0] if x else None for x in reached]),
            epochs=stats.mlperf_mean([x[1] if x else None for x in reached]),
            seconds=stats.mlperf_mean([x[2] if x and x[2] is not None else None
                                       for x in reached]),
            b_simple=float(statistics.median(b_simple)) if b_simple else None,
            diverged=sum(bool(r.diverged) for r in group)))
    return out


def _common(values: Sequence) -> object:
    return values[0] if values and len(set(values)) == 1 else None


def _mlperf(m: stats.MLPerf, fmt: str) -> str:
    reached = f" ({m.reached}/{m.runs})"
    return (fmt.format(m.value) + reached) if m.value is not None else m.why


def largest_within(study: Sequence[StudyRow], target: Target) -> list[str]:
    """Where the recipe holds: each recipe batch's mean final error against the reference's.

    Recipe rows (labels ending in ``recipe``) by global batch; a batch *holds* if
    mean(recipe at B) − mean(reference) ≤ tolerance. Returns the lines stating every batch's Δ
    and the largest batch up to which every recipe batch holds ([] without a target or without
    a recipe label).
    """
    recipe = sorted((r for r in study if r.label.endswith("recipe") and r.global_batch
                     and r.final_errors), key=lambda r: r.global_batch)
    if target.error is None or not recipe:
        return []
    ref_mean = target.error - target.tolerance
    held, largest, all_so_far = [], None, True
    for r in recipe:
        delta = statistics.fmean(r.final_errors) - ref_mean
        ok = delta <= target.tolerance + 1e-12  # the reference itself holds at exactly 0
        held.append(f"{r.label} (batch {r.global_batch}) {100 * delta:+.2f} points, "
                    f"{'holds' if ok else 'misses'}")
        all_so_far = all_so_far and ok
        largest = r if all_so_far else largest
    head = (f"**Where the recipe holds** (mean final error within {100 * target.tolerance:.2f} "
            f"points of '{target.reference}'): ")
    where = (f"up to global batch **{largest.global_batch}** ('{largest.label}')"
             if largest is not None else "at no batch")
    return [head + where + "; " + "; ".join(held) + ".", ""]


def markdown(study: Sequence[StudyRow], target: Target) -> list[str]:
    """The study table and how to read it."""
    goal = (f"validation error ≤ **{100 * target.error:.2f}%** = mean final error of "
            f"'{target.reference}' + {100 * target.tolerance:.2f} points" if target.error
            is not None else f"undefined: no finished run of '{target.reference}'")
    out = ["## Study: final error, significance, MLPerf time to target, noise scale", "",
           f"Target (fixed in the sweep file): {goal}.", "",
           "| label | global batch | B_simple | peak LR | seeds | final error % mean ± std "
           "| 95% interval | vs | Δ points | Welch p | steps to target | epochs to target "
           "| train s to target |", "|" + "---|" * 13]
    for r in study:
        if r.final_errors:
            mean, sd = (statistics.fmean(r.final_errors),
                        statistics.stdev(r.final_errors) if len(r.final_errors) > 1 else None)
            err = f"{100 * mean:.2f} ± {100 * sd:.2f}" if sd is not None else f"{100 * mean:.2f}"
        else:
            err = "n/a"
        if r.diverged:
            err = (f"{err} ({r.diverged} of {len(r.seeds)} diverged)" if r.final_errors
                   else f"diverged ({r.diverged} of {len(r.seeds)})")
        ci = (f"[{100 * r.interval[0]:.2f}, {100 * r.interval[1]:.2f}]" if r.interval
              else "n/a")
        if r.test is not None:
            test = (f"{100 * r.test.diff:+.2f} | {r.test.p:.3g} {stats.mark(r.test.p)}")
        else:
            test = "— | —"
        out.append(
            f"| {r.label} | {r.global_batch if r.global_batch is not None else 'mixed'} "
            f"| {f'{r.b_simple:.0f}' if r.b_simple is not None else 'n/a'} "
            f"| {f'{r.peak_lr:.4g}' if r.peak_lr is not None else 'mixed'} "
            f"| {len(r.seeds)} | {err} | {ci} | {r.versus or '—'} | {test} "
            f"| {_mlperf(r.steps, '{:.0f}')} | {_mlperf(r.epochs, '{:.1f}')} "
            f"| {_mlperf(r.seconds, '{:.1f}')} |")
    out += ["", *largest_within(study, target),
            "- **final error**: per run the median of the last 5 epochs' validation error; mean "
            "± sample std (n − 1) over seeds; **95% interval** x̄ ± t(0.975, n−1)·s/√n.",
            "- **vs / Δ / Welch p**: an ablation against the recipe at the same global batch, "
            "a recipe against the small-batch reference, a label with no recipe at its batch "
            "against the target's reference at that batch; Δ = mean(label) − mean(vs) in points; "
            "two-sided Welch t-test (t CDF from SciPy); ** p < 0.01, * p < 0.05, ns otherwise.",
            "- **to target**: per run the first evaluated epoch at or below the target (steps = "
            "updates at its end; train s = cumulative training time, evaluation excluded); "
            "MLPerf rule over the seeds: ≥ 5 runs, drop the fastest and the slowest, average "
            "the rest; a run that never reaches the target is the slowest; (r/n) = runs that "
            "reached it. Seconds compare only runs on the same machine and load.",
            "- **B_simple**: gradient noise scale tr(Σ)/|G|² (McCandlish et al.), per run the "
            "median of its measurements after the first 10%, then the median over seeds; n/a "
            "for one worker of 32 (it needs two gradient sizes).",
            "- **diverged**: a run the loop stopped (loss not finite or above "
            "`train.divergence_factor` × its early value) counts as a run that never reaches "
            "the target; it has no final error, so mean, interval and Welch p are over the "
            "runs that finished.", ""]
    return out


def plot(study: Sequence[StudyRow], path: str | Path, title: str = "") -> None:
    """Final error (mean, 95% interval) and MLPerf steps to target vs global batch.

    Recipe labels are joined by a line; ablations are single markers at their batch (a ▲ at the
    top edge of the steps panel: target not reached by the MLPerf rule); B_simple
    of the recipe runs (median) is a dotted vertical line (where the batch stops paying: far above
    it, a larger batch saves few steps).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_err, ax_steps) = plt.subplots(1, 2, figsize=(13, 4.8), sharex=True)
    recipe = sorted((r for r in study if r.label.endswith("recipe") and r.global_batch),
                    key=lambda r: r.global_batch)
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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
