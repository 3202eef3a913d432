"""Benchmark 8: bytes on the wire per training step with 2-bit compression and the 16-bit wire.

Local dist_sync jobs of :mod:`benchmarks.compression_worker` (2 workers + 1 server, a
1.32 M-parameter MLP through :class:`mxlarge.Trainer`), one per mode; each worker reports the
TCP bytes it sent and received per step, from the kernel's per-socket counters. Expected:
2-bit sends 2 bits per gradient element instead of 32 (ratio ≈ 1/16, plus message headers) and
pulls stay uncompressed float32, so received bytes do not change; the 16-bit wire halves both
(target ≤ 0.55: half the bytes plus the same headers).
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table

MODULE = "benchmarks.compression_worker"


def _commit() -> str:
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"


def run(reps: int = 1, steps: int = 10, log: IO[str] | None = None, bar: Any = None
        ) -> BenchResult:
    """``reps`` rounds, each one job per mode; the ratio per round is rank 0's bytes sent per
    step with 2-bit ÷ without."""
    args = {"none": [], "2bit": ["--compression", "2bit"], "wire16": ["--wire", "float16"]}
    sent: dict[str, list[float]] = {m: [] for m in args}
    received: dict[str, list[float]] = {m: [] for m in args}
    params = 0
    for r in range(reps):
        for mode in (list(args) if r % 2 == 0 else list(args)[::-1]):
            results = launch(MODULE, [*args[mode], "--steps", str(steps)], workers=2,
                             servers=1, log=log)
            sent[mode].append(results[0]["sent_per_step"])
            received[mode].append(results[0]["received_per_step"])
            params = results[0]["params"]
            if bar is not None:
                bar.update(1)
    def of(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b, strict=True)]

    ratio = of(sent["2bit"], sent["none"])
    rows = [[mode, f"{sum(sent[mode]) / reps / 1e6:.3f}", f"{sum(received[mode]) / reps / 1e6:.3f}"]
            for mode in args]
    wire = f"({params / 1e6:.2f} M float32 gradients, 2 workers + 1 server)"
    return BenchResult(
        name="compression",
        ratios=[Ratio("compression_bytes_sent", f"bytes a worker sends per step, 2-bit ÷ none "
                      f"{wire}", ratio, target=None, higher_is_better=False,
                      note="from the kernel's per-socket TCP counters (ss -tinp)"),
                Ratio("wire16_bytes_sent", f"bytes a worker sends per step, 16-bit wire ÷ "
                      f"float32 {wire}", of(sent["wire16"], sent["none"]), target=0.55,
                      higher_is_better=False),
                Ratio("wire16_bytes_received", f"bytes a worker receives per step, 16-bit "
                      f"wire ÷ float32 {wire}", of(received["wire16"], received["none"]),
                      target=0.55, higher_is_better=False)],
        details={"commit": _commit(), "params": params, "steps": steps, "sent": sent,
                 "received": received},
        markdown=f"Measured on commit {_commit()}.\n\n" + md_table(
            ["mode", "MB sent per step (rank 0)", "MB received per step (rank 0)"], rows))
