"""Benchmark 14: no per-step tax: forward+backward through mxlarge.Trainer ÷ through gluon.Trainer.

Ratio = seconds of forward+backward (``waitall`` on both sides: the graph's own work, nothing
of the exchange or the update overlapping) of the same hybridized net under
``mxlarge.Trainer`` ÷ under ``gluon.Trainer(update_on_kvstore=False)``, both on the dist_sync
store of one launched 1 worker + 1 server job, interleaved rounds
(:mod:`benchmarks.fwd_bwd_worker`, whose docstring says what is in each mode). Nets: the demo
net (``small_resnet`` width 16, 1×8×8, n = 128) and ``cifar_resnet20_v1`` (3×32×32, n = 32), one
job each, the two trainers' steps alternating step by step. Target ≤ 1.02 (what
mxlarge adds per step must not show up in the graph's own time).
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, median, mmm, ratios_of

#: key → (title, worker arguments); the demo net's shape is benchmarks.dist_step.DEMO's.
NETS = {
    "demo": ("demo net (small_resnet width 16, 1×8×8, n = 128)",
             ["--net", "small_resnet", "--width", "16", "--size", "8", "--channels", "1",
              "--classes", "10", "--batch", "128", "--steps", "8"]),
    "resnet20": ("cifar_resnet20_v1 (3×32×32, n = 32)",
                 ["--net", "cifar_resnet20_v1", "--size", "32", "--classes", "10",
                  "--batch", "32", "--steps", "4"]),
}
TARGET = 1.02


def run(reps: int = 21, log: IO[str] | None = None, bar: Any = None) -> BenchResult:
    ratios, rows, jobs = [], [], {}
    for key, (title, args) in NETS.items():
        job = launch("benchmarks.fwd_bwd_worker", [*args, "--reps", str(reps)], workers=1,
                     servers=1, log=log, bar=bar)[0]
        jobs[key] = job
        t = job["fwd_bwd"]
        ratios.append(Ratio(
            f"fwd_bwd_{key}", f"forward+backward through mxlarge.Trainer ÷ through "
                              f"gluon.Trainer, same graph, {key}",
            ratios_of(t["mxlarge"], t["gluon"]), target=TARGET, higher_is_better=False,
            note=f"{title}; dist_sync 1 worker + 1 server, {job['steps_per_round']} steps per "
                 f"round and trainer, waitall-serialised; mxlarge: {job['tensors']} tensors in "
                 f"{job['keys']} key(s); weights still equal at the end: max abs(Δw) "
                 f"{job['max_abs_weight_diff']:.1g}"))
        for mode in ("mxlarge", "gluon"):
            rows.append([key, mode, mmm([1e3 * v for v in t[mode]], "{:.1f}"),
                         f"{1e3 * job['comm_update_median'][mode]:.1f}"])
    md = md_table(["net", "trainer", "forward+backward ms (min / median / max of rounds)",
                   "trainer.step ms after it (median)"], rows)
    md += ("\n\nEach round's figure is the median of its steps; `trainer.step` (exchange and "
           "update, also serialised) is context: benchmarks `dist_step` and `update_kernels` "
           "measure it. Where the time of a step goes: benchmarks/README.md.")
    return BenchResult("fwd_bwd", ratios, {"jobs": jobs, "target": TARGET,
                                           "median_ratio": {r.key: median(r.values)
                                                            for r in ratios}}, md)
