"""Every markdown of a report: report.md (:func:`render_markdown`), the per-label table that the
sweep's parent run shows as its description, the noise-scale and the study sections.

Text only: the numbers come from :mod:`~mxlarge.reporting.summary` and
:mod:`~mxlarge.reporting.study`, and each section states how its numbers are computed next to
them, so a reader of report.md needs no source.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from mxlarge import stats
from mxlarge.reporting.runs import RunData
from mxlarge.reporting.study import StudyRow, Target
from mxlarge.reporting.summary import (
    FAR_ABOVE,
    LabelRow,
    Summary,
    all_reached,
    best_accuracy,
    epoch_median,
    mean_std,
    noise_scale_stages,
    run_final_error,
    time_to_target,
)


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


def _ratio(row: LabelRow, value: float | None, fmt: str, said: bool = False) -> str:
    """``value`` against the label's reference (``said``: naming it), "ref." for the reference
    itself."""
    if row.reference is None:
        return "n/a (seeds differ in config or world)"
    if row.reference == row.label:
        return "ref."
    if value is None:
        return "n/a"
    return fmt.format(value) + (f" vs {row.reference}" if said else "")


def workers_cell(row: LabelRow) -> str:
    """The workers k of ``row`` and, when not all processes, what they are: ``2``,
    ``16 simulated``, ``4 devices``, ``8 (2 × 4 simulated)``; "mixed" when seeds differ."""
    if row.shape is None or row.workers is None:
        return "mixed"
    processes, devices, simulated = row.shape
    parts = [f"{n} {what}" for n, what in ((devices, "devices"), (simulated, "simulated"))
             if n > 1]
    if not parts:
        return str(row.workers)
    if processes == 1 and len(parts) == 1:
        return parts[0]
    return f"{row.workers} ({' × '.join([str(processes), *parts])})"


def markdown_table(summary: Summary) -> str:
    """The per-label table (GitHub markdown)."""
    head = ("| label | workers | global batch | peak LR | seeds | final error % (mean ± std) "
            "| epochs to target | train s to target | images/s (median) | speedup | efficiency "
            "| conv.-adjusted speedup | waiting for the exchange |")
    lines = [head, "|" + "---|" * 13]
    for r in summary.rows:
        if not r.seeds:
            lines.append(f"| {r.label} | n/a | n/a | n/a | none FINISHED (failed or unfinished: "
                         f"{','.join(map(str, r.missing_seeds))}) |" + " n/a |" * 8)
            continue
        seeds = ",".join(map(str, r.seeds))
        if r.missing_seeds:
            seeds += f" (no FINISHED run: {','.join(map(str, r.missing_seeds))})"
        err = _pm(mean_std(r.final_errors), scale=100) if r.final_errors else "n/a"
        lines.append(
            f"| {r.label} | {workers_cell(r)} "
            f"| {r.global_batch if r.global_batch is not None else 'mixed'} "
            f"| {f'{r.peak_lr:.4g}' if r.peak_lr is not None else 'mixed'} | {seeds} | {err} "
            f"| {_reached(r.epochs_to_target, 1)} | {_reached(r.seconds_to_target, 1)} "
            f"| {f'{r.images_per_sec:.0f}' if r.images_per_sec is not None else 'n/a'} "
            f"| {_ratio(r, r.speedup, '{:.2f}×', said=True)} "
            f"| {_ratio(r, r.efficiency, '{:.0%}')} "
            f"| {_ratio(r, r.conv_speedup, '{:.2f}×')} "
            f"| {f'{r.waiting:.0%}' if r.waiting is not None else 'n/a'} |")
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
           "- **images/s (median)**: per run, the median over epochs of `perf/images_per_sec` "
           "(the sum of every worker's own measured rate), which the run logs as "
           "`perf/images_per_sec_median`; mean over seeds.",
           "- **workers**: gradient contributors k = processes × devices × simulated workers "
           "(params `plan.workers`, `plan.devices_per_worker`, `plan.simulated_workers`).",
           "- **speedup** = images/s ÷ images/s of the reference: the label of the same config "
           "(all params equal except the world's `dist.*`, seed and logging) with the fewest "
           "workers k_ref, the first in sweep order among equals; **efficiency** = speedup ÷ "
           "(k ÷ k_ref); **conv.-adjusted speedup** = train s to target (reference) ÷ train s "
           "to target (k workers). \"ref.\" marks the reference itself; n/a when a label's seeds "
           "differ in config or world, or a time to target is missing.",
           "- **waiting for the exchange**: per run, the median over epochs of "
           "`breakdown/wait_share` (Σ over ranks of the time a sampled step waits for the summed "
           "gradients ÷ Σ of their steps: docs/breakdown.md), mean over seeds; what scaling "
           "efficiency loses to the exchange and to the slowest rank; n/a for one-process runs "
           "(no exchange).",
           "- Each (label, seed) uses its newest FINISHED run; runs left out are listed below.",
           ""]
    mixed = [r.label for r in s.rows if r.configs > 1]
    if mixed:
        out += [f"**Warning**: labels whose seeds ran different configs (params other than "
                f"the seed, world size and logging differ): {', '.join(mixed)}.", ""]
    out += ["## Runs", "", "| label | seed | run | final error % | best accuracy "
            "| epoch to target | train s to target | images/s (median) |", "|" + "---|" * 8]
    for r in runs:
        fe = run_final_error(r.rows)
        best = best_accuracy(r.rows)
        t = time_to_target(r.rows, s.target) if s.target is not None else None
        ips = epoch_median(r.rows, "perf/images_per_sec")
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


def description_table(summary: Summary) -> str:
    """The per-label table of the sweep parent's description: what fits the MLflow UI's
    description column (label, workers, global batch, final error, images/s, speedup); the
    full table is report.md's (:func:`markdown_table`)."""
    lines = ["| label | workers | batch | final error % | images/s | speedup |",
             "|---|---|---|---|---|---|"]
    for r in summary.rows:
        if not r.seeds:
            lines.append(f"| {r.label} | | | none FINISHED | | |")
            continue
        err = _pm(mean_std(r.final_errors), scale=100) if r.final_errors else "n/a"
        lines.append(
            f"| {r.label} | {workers_cell(r)} "
            f"| {r.global_batch if r.global_batch is not None else 'mixed'} | {err} "
            f"| {f'{r.images_per_sec:.0f}' if r.images_per_sec is not None else 'n/a'} "
            f"| {_ratio(r, r.speedup, '{:.2f}×', said=True)} |")
    return "\n".join(lines)


def parent_description(name: str, summary: Summary,
                       images: Sequence[tuple[str, str]] = ()) -> str:
    """The sweep parent's description once reported: the target, the labels compared (the
    first of ``images``, ``(caption, address)`` pairs), :func:`description_table`, then the
    report's other plots; each image with its caption below it (MLflow's page drops an
    image's alt text)."""
    target = (f"target accuracy {summary.target:.4f} ({summary.target_fraction:g} × best)"
              if summary.target is not None else "no target")
    shown = [f"![{caption}]({src})\n*{caption}*" for caption, src in images]
    return "\n\n".join([f"**sweep {name}**: {target}; the full report is the artifact "
                         "`report.md`.", *shown[:1], description_table(summary), *shown[1:]])


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
                     and r.final_errors), key=lambda r: r.global_batch or 0)
    if target.error is None or not recipe:
        return []
    ref_mean = target.error - target.tolerance
    held = []
    largest = None
    all_so_far = True
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


def study_markdown(study: Sequence[StudyRow], target: Target) -> list[str]:
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
            mean, sd = mean_std(r.final_errors)
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
