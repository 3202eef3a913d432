"""Benchmark 1: cost of mxlarge's training step over a bare ``gluon.Trainer`` loop.

Ratio = images/s of ``mxlarge.loop.TrainLoop.train_step`` with ``mxlarge.Trainer`` (recipe on,
local store) ÷ images/s of a hand-written ``gluon.Trainer('sgd', momentum, wd)`` loop, i.e.
``t_bare / t_mxlarge`` per step; same hybridized ``cifar_resnet20_v1`` (two instances built from
the same seed), same fixed synthetic batches, one process. Target ≥ 0.97.

Both sides do forward, backward and one SGD-momentum update with no store (one device): what
differs is mxlarge's per-step Python (schedule and momentum-correction lookup, roles, chunked
``multi_sgd_mom_update`` over 16 tensors) against Gluon's updater (aggregated by 4).
"""
from __future__ import annotations

import time
from typing import Any

from benchmarks.common import BenchResult, Ratio, interleave, md_table, mmm, ratios_of
from benchmarks.models import MOMENTUM, WEIGHT_DECAY, build_net, recipe_loop, recipe_trainer
from benchmarks.models import synthetic_batches as make_batches

NET, SIZE, CLASSES = "cifar_resnet20_v1", 32, 10


def run(reps: int = 5, steps: int = 8, batch: int = 32, bar: Any = None) -> BenchResult:
    """Measures seconds per step of both loops in ``reps`` interleaved rounds of ``steps``."""
    import mxnet as mx
    from mxnet import autograd, gluon

    batches = make_batches(4, batch, SIZE, CLASSES)

    net_a = build_net(NET, CLASSES, SIZE, seed=0)
    loop = recipe_loop(net_a, recipe_trainer(net_a, "local"))

    net_b = build_net(NET, CLASSES, SIZE, seed=0)
    bare = gluon.Trainer(net_b.collect_params(), "sgd",
                         {"learning_rate": 0.1, "momentum": MOMENTUM, "wd": WEIGHT_DECAY})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def mxlarge_step(x: Any, y: Any) -> None:
        loop.train_step(x, y)
        loop.step += 1

    def bare_step(x: Any, y: Any) -> None:
        with autograd.record():
            loss = loss_fn(net_b(x), y)
        loss.backward()
        bare.step(x.shape[0])

    def timed(step_fn: Any) -> float:
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(steps):
            step_fn(*batches[s % len(batches)])
        mx.nd.waitall()
        return (time.perf_counter() - t0) / steps

    # Warm-up: graph construction, static allocation, optimizer states.
    for step_fn in (mxlarge_step, bare_step):
        for s in range(3):
            step_fn(*batches[s % len(batches)])
    mx.nd.waitall()

    t = interleave({"mxlarge": lambda: timed(mxlarge_step), "bare": lambda: timed(bare_step)},
                   reps, progress=None if bar is None else lambda: bar.update(1))
    ratio = Ratio("trainer_overhead", "mxlarge.Trainer step ÷ bare gluon.Trainer step (images/s)",
                  ratios_of(t["bare"], t["mxlarge"]), target=0.97, higher_is_better=True,
                  note=f"{NET}, 3×{SIZE}×{SIZE} synthetic, batch {batch}, 1 process, "
                       f"{steps} steps per round")
    ips = {k: [batch / v for v in vs] for k, vs in t.items()}
    md = md_table(["loop", "images/s (min / median / max)", "ms/step (median)"],
                  [[k, mmm(ips[k], "{:.1f}"), f"{1e3 * sorted(t[k])[len(t[k]) // 2]:.1f}"]
                   for k in ("mxlarge", "bare")])
    return BenchResult("trainer_overhead", [ratio], {"sec_per_step": t, "batch": batch,
                                                     "steps_per_round": steps, "net": NET}, md)
