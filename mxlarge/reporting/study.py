"""The study of a sweep with a ``target`` (:mod:`mxlarge.sweep`): per label (configuration), the
final error over seeds with a 95% t interval, Welch's t-test against its comparison label, steps,
epochs and seconds to the target the MLPerf way, and B_simple (the gradient noise scale).

The target error is the reference label's mean final error plus a tolerance, both fixed in the
sweep file before any run (not a fraction of the best run), so no configuration moves its own
goal. An ablation ``"<k>x ..."`` is compared with the recipe at the same global batch (the label
ending in ``recipe``), a recipe at k > 1 with the reference, a label with no recipe at its batch
with the reference if that is at its batch (``16-bit wire`` against ``float32`` in
experiments/sweeps/mnist1d-precision.yaml); a run stopped by divergence (tag
``diverged``) never reaches the target and has no final error. The section's text, with where
the recipe holds, is :func:`mxlarge.reporting.tables.study_markdown`; its plot
:func:`mxlarge.reporting.plots.plot_study`.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from mxlarge import stats
from mxlarge.reporting.runs import RunData, by_label
from mxlarge.reporting.summary import common, run_final_error, settled_b_simple


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


def _run_b_simple(run: RunData) -> float | None:
    values = settled_b_simple(run.gns)
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
    groups = by_label(runs)
    batches = {name: common([r.global_batch for r in g]) for name, g in groups.items()}
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
            peak_lr=common([r.peak_lr for r in group]), seeds=tuple(r.seed for r in group),
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
