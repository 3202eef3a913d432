"""The report's share of a step spent waiting for the exchange, per label."""
from __future__ import annotations

import pytest

from mxlarge.reporting.runs import RunData
from mxlarge.reporting.summary import summarize
from mxlarge.reporting.tables import markdown_table, render_markdown


def _run(label: str, seed: int, workers: int, ips: float, waits: list[float] | None) -> RunData:
    rows = []
    for e in range(3):
        row = {"step": 10.0 * (e + 1), "train/epoch": float(e + 1), "val/accuracy": 0.9,
               "val/error_top1": 0.1, "perf/train_seconds": 10.0 * (e + 1),
               "perf/images_per_sec": ips}
        if waits is not None:
            row["breakdown/wait_share"] = waits[e]
        rows.append(row)
    return RunData(run_id=f"{label}-{seed}".ljust(32, "0"), label=label, seed=seed,
                   status="FINISHED", start_time=0, workers=workers, global_batch=64,
                   peak_lr=0.1, fingerprint="same", rows=tuple(rows), commit=None)


def test_waiting_is_the_mean_over_seeds_of_each_runs_median_over_epochs():
    """k1: one process, no exchange (n/a); k2: seed 0 medians 0.20, seed 1 0.30 -> 25%,
    efficiency 1800 / (2 x 1000) = 90% next to it."""
    runs = [_run("k1", 0, 1, 1000.0, None),
            _run("k2", 0, 2, 1800.0, [0.5, 0.2, 0.1]),
            _run("k2", 1, 2, 1800.0, [0.3, 0.4, 0.2])]
    s = summarize(runs, 0.99)
    by = {r.label: r for r in s.rows}
    assert by["k1"].waiting is None
    assert by["k2"].waiting == pytest.approx(0.25)
    assert by["k2"].efficiency == pytest.approx(0.9)
    table = markdown_table(s)
    head, _, k1, k2 = table.splitlines()
    assert head.endswith("| efficiency | conv.-adjusted speedup | waiting for the exchange |")
    assert k1.endswith("| n/a |") and k2.endswith("| 25% |")
    assert "| 90% vs k1 |" not in k2 and "90%" in k2
    assert "**waiting for the exchange**" in render_markdown("s", s, runs, [], {}, [])
