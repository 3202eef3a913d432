"""Benchmark 8: step-time cost of the stall watchdog's heartbeat.

Ratio = seconds per step of ``TrainLoop.train_step`` with ``mxlarge.Trainer``'s heartbeat ÷
without it, measured in the same worker of one launched 1 worker + 1 server dist_sync job,
interleaved (:mod:`benchmarks.heartbeat_worker`, whose docstring says what is in both modes).
Hybridized ``cifar_resnet20_v1``, batch 32: target ≤ 1.01. Also the demo net (``small_resnet``
width 16 on 1×8×8, batch 128), whose short step shows a fixed per-step cost most (info; a
wait for update t−1 on the training thread every step cost it 3–6%).
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, median, mmm, ratios_of

DEMO = ["--net", "small_resnet", "--width", "16", "--size", "8", "--channels", "1",
        "--batch", "128"]


def run(reps: int = 21, steps: int = 10, demo_reps: int = 60, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    jobs = {
        "resnet20": launch("benchmarks.heartbeat_worker",
                           ["--reps", str(reps), "--steps", str(steps)],
                           workers=1, servers=1, log=log, bar=bar)[0],
        "demo": launch("benchmarks.heartbeat_worker",
                       [*DEMO, "--reps", str(demo_reps), "--steps", str(steps)],
                       workers=1, servers=1, log=log, bar=bar)[0],
    }
    ratios = []
    for key, name, target in (("resnet20", "heartbeat_cost", 1.01),
                              ("demo", "heartbeat_cost_demo", None)):
        job = jobs[key]
        t = job["sec_per_step"]
        ratios.append(Ratio(name, "step time with the stall-watchdog heartbeat ÷ without",
                            ratios_of(t["heartbeat"], t["off"]), target=target,
                            higher_is_better=False,
                            note=f"{job['net']}, batch {job['batch']}, dist_sync 1 worker + 1 "
                                 f"server, {steps} steps per round"))
    md = md_table(["net", "mode", "ms/step (min / median / max)"],
                  [[job["net"], k, mmm([1e3 * v for v in job["sec_per_step"][k]], "{:.1f}")]
                   for job in jobs.values() for k in ("heartbeat", "off")])
    job = jobs["resnet20"]
    md += (f"\n\nThe training thread's heartbeat work per update, timed alone over 2000 updates "
           f"(the issue and the hand-off of a result that exists to the watcher thread, which "
           f"writes the record): {1e6 * job['hot_path_sec']:.1f} µs, i.e. "
           f"{job['hot_path_sec'] / median(job['sec_per_step']['off']):.1e} of resnet20's "
           f"median step without it.")
    return BenchResult("heartbeat_cost", ratios,
                       {k: {"sec_per_step": j["sec_per_step"], "hot_path_sec": j["hot_path_sec"]}
                        for k, j in jobs.items()} | {"steps_per_round": steps}, md)
