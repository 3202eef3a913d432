"""Benchmark 8: step-time cost of the stall watchdog's heartbeat.

Ratio = seconds per step of ``TrainLoop.train_step`` with ``mxlarge.Trainer``'s heartbeat ÷
without it, measured in the same worker of one launched 1 worker + 1 server dist_sync job,
interleaved (:mod:`benchmarks.heartbeat_worker`, whose docstring says what is in both modes).
Hybridized ``cifar_resnet20_v1``, batch 32. Target ≤ 1.01.
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, median, mmm, ratios_of


def run(reps: int = 21, steps: int = 10, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    job = launch("benchmarks.heartbeat_worker", ["--reps", str(reps), "--steps", str(steps)],
                 workers=1, servers=1, log=log, bar=bar)[0]
    t = job["sec_per_step"]
    ratio = Ratio("heartbeat_cost", "step time with the stall-watchdog heartbeat ÷ without",
                  ratios_of(t["heartbeat"], t["off"]), target=1.01, higher_is_better=False,
                  note=f"{job['net']}, batch {job['batch']}, dist_sync 1 worker + 1 server, "
                       f"{steps} steps per round")
    md = md_table(["mode", "ms/step (min / median / max)"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.1f}")] for k in ("heartbeat", "off")])
    md += (f"\n\nThe heartbeat's own work per update, timed alone over 2000 updates (two "
           f"progress calls, one `pwrite` of the record): {1e6 * job['hot_path_sec']:.1f} µs, "
           f"i.e. {job['hot_path_sec'] / median(t['off']):.1e} of the median step without it.")
    return BenchResult("heartbeat_cost", [ratio], {"sec_per_step": t, "steps_per_round": steps,
                                                   "hot_path_sec": job["hot_path_sec"]}, md)
