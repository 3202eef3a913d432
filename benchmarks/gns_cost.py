"""Benchmark 7: step-time cost of the gradient-noise-scale estimator.

Ratio = seconds per step with ``gns_every = N`` ÷ seconds per step without the estimator, same
hybridized ``cifar_resnet20_v1``, same batches, 4 simulated workers × 8 images (the simulation is
the costlier path: it copies the accumulated gradients before each micro-batch on measuring
steps to get each worker's own gradient). Target ≤ 1.05 at the default-style N = 10; N = 1
(every step) is reported for scale.
"""
from __future__ import annotations

import time
from typing import Any

from benchmarks.common import BenchResult, Ratio, interleave, md_table, mmm, ratios_of
from benchmarks.models import MOMENTUM, WEIGHT_DECAY, build_net
from benchmarks.models import synthetic_batches as make_batches

NET, SIZE, CLASSES, K, N = "cifar_resnet20_v1", 32, 10, 4, 8


def _loop(gns_every: int) -> Any:
    import mxnet as mx

    from mxlarge.gns import NoiseScale
    from mxlarge.loop import TrainLoop
    from mxlarge.schedulers import Constant
    from mxlarge.trainer import Trainer

    net = build_net(NET, CLASSES, SIZE, seed=0)
    trainer = Trainer(net.collect_params(), Constant(0.05), momentum=MOMENTUM,
                      weight_decay=WEIGHT_DECAY, simulate_workers=K)
    return TrainLoop(net=net, trainer=trainer, train_source=None,
                     loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=1, ctx=[mx.cpu()],
                     gns=NoiseScale(N, K * N) if gns_every else None, gns_every=gns_every)


def run(reps: int = 7, steps: int = 10, bar: Any = None) -> BenchResult:
    import mxnet as mx

    batches = make_batches(4, K * N, SIZE, CLASSES)
    loops = {"off": _loop(0), "every 10": _loop(10), "every 1": _loop(1)}

    def timed(loop: Any) -> float:
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(steps):
            loop.train_step(*batches[s % len(batches)])
            loop.step += 1
        mx.nd.waitall()
        return (time.perf_counter() - t0) / steps

    for loop in loops.values():  # warm-up: graphs, static allocation, states
        for s in range(3):
            loop.train_step(*batches[s % len(batches)])
    mx.nd.waitall()
    t = interleave({k: (lambda lp=lp: timed(lp)) for k, lp in loops.items()}, reps,
                   progress=None if bar is None else lambda: bar.update(1))
    note = f"{NET}, {K} simulated workers × {N}, {steps} steps per round"
    ratios = [
        Ratio("gns_cost_10", "step time with the noise-scale estimator every 10 steps ÷ without",
              ratios_of(t["every 10"], t["off"]), target=1.05, higher_is_better=False, note=note),
        Ratio("gns_cost_1", "step time with the estimator on every step ÷ without",
              ratios_of(t["every 1"], t["off"]), target=None, higher_is_better=False, note=note),
    ]
    md = md_table(["estimator", "ms/step (min / median / max)"],
                  [[k, mmm([1e3 * v for v in t[k]], "{:.1f}")] for k in loops])
    return BenchResult("gns_cost", ratios, {"sec_per_step": t, "steps_per_round": steps}, md)
