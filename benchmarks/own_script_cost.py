"""Benchmark 17: step-time cost of tracking a script of one's own.

Ratio = seconds per step of the demo net's step as an own script writes it (forward, backward,
``trainer.step(n)``) with rank 0's MLflow observer, logging into a real run every
:data:`mxlarge.tracking.script.EVERY` updates, ÷ without, in the same worker of one launched
1 worker + 1 server dist_sync job, interleaved (:mod:`benchmarks.own_script_worker`). The demo
net (``small_resnet`` width 16 on 1×8×8, batch 128) has the shortest step, where a per-step
cost shows most: target ≤ 1.01.
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, mmm, ratios_of


def run(reps: int = 21, steps: int = 50, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    job = launch("benchmarks.own_script_worker", ["--reps", str(reps), "--steps", str(steps)],
                 workers=1, servers=1, log=log, bar=bar)[0]
    t = job["sec_per_step"]
    ratio = Ratio("own_script_tracking_cost",
                  "step time of an own script's loop with the launcher's run tracked ÷ untracked",
                  ratios_of(t["tracked"], t["off"]), target=1.01, higher_is_better=False,
                  note=f"{job['net']} (demo), batch {job['batch']}, dist_sync 1 worker + 1 "
                       f"server, {steps} steps per round")
    md = md_table(["mode", "ms/step (min / median / max)"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.2f}")] for k in ("tracked", "off")])
    md += (f"\n\nThe tracked rounds ran {job['tracked_updates']} updates and logged "
           f"{job['points']} points of `train/lr` (every 10 updates, at least 2 s apart).")
    return BenchResult("own_script_tracking_cost", [ratio],
                       {"sec_per_step": t, "steps_per_round": steps,
                        "points": job["points"], "tracked_updates": job["tracked_updates"]}, md)
