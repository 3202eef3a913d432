"""Benchmark 15: step-time cost of the per-rank step breakdown.

Ratio = seconds per step of ``TrainLoop.train_step`` with the breakdown (the Trainer's step
timer, its window and heartbeat record, and the hook's window) ÷ without, in the same worker of
one launched 1 worker + 1 server dist_sync job, interleaved (:mod:`benchmarks.breakdown_worker`).
Hybridized ``cifar_resnet20_v1``, batch 32: target ≤ 1.01.
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, mmm, ratios_of


def run(reps: int = 21, log: IO[str] | None = None, bar: Any = None) -> BenchResult:
    job = launch("benchmarks.breakdown_worker", ["--reps", str(reps)], workers=1, servers=1,
                 log=log, bar=bar)[0]
    t = job["sec_per_step"]
    ratio = Ratio("breakdown_cost", "step time with the per-rank step breakdown ÷ without",
                  ratios_of(t["breakdown"], t["off"]), target=1.01, higher_is_better=False,
                  note=f"{job['net']}, batch {job['batch']}, dist_sync 1 worker + 1 server, "
                       f"{job['steps_per_round']} steps per round")
    md = md_table(["mode", "ms/step (min / median / max)", "steps timed part by part"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.1f}"),
                    f"{job['sampled'][k]} of {reps * job['steps_per_round']}"]
                   for k in ("breakdown", "off")])
    return BenchResult("breakdown_cost", [ratio], {"sec_per_step": t,
                                                   "steps_per_round": job["steps_per_round"]},
                       md)
