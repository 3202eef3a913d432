"""``mxlarge report NAME``: report.md, report.json and the PNGs of a sweep, written to a folder and
logged to the sweep's parent run in MLflow.

The parent run holds the report because the MLflow UI shows it above the sweep's cells: its
description is the labels compared in one picture (``compare.png``), the per-label table and
the report's other plots, shown from its artifacts (no per-label metrics: the UI draws each
metric as a chart of its own, a bar per label with a scale per bar); a sweep made before parent
runs existed gets a summary run of its own. The folder is ``REPORTS_DIR/NAME`` unless
``--out`` says otherwise.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlarge import tracking
from mxlarge.config import Config, ConfigError
from mxlarge.reporting import study
from mxlarge.reporting.plots import (
    plot_compare,
    plot_error_vs_batch,
    plot_loss_lr,
    plot_noise_scale,
    plot_study,
    plot_val_error,
)
from mxlarge.reporting.runs import RunData, diverged_runs, select_runs
from mxlarge.reporting.store import load_sweep_runs
from mxlarge.reporting.summary import summarize
from mxlarge.reporting.tables import made_at, parent_description, render_markdown, study_markdown

# `mxlarge report NAME` writes into REPORTS_DIR/NAME unless given --out (relative to the cwd).
REPORTS_DIR = Path("reports")
# What the sweep parent's description says under each plot.
CAPTIONS = {"compare.png": "the labels side by side: {labels}",
            "val_error.png": "validation error by epoch",
            "final_error_vs_batch.png": "final error vs global batch",
            "loss_lr.png": "training loss and LR",
            "noise_scale.png": "gradient noise scale",
            "study.png": "final error and steps to target vs global batch"}


def write_report(name: str, out_dir: str | Path, target_fraction: float = 0.99,
                 experiment: str | None = None, uri: str | None = None) -> Path:
    """Writes report.md, report.json and PNGs of sweep ``name`` into ``out_dir`` and logs them
    to the sweep's parent run (else to a new summary run tagged ``sweep=name``,
    ``summary=true``), with the comparison, the table and the plots as its description
    (:func:`~mxlarge.reporting.tables.parent_description`). Returns report.md's path.

    Raises:
        ConfigError: if MLflow holds no FINISHED run of the sweep.
    """
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
        run = tracking.RunHandle.create_plain(
            uri, experiment, {"sweep": name, "summary": "true",
                              "mlflow.runName": f"{name} report"}, facts)
        owned = run
    ok = False
    try:
        images = ["compare.png", "val_error.png", "final_error_vs_batch.png", "loss_lr.png"]
        plot_compare(summary, used, out / images[0], f"{name}: the labels compared")
        plot_val_error(used, out / images[1], f"{name}: validation error")
        plot_error_vs_batch(used, out / images[2], f"{name}: final error vs global batch")
        plot_loss_lr(used, out / images[3], f"{name}: training loss and LR (one seed per label)")
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
        shown = [(CAPTIONS[i].format(labels=facts["labels"]),
                  tracking.artifact_src(run.run_id, i)) for i in images]
        run.tag({"mlflow.note.content": parent_description(name, summary, shown)})
        ok = True
    finally:
        if owned is not None:
            owned.end(ok)
    return out / "report.md"


def _study(used: Sequence[RunData], order: Sequence[str], out: Path, name: str,
           images: list[str]) -> str:
    """The study section (:mod:`mxlarge.reporting.study`) and its plot when the sweep fixed a
    target, else ''."""
    target = study.target_from_runs(used)
    if target is None:
        return ""
    rows = study.rows(used, target, order)
    images.append("study.png")
    plot_study(rows, out / images[-1], f"{name}: final error and steps to target vs batch")
    return "\n".join(study_markdown(rows, target))


def report_command(args: Any) -> int:
    """``mxlarge report NAME [--out DIR] [--target-fraction F] [--experiment E]``."""
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
    path = write_report(args.name, args.out or REPORTS_DIR / args.name,
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
