"""Benchmark 12: a bfloat16 AMP step ÷ a float32 step on this CPU.

Ratio = seconds per ``TrainLoop.train_step`` (recipe ``mxlarge.Trainer``, local store) with
MXNet AMP in bfloat16 ÷ the same in float32; the demo net (``small_resnet`` width 16 on 1×8×8)
and ResNet-50's shape (``resnet50_v1b`` at 3×32×32, 1000 classes). Each precision runs in its
own process (:mod:`benchmarks.amp_worker`: AMP patches the whole process), the two asked for
rounds in turn, the order reversed every other round. No target: whether bfloat16 pays depends
on the CPU's bfloat16 units and on oneDNN's kernels for the net's shapes (on GPUs float16 AMP is
the lever; not measurable here).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from benchmarks.common import ROOT, BenchResult, Ratio, interleave, md_table, mmm, ratios_of

CASES = (("demo", 32, 8), ("resnet50", 8, 3))  # net, batch, steps per round


class _Worker:
    def __init__(self, net: str, amp: str, batch: int, steps: int):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.amp_worker", "--net", net, "--amp", amp,
             "--batch", str(batch), "--steps", str(steps)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        if self._line() != "ready":
            raise RuntimeError(f"amp_worker {net} {amp} did not start")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def round(self) -> float:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return float(self._line())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def run(reps: int = 5, bar: Any = None) -> BenchResult:
    ratios, rows, details = [], [], {}
    for net, batch, steps in CASES:
        workers = {amp: _Worker(net, amp, batch, steps) for amp in ("none", "bfloat16")}
        try:
            t = interleave({amp: w.round for amp, w in workers.items()}, reps,
                           progress=None if bar is None else lambda: bar.update(1))
        finally:
            for w in workers.values():
                w.close()
        ratios.append(Ratio(f"amp_bf16_step_{net}", f"bfloat16 AMP step ÷ float32 step, {net}",
                            ratios_of(t["bfloat16"], t["none"]), target=None,
                            higher_is_better=False,
                            note=f"batch {batch}, {steps} steps per round, one process each"))
        rows += [[net, amp, mmm([1e3 * x for x in t[amp]], "{:.1f}")] for amp in t]
        details[net] = {"sec_per_step": t, "batch": batch, "steps": steps}
    md = md_table(["net", "AMP", "ms per step (min / median / max)"], rows)
    return BenchResult("amp_cost", ratios, details, md)
