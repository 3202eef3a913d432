"""Reads of the store for sweeps and reports (:mod:`mxlarge.sweep`, :mod:`mxlarge.reporting`):
plain data in and out, no MLflow objects."""
from __future__ import annotations

from typing import Any

from mxlarge.tracking.store import client


def find_runs(uri: str, experiment: str, tags: dict[str, str],
              status: str | None = None) -> list[dict[str, Any]]:
    """Runs of ``experiment`` whose tags equal ``tags`` (and whose status is ``status``).

    Values without quotes go into the MLflow filter (fewer rows read); every condition is also
    checked here, so labels with quotes or spaces still match exactly.

    Returns:
        ``[{"run_id", "status", "start_time" (ms), "tags", "params", "metrics" (latest
        values)}]``, newest first; an
        empty list if the experiment does not exist.
    """
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()
               if "'" not in v and "`" not in k]
    if status is not None:
        clauses.append(f"attributes.status = '{status}'")
    out: list[dict[str, Any]] = []
    token = None
    while True:
        page = c.search_runs([exp.experiment_id], filter_string=" and ".join(clauses),
                             max_results=1000, order_by=["attributes.start_time DESC"],
                             page_token=token)
        for r in page:
            if status is not None and r.info.status != status:
                continue
            if any(r.data.tags.get(k) != v for k, v in tags.items()):
                continue
            out.append({"run_id": r.info.run_id, "status": r.info.status,
                        "start_time": r.info.start_time or 0, "tags": dict(r.data.tags),
                        "params": dict(r.data.params), "metrics": dict(r.data.metrics)})
        token = page.token
        if not token:
            return out


def latest_metrics(uri: str, run_id: str) -> dict[str, float]:
    """``{key: latest value}`` of every metric of one run."""
    return dict(client(uri).get_run(run_id).data.metrics)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric, ordered by step then logging time."""
    hist = client(uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
