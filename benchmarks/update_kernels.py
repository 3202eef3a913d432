"""Benchmark 11: the optimizer update alone, mxlarge's against Gluon's, on ResNet-50's tensors.

Ratio = CPU seconds of Gluon's update (``mx.optimizer.get_updater(SGD)`` called with every index,
exactly what ``gluon.Trainer`` with ``update_on_kvstore=False`` runs: ``multi_sgd_mom_update``
in groups of ``MXNET_OPTIMIZER_AGGREGATION_SIZE`` = 4) ÷ CPU seconds of ``LargeBatchSGD.apply``
(mxlarge's: single-tensor ``sgd_mom_update`` for tensors of ``ALONE`` elements or more on CPU,
the multi-tensor kernel for the rest; :mod:`mxlarge.kvstore.updater`), same weights, gradients
and momentum buffers (ResNet-50 v1b's 161 trainable tensors, 25.6 M float32), one process, each
side its best of 3 updates per round. CPU time (``time.process_time``: every thread of the
process, MXNet's engine workers included) is the ratio because it is what an update costs on
cores the workers share, and because other tenants of a shared machine stretch wall time but
not it; wall times are in the table beside it. Also in the same rounds, mxlarge's update with every
tensor on the multi-tensor kernel (what it did before the split): ``update_kernels_split``.
Target ≥ 1 (mxlarge's update no slower than Gluon's).
"""
from __future__ import annotations

import time
from typing import Any

from benchmarks.common import BenchResult, Ratio, interleave, md_table, mmm, ratios_of

ITERS = 3


def run(reps: int = 7, bar: Any = None) -> BenchResult:
    import mxnet as mx
    import numpy as np

    import mxlarge.kvstore.updater as updater
    from benchmarks.bandwidth import resnet50_shapes
    from mxlarge.schedulers import Constant

    shapes = resnet50_shapes()
    rng = np.random.default_rng(0)

    def arrays() -> list[Any]:
        return [mx.nd.array(rng.standard_normal(s).astype(np.float32)) for s in shapes]

    weights, grads = arrays(), arrays()
    index = list(range(len(shapes)))
    rescale = 1 / 256
    gluon_opt = mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-4, rescale_grad=rescale)
    gluon = mx.optimizer.get_updater(gluon_opt)
    ours = updater.LargeBatchSGD(Constant(0.1), momentum=0.9, wd=1e-4)
    states = [ours.create_state(i, w) for i, w in enumerate(weights)]
    alone = updater.ALONE

    def timed(fn: Any) -> tuple[float, float]:
        """(CPU seconds, wall seconds) of the best of ITERS updates."""
        best = (float("inf"), float("inf"))
        for _ in range(ITERS):
            mx.nd.waitall()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            mx.nd.waitall()
            best = min(best, (time.process_time() - c0, time.perf_counter() - t0))
        return best

    def mxlarge_update(split: bool) -> None:
        updater.ALONE = alone if split else 1 << 62
        try:
            ours.apply(0, index, weights, grads, states, rescale)
        finally:
            updater.ALONE = alone

    modes = {"mxlarge": lambda: timed(lambda: mxlarge_update(True)),
             "mxlarge_multi": lambda: timed(lambda: mxlarge_update(False)),
             "gluon": lambda: timed(lambda: gluon(index, grads, weights))}
    for fn in modes.values():  # warm-up: Gluon's states, allocations
        fn()
    both = interleave(modes, reps, progress=None if bar is None else lambda: bar.update(1))
    t = {k: [c for c, _ in v] for k, v in both.items()}
    wall = {k: [w for _, w in v] for k, v in both.items()}
    n = sum(int(np.prod(s)) for s in shapes)
    note = f"{len(shapes)} tensors, {n / 1e6:.1f} M float32, 1 process, best of {ITERS} per round"
    ratios = [
        Ratio("update_kernels", "Gluon's SGD update ÷ mxlarge's update (CPU seconds), "
              "ResNet-50's tensors", ratios_of(t["gluon"], t["mxlarge"]), target=1.0,
              higher_is_better=True, note=note),
        Ratio("update_kernels_split", "mxlarge's update, every tensor on the multi-tensor kernel "
              "÷ with tensors of ≥ ALONE elements on their own kernel (CPU seconds)",
              ratios_of(t["mxlarge_multi"], t["mxlarge"]), higher_is_better=True, note=note)]
    md = md_table(["update", "CPU ms (min / median / max)", "wall ms (min / median / max)"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.1f}"),
                    mmm([1e3 * v for v in wall[k]], "{:.1f}")] for k in modes])
    return BenchResult("update_kernels", ratios, {"cpu_sec_per_update": t,
                                                  "wall_sec_per_update": wall, "alone": alone,
                                                  "tensors": len(shapes)}, md)
