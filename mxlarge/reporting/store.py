"""The MLflow reads of a report, through :mod:`mxlarge.tracking`: a sweep's runs as
:class:`~mxlarge.reporting.runs.RunData`, and one run's final error for ``mxlarge sweep``.

Apart from :mod:`~mxlarge.reporting.runs` so that the pure modules (the plots among them,
which training passes to :class:`mxlarge.tracking.MLflowHook`) never reach the store
(``tests/test_structure.py``).
"""
from __future__ import annotations

from collections.abc import Mapping

from mxlarge import tracking
from mxlarge.reporting.runs import EPOCH_KEYS, RunData, config_fingerprint, epoch_rows, metric_names
from mxlarge.stats import final_error


def run_final_error_of(uri: str, run_id: str) -> float | None:
    """:func:`final_error` of a run in the store, whichever names it was written with."""
    names = metric_names(tracking.latest_metrics(uri, run_id))
    errors = [v for _, v in tracking.metric_history(uri, run_id, names["val/error_top1"])]
    return final_error(errors) if errors else None


def _plan_value(params: Mapping[str, str], tags: Mapping[str, str], key: str) -> str | None:
    """The plan's ``key``: param ``plan.KEY``, or the tag ``KEY`` of runs made before."""
    return params.get(f"plan.{key}", tags.get(key))


def load_sweep_runs(uri: str, experiment: str, name: str) -> list[RunData]:
    """Every run tagged ``sweep=name`` (summary runs excluded), histories for FINISHED ones,
    read under the current metric names (:func:`metric_names`)."""
    out = []
    for rec in tracking.find_runs(uri, experiment, {"sweep": name}):
        tags = rec["tags"]
        params = rec["params"]
        if tags.get("summary") == "true" or "sweep_label" not in tags or "seed" not in tags:
            continue
        finished = rec["status"] == "FINISHED"
        series: dict[str, list[tuple[int, float]]] = {}
        if finished:
            series = {k: tracking.metric_history(uri, rec["run_id"], stored)
                      for k, stored in metric_names(rec["metrics"]).items()}
        rows = epoch_rows({k: series[k] for k in EPOCH_KEYS}) if finished else []
        peak_lr = _plan_value(params, tags, "peak_lr")
        out.append(RunData(
            run_id=rec["run_id"], label=tags["sweep_label"], seed=int(tags["seed"]),
            status=rec["status"], start_time=int(rec["start_time"]),
            workers=_int_tag(_plan_value(params, tags, "workers")),
            devices=_int_tag(_plan_value(params, tags, "devices_per_worker")) or 1,
            simulated=_int_tag(_plan_value(params, tags, "simulated_workers")) or 1,
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

