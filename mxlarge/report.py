"""Reporting: the numbers Goyal et al. report, and plots people would rather look at."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxlarge.plots import pyplot, save
from mxlarge.stats import final_error  # the rule lives in mxlarge.stats

# ---------------------------------------------------------------------------------------------
# sweep reports: `mxlarge report NAME` (the arithmetic is pure and works on plain lists/dicts)

# Metrics logged once per epoch, all at the step at which the epoch ended (mxlarge.loop).
EPOCH_KEYS = ("train/epoch", "val/error_top1", "val/accuracy", "perf/train_seconds",
              "perf/images_per_sec")
# The names stores written before the MLflow sections (train/, val/, perf/, gns/) used for the
# metrics a report reads; such a run is read under the new names.
LEGACY_METRICS = {"train/epoch": "epoch", "val/error_top1": "val_error_top1",
                  "val/accuracy": "val_accuracy", "perf/train_seconds": "train_seconds",
                  "perf/images_per_sec": "images_per_sec_global", "train/loss": "train_loss_step",
                  "train/lr": "lr", "gns/b_simple": "gns_b_simple"}
# Params that do not change what is trained or are the world size itself: two runs whose other
# params are equal are "the same config" at different world sizes (for the speedup columns).
_NOT_CONFIG = ("name", "train.seed", "train.progress", "train.log_every", "train.save_params",
               "dist.workers", "dist.servers", "dist.kvstore", "dist.check_every")


def epoch_rows(histories: Mapping[str, Sequence[tuple[int, float]]]) -> list[dict[str, float]]:
    """Joins per-epoch metric histories ``{key: [(step, value)]}`` into one row per epoch.

    An epoch's metrics are all logged at the step at which it ended, so the rows are the steps
    of the ``train/epoch`` metric; a row holds ``step`` and every key logged at that step (the
    last value if one was logged twice). Keys logged per step (``train/lr``) must not be passed
    in.
    """
    steps = sorted({s for s, _ in histories.get("train/epoch", ())})
    by_key = {k: dict(v) for k, v in histories.items()}
    return [{"step": float(s), **{k: d[s] for k, d in by_key.items() if s in d}}
            for s in steps]


def run_final_error(rows: Sequence[Mapping[str, float]], last: int = 5) -> float | None:
    """:func:`final_error` over the evaluated epochs (all of them if fewer than ``last``)."""
    errors = [r["val/error_top1"] for r in rows if "val/error_top1" in r]
    return final_error(errors, last) if errors else None


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


def median_throughput(rows: Sequence[Mapping[str, float]],
                      key: str = "perf/images_per_sec") -> float | None:
    """Median over epochs of the global images/s (robust to a slow first epoch)."""
    values = [r[key] for r in rows if key in r]
    return float(statistics.median(values)) if values else None


def scaling(images_per_sec_k: float, images_per_sec_1: float, k: int) -> tuple[float, float]:
    """Speedup S = ips(k) / ips(1) and scaling efficiency E = S / k (1.0 is linear scaling)."""
    speedup = images_per_sec_k / images_per_sec_1
    return speedup, speedup / k


def convergence_speedup(seconds_1: float | None, seconds_k: float | None) -> float | None:
    """Time-to-target(1 worker) / time-to-target(k workers); None if either is unknown."""
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
    return mean_std([float(v) for v in values])  # type: ignore[arg-type]


def mean_curve(curves: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Pointwise mean of ``[(x, y)]`` curves over the x present in every curve."""
    if not curves:
        return []
    common = set.intersection(*({x for x, _ in c} for c in curves))
    maps = [dict(c) for c in curves]
    return [(x, statistics.fmean(m[x] for m in maps)) for x in sorted(common)]


def config_fingerprint(params: Mapping[str, str]) -> str:
    """sha256 of the params that define what is trained (world size, store, seed excluded;
    the plan's and the net's derived ``plan.*``/``net.*`` follow from the rest and the world)."""
    kept = sorted((k, v) for k, v in params.items()
                  if k not in _NOT_CONFIG and not k.startswith(("tracking.", "plan.", "net.")))
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


@dataclass(frozen=True)
class RunData:
    """One run of a sweep as read from MLflow (plain data).

    Attributes:
        rows: per-epoch metrics (:func:`epoch_rows`).
        lr: ``[(step, lr)]`` as logged (every ``log_every`` steps and at each epoch end).
    """

    run_id: str
    label: str
    seed: int
    status: str = "FINISHED"
    start_time: int = 0
    workers: int | None = None
    global_batch: int | None = None
    peak_lr: float | None = None
    config_hash: str = ""
    fingerprint: str = ""
    rows: tuple[Mapping[str, float], ...] = ()
    lr: tuple[tuple[int, float], ...] = ()
    gns: tuple[tuple[int, float], ...] = ()  # (step, gns/b_simple) when the run measured it
    loss: tuple[tuple[int, float], ...] = ()  # (step, train/loss) as logged
    sweep_target: str = ""  # the sweep's target (JSON tag), see mxlarge.study
    commit: str = ""  # the git commit the run was made at (tag ``git_commit``)
    diverged: str = ""  # a FAILED run stopped by divergence: the message (tag ``diverged``)


# "Far above" the noise scale: with McCandlish et al.'s model, steps S = S_min·(1 + B_noise/B)
# and examples E = E_min·(1 + B/B_noise). At B = 10·B_noise a larger batch can cut the steps by
# at most 1/11 (9%) more, while each example buys 11× less than at small batches.
FAR_ABOVE = 10.0
# Older runs logged an infinite B_simple before |G|² had a positive estimate; MLflow stores that
# as the largest float.
_NO_ESTIMATE = 1e300


def noise_scale_stages(points: Sequence[tuple[int, float]]) -> tuple[float, float, float] | None:
    """Median B_simple over the first, middle and last third of training (by step).

    The first 10% of the measurements are skipped: at initialisation |G|² is tiny and the
    estimate swings wildly.
    """
    values = [v for _, v in sorted(points) if 0 < v < _NO_ESTIMATE]
    values = values[len(values) // 10:]
    if len(values) < 3:
        return None
    third = len(values) // 3
    parts = (values[:third], values[third:2 * third], values[2 * third:])
    return tuple(float(statistics.median(p)) for p in parts)  # type: ignore[return-value]


def noise_scale_verdict(global_batch: int, stages: tuple[float, float, float]) -> str:
    """Where the global batch stands against B_simple over training."""
    far = [name for name, b in zip(("early", "middle", "late"), stages)
           if global_batch > FAR_ABOVE * b]
    if far:
        return (f"far above (> {FAR_ABOVE:g}× B_simple) {'/'.join(far)} in training: more "
                "workers buy little per step there")
    above = [name for name, b in zip(("early", "middle", "late"), stages) if global_batch > b]
    if above:
        return f"above B_simple {'/'.join(above)} in training, within {FAR_ABOVE:g}×"
    return "below B_simple throughout"


def noise_scale_markdown(runs: Sequence[RunData]) -> list[str]:
    """A section per sweep: B_simple early/middle/late next to each label's global batch."""
    rows = []
    for r in runs:
        stages = noise_scale_stages(r.gns)
        if stages is None or r.global_batch is None:
            continue
        rows.append(f"| {r.label} | {r.seed} | {r.global_batch} | "
                    + " | ".join(f"{b:.0f}" for b in stages)
                    + f" | {noise_scale_verdict(r.global_batch, stages)} |")
    if not rows:
        return []
    return ["## Gradient noise scale", "",
            "B_simple = tr(Σ)/|G|² (McCandlish et al. 2018), EMA-smoothed as logged "
            "(`gns/b_simple`); median over each third of the measurements after the first 10%. "
            f"\"Far above\" = global batch > {FAR_ABOVE:g}× B_simple: by the model S = "
            "S_min(1 + B_noise/B), E = E_min(1 + B/B_noise), a larger batch then saves at most "
            "9% of the steps while each example buys 11× less.", "",
            "| label | seed | global batch | B_simple early | middle | late | verdict |",
            "|" + "---|" * 7, *rows, ""]


def select_runs(runs: Sequence[RunData]) -> tuple[list[RunData], list[str]]:
    """The newest FINISHED run per (label, seed), and notes on every run left out.

    A cell re-run after a failure, or with a changed config, leaves older runs behind; they
    are named in the notes rather than silently averaged in.
    """
    used: dict[tuple[str, int], RunData] = {}
    for r in sorted(runs, key=lambda r: -r.start_time):
        if r.status == "FINISHED" and (r.label, r.seed) not in used:
            used[(r.label, r.seed)] = r
    notes, diverged = [], {r.run_id for r in diverged_runs(runs)}
    for r in sorted(runs, key=lambda r: (r.label, r.seed, r.start_time)):
        if used.get((r.label, r.seed)) is r:
            continue
        why = ("superseded by a newer FINISHED run" if (r.label, r.seed) in used
               else f"diverged ({r.diverged}): in the study a run that never reaches the "
                    "target, left out of the final-error numbers" if r.run_id in diverged
               else "no FINISHED run for this seed: left out of every number")
        notes.append(f"run {r.run_id[:8]} ({r.label}, seed {r.seed}) is {r.status}: {why}")
    ordered = sorted(used.values(), key=lambda r: r.start_time)
    return ordered, notes


def diverged_runs(runs: Sequence[RunData]) -> list[RunData]:
    """Per (label, seed) without a FINISHED run, the newest run that diverged (tag
    ``diverged``): a result of its configuration (it never reaches the target), not a crash."""
    finished = {(r.label, r.seed) for r in runs if r.status == "FINISHED"}
    newest: dict[tuple[str, int], RunData] = {}
    for r in sorted(runs, key=lambda r: -r.start_time):
        if (r.label, r.seed) not in finished and (r.label, r.seed) not in newest:
            newest[(r.label, r.seed)] = r
    return sorted((r for r in newest.values() if r.diverged), key=lambda r: r.start_time)


@dataclass(frozen=True)
class LabelRow:
    """The numbers of one label (group of seeds). Per-seed tuples follow ``seeds``."""

    label: str
    seeds: tuple[int, ...]
    missing_seeds: tuple[int, ...]
    workers: int | None
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


@dataclass(frozen=True)
class Summary:
    best_accuracy: float | None
    best_run: str | None
    target_fraction: float
    target: float | None
    rows: tuple[LabelRow, ...]


def _common(values: Sequence[Any]) -> Any:
    """The value all runs of a label share, or None if they differ."""
    distinct = set(values)
    return values[0] if len(distinct) == 1 else None


def summarize(runs: Sequence[RunData], target_fraction: float,
              missing: Mapping[str, Sequence[int]] | None = None,
              order: Sequence[str] = ()) -> Summary:
    """Per-label numbers of a sweep's selected runs (see :func:`render_markdown` for the rules).

    target = ``target_fraction`` × max over runs and epochs of ``val_accuracy``. The reference
    of a label is the first label in sweep order with world size 1 and the same
    :func:`config_fingerprint` (the label itself when it has world size 1).

    Args:
        runs: the selected FINISHED runs (:func:`select_runs`).
        target_fraction: the target as a fraction of the best accuracy.
        missing: label -> seeds without a FINISHED run; a label whose every seed failed still
            gets a row (with no numbers), so a failure is visible in the table.
        order: labels in sweep order (others follow in order of appearance).
    """
    best = max(((r["val/accuracy"], run) for run in runs for r in run.rows
                if "val/accuracy" in r), key=lambda t: t[0], default=(None, None))
    target = best[0] * target_fraction if best[0] is not None else None
    labels: dict[str, list[RunData]] = {}
    for run in runs:
        labels.setdefault(run.label, []).append(run)
    stats = {}
    for label, group in labels.items():
        group = sorted(group, key=lambda r: r.seed)
        ttt = [time_to_target(r.rows, target) if target is not None else None for r in group]
        ips = [v for v in (median_throughput(r.rows) for r in group) if v is not None]
        stats[label] = dict(
            group=group, ttt=ttt, ips=statistics.fmean(ips) if ips else None,
            workers=_common([r.workers for r in group]),
            fingerprint=_common([r.fingerprint for r in group]))
    rows = []
    names = list(dict.fromkeys([*order, *labels, *(missing or {})]))
    for label in names:
        if label not in stats:
            if label in (missing or {}):
                rows.append(LabelRow(
                    label=label, seeds=(), missing_seeds=tuple(sorted(missing[label])),
                    workers=None, global_batch=None, peak_lr=None, final_errors=(),
                    epochs_to_target=(), seconds_to_target=(), images_per_sec=None,
                    reference=None, speedup=None, efficiency=None, conv_speedup=None))
            continue
        s = stats[label]
        group = s["group"]
        ref = next((name for name, o in stats.items()
                    if o["workers"] == 1 and o["fingerprint"] is not None
                    and o["fingerprint"] == s["fingerprint"]), None)
        if s["workers"] == 1 and s["fingerprint"] is not None:
            ref = label
        speedup = efficiency = conv = None
        if ref is not None and s["workers"] is not None:
            o = stats[ref]
            if s["ips"] is not None and o["ips"]:
                speedup, efficiency = scaling(s["ips"], o["ips"], s["workers"])
            mine = all_reached([t[1] if t else None for t in s["ttt"]])
            theirs = all_reached([t[1] if t else None for t in o["ttt"]])
            conv = convergence_speedup(theirs[0] if theirs else None, mine[0] if mine else None)
        errors = [e for e in (run_final_error(r.rows) for r in group) if e is not None]
        rows.append(LabelRow(
            label=label, seeds=tuple(r.seed for r in group),
            missing_seeds=tuple(sorted((missing or {}).get(label, ()))),
            workers=s["workers"], global_batch=_common([r.global_batch for r in group]),
            peak_lr=_common([r.peak_lr for r in group]), final_errors=tuple(errors),
            epochs_to_target=tuple(t[0] if t else None for t in s["ttt"]),
            seconds_to_target=tuple(t[1] if t else None for t in s["ttt"]),
            images_per_sec=s["ips"], reference=ref, speedup=speedup, efficiency=efficiency,
            conv_speedup=conv, configs=len({r.fingerprint for r in group})))
    return Summary(best_accuracy=best[0], best_run=best[1].run_id if best[1] else None,
                   target_fraction=target_fraction, target=target, rows=tuple(rows))


# ---------------------------------------------------------------------------------------------
# rendering


def _pm(stat: tuple[float, float | None] | None, scale: float = 1.0, digits: int = 2) -> str:
    if stat is None:
        return "n/a"
    mean, std = stat
    sd = f"{std * scale:.{digits}f}" if std is not None else "n/a"
    return f"{mean * scale:.{digits}f} ± {sd}"


def _reached(values: Sequence[float | None], digits: int) -> str:
    hit = sum(v is not None for v in values)
    if hit == 0:
        return "not reached"
    if hit < len(values):
        return f"not reached by {len(values) - hit} of {len(values)} seeds"
    return _pm(all_reached(values), digits=digits)


def _ratio(row: LabelRow, value: float | None, fmt: str) -> str:
    if row.reference is None:
        return "n/a (no 1-worker run)"
    if row.reference == row.label:
        return "ref."
    return fmt.format(value) if value is not None else "n/a"


def markdown_table(summary: Summary) -> str:
    """The per-label table (GitHub markdown)."""
    head = ("| label | workers | global batch | peak LR | seeds | final error % (mean ± std) "
            "| epochs to target | train s to target | images/s | speedup | efficiency "
            "| conv.-adjusted speedup |")
    lines = [head, "|" + "---|" * 12]
    for r in summary.rows:
        if not r.seeds:
            lines.append(f"| {r.label} | n/a | n/a | n/a | none FINISHED (failed or unfinished: "
                         f"{','.join(map(str, r.missing_seeds))}) |" + " n/a |" * 7)
            continue
        seeds = ",".join(map(str, r.seeds))
        if r.missing_seeds:
            seeds += f" (no FINISHED run: {','.join(map(str, r.missing_seeds))})"
        err = _pm(mean_std(r.final_errors), scale=100) if r.final_errors else "n/a"
        lines.append(
            f"| {r.label} | {r.workers if r.workers is not None else 'mixed'} "
            f"| {r.global_batch if r.global_batch is not None else 'mixed'} "
            f"| {f'{r.peak_lr:.4g}' if r.peak_lr is not None else 'mixed'} | {seeds} | {err} "
            f"| {_reached(r.epochs_to_target, 1)} | {_reached(r.seconds_to_target, 1)} "
            f"| {f'{r.images_per_sec:.0f}' if r.images_per_sec is not None else 'n/a'} "
            f"| {_ratio(r, r.speedup, '{:.2f}×')} | {_ratio(r, r.efficiency, '{:.0%}')} "
            f"| {_ratio(r, r.conv_speedup, '{:.2f}×')} |")
    return "\n".join(lines)


def made_at(runs: Sequence[RunData]) -> str:
    """The commits the runs were made at, most runs first: "commit `abc…` (90 runs)"."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.commit or "unknown"] = counts.get(r.commit or "unknown", 0) + 1
    parts = [f"`{c[:12]}` ({n} run{'s' if n != 1 else ''})"
             for c, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return ("commit " if len(parts) == 1 else "commits ") + ", ".join(parts)


def render_markdown(name: str, summary: Summary, runs: Sequence[RunData], notes: Sequence[str],
                    meta: Mapping[str, str], images: Sequence[str], study: str = "") -> str:
    """report.md: the table, the study section if any, how each number is computed, the
    per-run numbers and the plots."""
    s = summary
    if s.target is None:
        target = "no run logged `val_accuracy`: no target."
    else:
        target = (f"target = {s.target_fraction:g} × best validation accuracy in the sweep "
                  f"({s.best_accuracy:.4f}, run {s.best_run[:8] if s.best_run else '?'}) = "
                  f"**{s.target:.4f}**.")
    out = [f"# Sweep `{name}`", "",
           f"{len(runs)} FINISHED run(s) from experiment `{meta.get('experiment', '')}` at "
           f"`{meta.get('uri', '')}`; written {meta.get('written', '')}"
           + (f" at commit `{meta['commit'][:12]}`" if meta.get("commit") else "")
           + (f"; summary run `{meta['summary_run']}`." if meta.get("summary_run") else "."),
           "", "Runs made at " + (meta.get("made_at") or made_at(runs)) + ".",
           "", target, "", markdown_table(s), "", *([study] if study else []),
           "## How the numbers are computed", "",
           "- **final error**: per run, the median of the last 5 evaluated epochs' "
           "`val/error_top1` (all of them if fewer than 5), as in Goyal et al.; then mean ± "
           "**sample** standard deviation (n − 1) over seeds (± n/a with one seed).",
           "- **epochs / train s to target**: per run, the first evaluated epoch whose "
           "`val_accuracy` ≥ target (no interpolation between evaluations), and the cumulative "
           "`train_seconds` at its end (training steps only: evaluation, start-up and logging "
           "are excluded); mean ± sample std over seeds, shown only if every seed reached the "
           "target, else \"not reached\".",
           "- **images/s**: per run, the median over epochs of `perf/images_per_sec` (the sum "
           "of every worker's own measured rate); mean over seeds.",
           "- **speedup** = images/s ÷ images/s of the 1-worker run (param `plan.workers` = 1) of "
           "the same config (all params equal except world size, store, seed and logging); "
           "**efficiency** = speedup ÷ workers; **conv.-adjusted speedup** = train s to target "
           "(1 worker) ÷ train s to target (k workers). \"ref.\" marks the 1-worker run itself; "
           "n/a when there is none or a time to target is missing.",
           "- Each (label, seed) uses its newest FINISHED run; runs left out are listed below.",
           ""]
    mixed = [r.label for r in s.rows if r.configs > 1]
    if mixed:
        out += [f"**Warning**: labels whose seeds ran different configs (params other than "
                f"the seed, world size and logging differ): {', '.join(mixed)}.", ""]
    out += ["## Runs", "", "| label | seed | run | final error % | best accuracy "
            "| epoch to target | train s to target | images/s |", "|" + "---|" * 8]
    for r in runs:
        fe = run_final_error(r.rows)
        best = max((x["val/accuracy"] for x in r.rows if "val/accuracy" in x), default=None)
        t = time_to_target(r.rows, s.target) if s.target is not None else None
        ips = median_throughput(r.rows)
        secs = "not reached" if t is None else (f"{t[1]:.1f}" if t[1] is not None else "n/a")
        out.append(f"| {r.label} | {r.seed} | `{r.run_id[:8]}` "
                   f"| {f'{100 * fe:.2f}' if fe is not None else 'n/a'} "
                   f"| {f'{best:.4f}' if best is not None else 'n/a'} "
                   f"| {f'{t[0]:g}' if t else 'not reached'} "
                   f"| {secs} "
                   f"| {f'{ips:.0f}' if ips is not None else 'n/a'} |")
    out += [""] + noise_scale_markdown(runs)
    out += ["## Runs left out", ""] + ([f"- {n}" for n in notes] or ["none"]) + [""]
    out += ["## Plots", ""] + [f"![{Path(i).stem}]({i})" for i in images] + [""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# plots


def _by_label(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(r.label, []).append(r)
    return out


def plot_val_error(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Validation top-1 error vs epoch, mean over seeds, one curve per label (Goyal Fig. 2)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, group) in enumerate(_by_label(runs).items()):
        curve = mean_curve([[(x["train/epoch"], 100 * x["val/error_top1"]) for x in r.rows
                             if "train/epoch" in x and "val/error_top1" in x] for r in group])
        if curve:
            ax.plot(*zip(*curve), label=f"{label} (n={len(group)})", lw=2.2 if i == 0 else 1.4,
                    color="black" if i == 0 else None)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation top-1 error (%), mean over seeds")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title or "validation error")
    save(fig, path)


def plot_error_vs_batch(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Final error vs global batch: one dot per seed, mean ± sample std per label.

    Labels are dodged sideways by a factor 2^(0.05·i) so that those sharing a batch stay
    readable; the axis is log2, so the true batch is the nearest tick.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups = _by_label(runs)
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
    ax.set_yscale("log")  # a diverged label at 60 % must not flatten the 1-4 % differences
    ax.set_xlabel("global batch (param plan.global_batch)")
    ax.set_ylabel("final top-1 error (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(title or "final error vs global batch")
    save(fig, path)


def plot_loss_lr(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """Per label, for its lowest seed: training loss and the LR, as logged per step, vs step."""
    plt = pyplot()
    groups = _by_label(runs)
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
    if title:
        fig.suptitle(title)
    save(fig, path)


# ---------------------------------------------------------------------------------------------
# reading MLflow and writing the report


def plot_noise_scale(runs: Sequence[RunData], path: str | Path, title: str = "") -> None:
    """B_simple over steps (one seed per label) with each label's global batch as a line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, group in _by_label(runs).items():
        r = next((x for x in group if x.gns), None)
        # the estimate is negative or infinite while |G|² is still estimated <= 0
        pts = sorted((s, v) for s, v in (r.gns if r else ()) if 0 < v < _NO_ESTIMATE)
        if not pts:
            continue
        steps, values = zip(*pts)
        line, = ax.plot(steps, values, label=f"{label}: B_simple")
        if r.global_batch:
            ax.axhline(r.global_batch, ls="--", color=line.get_color(), lw=1,
                       label=f"{label}: global batch {r.global_batch}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("batch size (images)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    save(fig, path)


def metric_names(logged: Mapping[str, float]) -> dict[str, str]:
    """``{name: key it is stored under}`` of a run whose latest metrics are ``logged``: the
    current names, or :data:`LEGACY_METRICS`' for a run written before them."""
    legacy = "train/epoch" not in logged and "epoch" in logged
    return {k: LEGACY_METRICS.get(k, k) if legacy else k
            for k in (*EPOCH_KEYS, "train/loss", "train/lr", "gns/b_simple")}


def run_final_error_of(uri: str, run_id: str) -> float | None:
    """:func:`final_error` of a run in the store, whichever names it was written with."""
    from mxlarge import tracking

    names = metric_names(tracking.client(uri).get_run(run_id).data.metrics)
    errors = [v for _, v in tracking.metric_history(uri, run_id, names["val/error_top1"])]
    return final_error(errors) if errors else None


def _plan_value(params: Mapping[str, str], tags: Mapping[str, str], key: str) -> str | None:
    """The plan's ``key``: param ``plan.KEY``, or the tag ``KEY`` of runs made before."""
    return params.get(f"plan.{key}", tags.get(key))


def load_sweep_runs(uri: str, experiment: str, name: str) -> list[RunData]:
    """Every run tagged ``sweep=name`` (summary runs excluded), histories for FINISHED ones,
    read under the current metric names (:func:`metric_names`)."""
    from mxlarge import tracking

    out = []
    for rec in tracking.find_runs(uri, experiment, {"sweep": name}):
        tags, params = rec["tags"], rec["params"]
        if tags.get("summary") == "true" or "sweep_label" not in tags or "seed" not in tags:
            continue
        finished = rec["status"] == "FINISHED"
        rows: list[dict[str, float]] = []
        series: dict[str, list[tuple[int, float]]] = {}
        if finished:
            names = metric_names(rec["metrics"])
            rows = epoch_rows({k: tracking.metric_history(uri, rec["run_id"], names[k])
                               for k in EPOCH_KEYS})
            series = {k: tracking.metric_history(uri, rec["run_id"], names[k])
                      for k in ("train/loss", "train/lr", "gns/b_simple")}
        peak_lr = _plan_value(params, tags, "peak_lr")
        out.append(RunData(
            run_id=rec["run_id"], label=tags["sweep_label"], seed=int(tags["seed"]),
            status=rec["status"], start_time=int(rec["start_time"]),
            workers=_int_tag(_plan_value(params, tags, "workers")),
            global_batch=_int_tag(_plan_value(params, tags, "global_batch")),
            peak_lr=float(peak_lr) if peak_lr is not None else None,
            config_hash=tags.get("config_hash", ""), fingerprint=config_fingerprint(params),
            rows=tuple(rows), lr=tuple(series.get("train/lr", ())),
            gns=tuple(series.get("gns/b_simple", ())), loss=tuple(series.get("train/loss", ())),
            sweep_target=tags.get("sweep_target", ""),
            commit=tags.get("git_commit") or tags.get("mlflow.source.git.commit", ""),
            diverged=tags.get("diverged", "") if rec["status"] == "FAILED" else ""))
    return out


def _int_tag(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def metric_key(text: str) -> str:
    """``text`` with what MLflow refuses in a metric name (it keeps letters, digits, ``_``,
    ``-``, ``.``, space and ``:``; ``/`` starts a UI section) replaced by ``_``."""
    return re.sub(r"[^\w\-. :]", "_", text)


def label_metrics(summary: Summary, runs: Sequence[RunData]) -> dict[str, float]:
    """The per-label numbers of the report as metrics of the sweep's parent run, one UI section
    per label: ``LABEL/final_error`` (mean over seeds) and ``LABEL/final_error_std`` (sample
    std, 2+ seeds), ``LABEL/best_accuracy`` (over its seeds and epochs), ``LABEL/seeds``
    (FINISHED), ``LABEL/images_per_sec``, ``LABEL/speedup``, ``LABEL/efficiency`` (when known).
    """
    out: dict[str, float] = {}
    for row in summary.rows:
        if not row.seeds:
            continue
        key = metric_key(row.label)
        values = {"seeds": float(len(row.seeds)), "images_per_sec": row.images_per_sec,
                  "speedup": row.speedup, "efficiency": row.efficiency}
        if row.final_errors:
            values["final_error"], values["final_error_std"] = mean_std(row.final_errors)
        values["best_accuracy"] = max((x["val/accuracy"] for r in runs if r.label == row.label
                                       for x in r.rows if "val/accuracy" in x), default=None)
        out.update({f"{key}/{k}": float(v) for k, v in values.items() if v is not None})
    return out


def parent_description(name: str, summary: Summary) -> str:
    """The sweep parent's description once reported: the per-label table and the target."""
    target = (f"target accuracy {summary.target:.4f} ({summary.target_fraction:g} × best)"
              if summary.target is not None else "no target")
    return "\n".join([f"**sweep {name}**: {target}; the full report is the artifact "
                      "`report.md`.", "", markdown_table(summary)])


def write_report(name: str, out_dir: str | Path, target_fraction: float = 0.99,
                 experiment: str | None = None, uri: str | None = None) -> Path:
    """Writes report.md, report.json and PNGs of sweep ``name`` into ``out_dir`` and logs them
    to the sweep's parent run (else to a new summary run tagged ``sweep=name``,
    ``summary=true``), with the table as its description and :func:`label_metrics`. Returns
    report.md's path.

    Raises:
        ConfigError: if MLflow holds no FINISHED run of the sweep.
    """
    from mxlarge import tracking
    from mxlarge.config import Config, ConfigError

    uri = uri or tracking.tracking_uri(Config())
    experiment = experiment or tracking.experiment_name(Config())
    runs = load_sweep_runs(uri, experiment, name)
    used, notes = select_runs(runs)
    if not used:
        raise ConfigError(f"no FINISHED run tagged sweep={name} in experiment '{experiment}' "
                          f"at {uri} ({len(runs)} unfinished)")
    missing: dict[str, list[int]] = {}
    for r in runs:
        if not any(u.label == r.label and u.seed == r.seed for u in used):
            missing.setdefault(r.label, []).append(r.seed)
    missing = {k: sorted(set(v)) for k, v in missing.items()}
    order = [r.label for r in sorted(runs, key=lambda r: r.start_time)]
    summary = summarize(used, target_fraction, missing, order)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    facts = {"target_fraction": target_fraction, "target_accuracy": summary.target,
             "runs_used": len(used), "labels": ", ".join(r.label for r in summary.rows)}
    # The sweep's parent run holds the report (the MLflow UI shows it above its cells); it was
    # opened and ended by `mxlarge sweep`, so it is only logged to here. Sweeps made before
    # parent runs existed get a summary run of their own, opened and ended here.
    parent = tracking.find_sweep_parent(uri, experiment, name)
    owned = None
    if parent is not None:
        run = parent
        run.tag({f"report_{k}": v for k, v in facts.items()})
    else:
        owned = run = tracking.RunHandle.create_plain(
            uri, experiment, {"sweep": name, "summary": "true",
                              "mlflow.runName": f"{name} report"}, facts)
    ok = False
    try:
        images = ["val_error.png", "final_error_vs_batch.png", "loss_lr.png"]
        plot_val_error(used, out / images[0], f"{name}: validation error")
        plot_error_vs_batch(used, out / images[1], f"{name}: final error vs global batch")
        plot_loss_lr(used, out / images[2], f"{name}: training loss and LR (one seed per label)")
        if any(r.gns for r in used):
            images.append("noise_scale.png")
            plot_noise_scale(used, out / images[-1], f"{name}: gradient noise scale")
        # diverged runs are results of the study (never reaching the target), not gaps
        diverged = diverged_runs(runs)
        study_md = _study([*used, *diverged], order, out, name, images)
        meta = {"experiment": experiment, "uri": uri, "summary_run": run.run_id,
                "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "commit": tracking.git_commit(), "made_at": made_at([*used, *diverged])}
        (out / "report.md").write_text(render_markdown(name, summary, used, notes, meta, images,
                                                       study_md))
        (out / "report.json").write_text(json.dumps(
            {"sweep": name, **meta, "summary": dataclasses.asdict(summary), "notes": notes,
             "runs": {r.run_id: {"label": r.label, "seed": r.seed, "commit": r.commit}
                      for r in used}},
            indent=2, default=str))
        run.log_artifacts([out / "report.md", out / "report.json", *(out / i for i in images)])
        run.tag({"mlflow.note.content": parent_description(name, summary)})
        run.log_metrics(label_metrics(summary, used), 0)
        ok = True
    finally:
        if owned is not None:
            owned.end(ok)
    return out / "report.md"


def _study(used: Sequence[RunData], order: Sequence[str], out: Path, name: str,
           images: list[str]) -> str:
    """The study section (mxlarge.study) and its plot when the sweep fixed a target, else ''."""
    from mxlarge import study

    target = study.target_from_runs(used)
    if target is None:
        return ""
    rows = study.rows(used, target, order)
    images.append("study.png")
    study.plot(rows, out / images[-1], f"{name}: final error and steps to target vs batch")
    return "\n".join(study.markdown(rows, target))


def report_command(args: Any) -> int:
    """``mxlarge report NAME [--out DIR] [--target-fraction F] [--experiment E]``."""
    from mxlarge import tracking
    from mxlarge.config import Config, ConfigError

    if getattr(args, "overrides", None):
        raise ConfigError(f"report: unexpected arguments {' '.join(args.overrides)}")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.name):
        raise ConfigError(f"report: NAME = {args.name!r}: expected a sweep name (letters, "
                          "digits, '.', '_', '-')")
    if not 0 < args.target_fraction <= 1:
        raise ConfigError(f"report: --target-fraction = {args.target_fraction}: expected a "
                          "number in (0, 1]")
    uri = tracking.tracking_uri(Config())
    tracking.check_reachable(uri)
    path = write_report(args.name, args.out or Path("reports") / args.name,
                        args.target_fraction, args.experiment, uri)
    text = path.read_text()
    for head in ("| label |", "| label | global batch | B_simple"):
        if head in text:
            start = text.index(head)
            print(text[start:text.index("\n\n", start)] + "\n")
    print(f"report: {path} (and PNGs beside it), logged to the sweep's MLflow run in {uri}")
    run = tracking.find_sweep_parent(uri, args.experiment or tracking.experiment_name(Config()),
                                     args.name)
    if run is not None:
        print(f"MLflow sweep run {run.run_id}: {tracking.ui_hint(uri, run.run_id)}")
    return 0
