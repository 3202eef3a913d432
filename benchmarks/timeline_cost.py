"""Benchmark 16: step-time cost of recording the timeline.

Ratio = seconds per step of ``TrainLoop.train_step`` while the timeline records every step of a
5-step window (its marks, the push/pull split of each bucket, the file written after the last
update) ÷ the same steps unrecorded, in the same worker of one launched 1 worker + 1 server
dist_sync job, interleaved (:mod:`benchmarks.timeline_worker`). Hybridized
``cifar_resnet20_v1``, batch 32. Reported, no target: only the steps asked for are recorded.
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, mmm, ratios_of


def run(reps: int = 21, log: IO[str] | None = None, bar: Any = None) -> BenchResult:
    job = launch("benchmarks.timeline_worker", ["--reps", str(reps)], workers=1, servers=1,
                 log=log, bar=bar)[0]
    t = job["sec_per_step"]
    ratio = Ratio("timeline_cost", "step time of a step the timeline records ÷ unrecorded",
                  ratios_of(t["timeline"], t["off"]), target=None, higher_is_better=False,
                  note=f"{job['net']}, batch {job['batch']}, {job['buckets']} bucket(s), "
                       f"dist_sync 1 worker + 1 server, windows of {job['steps_per_round']} "
                       f"steps ({job['spans']} spans each)")
    md = md_table(["mode", "ms/step (min / median / max)"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.1f}")] for k in ("timeline", "off")])
    return BenchResult("timeline_cost", [ratio], {"sec_per_step": t,
                                                  "steps_per_round": job["steps_per_round"]},
                       md)
