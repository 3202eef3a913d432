"""The numbers of a sweep's table: per run (final error, time to target, throughput, noise
scale) and per label (mean ± sample std over seeds, speedup and efficiency against the smallest
world of the same config).

Pure functions over :class:`~mxlarge.reporting.runs.RunData`: the rules are stated next to the
numbers in report.md (:func:`mxlarge.reporting.tables.render_markdown`), and the statistics
themselves (final error, intervals, tests) are :mod:`mxlarge.stats`.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mxlarge.reporting.runs import RunData, by_label, world_shape
from mxlarge.stats import final_error


def run_final_error(rows: Sequence[Mapping[str, float]], last: int = 5) -> float | None:
    """:func:`final_error` over the evaluated epochs (all of them if fewer than ``last``)."""
    errors = [r["val/error_top1"] for r in rows if "val/error_top1" in r]
    return final_error(errors, last) if errors else None


def best_accuracy(rows: Sequence[Mapping[str, float]]) -> float | None:
    """The highest ``val/accuracy`` over a run's evaluated epochs; None without any."""
    return max((r["val/accuracy"] for r in rows if "val/accuracy" in r), default=None)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean x̄ and the sample standard deviation s = sqrt(Σ(x − x̄)² / (n − 1)).

    Returns:
        ``(x̄, s)``; s is None for a single value (undefined with n − 1 = 0).
    """
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def time_to_target(rows: Sequence[Mapping[str, float]],
                   target: float) -> tuple[float, float | None] | None:
    """The first evaluated epoch whose ``val_accuracy`` >= ``target``; no interpolation.

    Accuracy is only known at evaluations, so the target counts as reached at the end of the
    first epoch that shows it (interpolating between noisy evaluations would invent a time).

    Returns:
        ``(epoch, train_seconds)`` of that row (cumulative training seconds, evaluation
        excluded; None if not logged), or None if the target is never reached.
    """
    for r in rows:
        if "val/accuracy" in r and r["val/accuracy"] >= target:
            return r.get("train/epoch", float("nan")), r.get("perf/train_seconds")
    return None


def epoch_median(rows: Sequence[Mapping[str, float]], key: str) -> float | None:
    """Median over epochs of ``key`` (for the global images/s: robust to a slow first epoch);
    None when no epoch logged it."""
    values = [r[key] for r in rows if key in r]
    return float(statistics.median(values)) if values else None


def scaling(images_per_sec_k: float, images_per_sec_ref: float, k: int,
            k_ref: int = 1) -> tuple[float, float]:
    """Speedup S = ips(k) / ips(k_ref) and scaling efficiency E = S / (k / k_ref) against a
    reference of ``k_ref`` gradient contributors (1.0 is linear scaling)."""
    speedup = images_per_sec_k / images_per_sec_ref
    return speedup, speedup / (k / k_ref)


def convergence_speedup(seconds_1: float | None, seconds_k: float | None) -> float | None:
    """Time-to-target(reference) / time-to-target(k workers); None if either is unknown."""
    if seconds_1 is None or seconds_k is None or seconds_k <= 0:
        return None
    return seconds_1 / seconds_k


def all_reached(values: Sequence[float | None]) -> tuple[float, float | None] | None:
    """:func:`mean_std` of per-seed times to target, only if every seed reached the target.

    A mean over the seeds that happened to reach it would flatter the label, so a partial
    result is None (shown as "not reached").
    """
    if not values or any(v is None for v in values):
        return None
    return mean_std([float(v) for v in values if v is not None])  # all are, by now


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Pointwise mean of ``[(x, y)]`` curves over the x present in every curve."""
    if not curves:
        return []
    shared = set.intersection(*({x for x, _ in c} for c in curves))
    maps = [dict(c) for c in curves]
    return [(x, statistics.fmean(m[x] for m in maps)) for x in sorted(shared)]


def common(values: Sequence[Any]) -> Any:
    """The value all runs of a label share, or None if they differ."""
    distinct = set(values)
    return values[0] if len(distinct) == 1 else None


# "Far above" the noise scale: with McCandlish et al.'s model, steps S = S_min·(1 + B_noise/B)
# and examples E = E_min·(1 + B/B_noise). At B = 10·B_noise a larger batch can cut the steps by
# at most 1/11 (9%) more, while each example buys 11× less than at small batches.
FAR_ABOVE = 10.0
# Older runs logged an infinite B_simple before |G|² had a positive estimate; MLflow stores that
# as the largest float.
NO_ESTIMATE = 1e300


def settled_b_simple(points: Sequence[tuple[int, float]]) -> list[float]:
    """A run's B_simple measurements by step, without the first 10% (at initialisation |G|² is
    tiny and the estimate swings wildly) and without those logged before it had an estimate."""
    values = [v for _, v in sorted(points) if 0 < v < NO_ESTIMATE]
    return values[len(values) // 10:]


def noise_scale_stages(points: Sequence[tuple[int, float]]) -> tuple[float, float, float] | None:
    """Median B_simple over the first, middle and last third of training (by step), of the
    :func:`settled_b_simple` measurements."""
    values = settled_b_simple(points)
    if len(values) < 3:
        return None
    third = len(values) // 3
    parts = (values[:third], values[third:2 * third], values[2 * third:])
    first, middle, last = (float(statistics.median(p)) for p in parts)
    return first, middle, last


@dataclass(frozen=True)
class LabelRow:
    """The numbers of one label (group of seeds). Per-seed tuples follow ``seeds``."""

    label: str
    seeds: tuple[int, ...]
    missing_seeds: tuple[int, ...]
    workers: int | None     # gradient contributors k = processes · devices · simulated
    global_batch: int | None
    peak_lr: float | None
    final_errors: tuple[float, ...]
    epochs_to_target: tuple[float | None, ...]
    seconds_to_target: tuple[float | None, ...]
    images_per_sec: float | None
    reference: str | None
    speedup: float | None
    efficiency: float | None
    conv_speedup: float | None
    configs: int = 1        # distinct configs (seed aside) among the seeds: 1 expected
    waiting: float | None = None  # share of a step spent waiting for the exchange
    shape: tuple[int, int, int] | None = None  # (processes, devices, simulated) of every seed


def reference_of(label: str, stats: Mapping[str, Mapping[str, Any]],
                 order: Sequence[str]) -> str | None:
    """The label ``label``'s speedup is against: of the labels of its config (equal
    ``fingerprint``, :func:`~mxlarge.reporting.runs.config_fingerprint`) the one of fewest
    gradient contributors k (``workers``), the first in ``order`` among equals; the label itself
    when it is that one. None when its seeds differ in config or world."""
    mine = stats[label]
    if mine["fingerprint"] is None or mine["workers"] is None:
        return None
    same = [name for name in order if name in stats
            and stats[name]["fingerprint"] == mine["fingerprint"]
            and stats[name]["workers"] is not None]
    return min(same, key=lambda name: stats[name]["workers"])  # min keeps the first of equals


@dataclass(frozen=True)
class Summary:
    best_accuracy: float | None
    best_run: str | None
    target_fraction: float
    target: float | None
    rows: tuple[LabelRow, ...]


def summarize(runs: Sequence[RunData], target_fraction: float,
              missing: Mapping[str, Sequence[int]] | None = None,
              order: Sequence[str] = ()) -> Summary:
    """Per-label numbers of a sweep's selected runs (the rules are stated in report.md,
    :func:`~mxlarge.reporting.tables.render_markdown`).

    target = ``target_fraction`` × max over runs and epochs of ``val_accuracy``. The reference
    of a label is :func:`reference_of`.

    Args:
        runs: the selected FINISHED runs (:func:`~mxlarge.reporting.runs.select_runs`).
        target_fraction: the target as a fraction of the best accuracy.
        missing: label -> seeds without a FINISHED run; a label whose every seed failed still
            gets a row (with no numbers), so a failure is visible in the table.
        order: labels in sweep order (others follow in order of appearance).
    """
    best = max(((r["val/accuracy"], run) for run in runs for r in run.rows
                if "val/accuracy" in r), key=lambda t: t[0], default=(None, None))
    target = best[0] * target_fraction if best[0] is not None else None
    labels = by_label(runs)
    stats = {}
    for label, group in labels.items():
        group = sorted(group, key=lambda r: r.seed)
        ttt = [time_to_target(r.rows, target) if target is not None else None for r in group]
        ips = [v for v in (epoch_median(r.rows, "perf/images_per_sec") for r in group)
               if v is not None]
        waits = [v for v in (epoch_median(r.rows, "breakdown/wait_share") for r in group)
                 if v is not None]
        stats[label] = dict(
            group=group, ttt=ttt, ips=statistics.fmean(ips) if ips else None,
            waiting=statistics.fmean(waits) if waits else None,
            shape=common([world_shape(r) for r in group]),
            fingerprint=common([r.fingerprint for r in group]))
        shape = stats[label]["shape"]
        stats[label]["workers"] = math.prod(shape) if shape is not None else None
    rows = []
    names = list(dict.fromkeys([*order, *labels, *(missing or {})]))
    for label in names:
        if label not in stats:
            if missing is not None and label in missing:
                rows.append(LabelRow(
                    label=label, seeds=(), missing_seeds=tuple(sorted(missing[label])),
                    workers=None, global_batch=None, peak_lr=None, final_errors=(),
                    epochs_to_target=(), seconds_to_target=(), images_per_sec=None,
                    reference=None, speedup=None, efficiency=None, conv_speedup=None))
            continue
        s = stats[label]
        group = s["group"]
        ref = reference_of(label, stats, names)
        speedup = None
        efficiency = None
        conv = None
        if ref is not None and s["workers"] is not None:
            o = stats[ref]
            if s["ips"] is not None and o["ips"]:
                speedup, efficiency = scaling(s["ips"], o["ips"], s["workers"], o["workers"])
            mine = all_reached([t[1] if t else None for t in s["ttt"]])
            theirs = all_reached([t[1] if t else None for t in o["ttt"]])
            conv = convergence_speedup(theirs[0] if theirs else None, mine[0] if mine else None)
        errors = [e for e in (run_final_error(r.rows) for r in group) if e is not None]
        rows.append(LabelRow(
            label=label, seeds=tuple(r.seed for r in group),
            missing_seeds=tuple(sorted((missing or {}).get(label, ()))),
            workers=s["workers"], global_batch=common([r.global_batch for r in group]),
            peak_lr=common([r.peak_lr for r in group]), final_errors=tuple(errors),
            epochs_to_target=tuple(t[0] if t else None for t in s["ttt"]),
            seconds_to_target=tuple(t[1] if t else None for t in s["ttt"]),
            images_per_sec=s["ips"], reference=ref, speedup=speedup, efficiency=efficiency,
            conv_speedup=conv, configs=len({r.fingerprint for r in group}),
            waiting=s["waiting"], shape=s["shape"]))
    return Summary(best_accuracy=best[0], best_run=best[1].run_id if best[1] else None,
                   target_fraction=target_fraction, target=target, rows=tuple(rows))
