"""Worker script of benchmarks 2 and 4: training-step time on dist_sync vs the local store.

Started by :func:`mxlarge.launcher.run_local` as every role of the job (``python -m
benchmarks.step_worker ...``): a scheduler or server serves its role inside ``import mxnet``
(the first non-stdlib import below) and exits there; only a worker gets to :func:`main`'s work.

Each worker builds two copies of the same net from the same seed:

* ``dist``: ``mxlarge.Trainer`` on the job's ``dist_sync`` store, stepped through
  ``TrainLoop.train_step`` — mxlarge's way: backward() returns as soon as its operators are
  queued, and each gradient's push (priority −i, last layers first) starts when the engine has
  produced that gradient, overlapping the rest of backward;
* ``dist_waitall`` (same net and store): the same step with ``mx.nd.waitall()`` between backward
  and the pushes, so no communication overlaps computation;
* ``dist_perkey`` (a third copy): the ``dist`` step with one key per tensor (no gradient
  fusion), its keys shifted into their own range of the same store (``OffsetKV``);
* ``local``: ``mxlarge.Trainer`` with the local store (no push/pull at all);
* ``bound``: the ``local`` step with MXNet's own ``kv.pushpull`` of as many floats as the net
  has gradients, as one key of the job's store, issued before the forward on an array nothing
  else touches: the exchange overlaps the whole step and nothing waits for it but the round's
  ``waitall``. What a trainer that hid this exchange completely would take on these cores: the
  exchange's own CPU work (server, ps-lite threads) still competes with the computation;
* ``floor``: ``bound``, plus MXNet's ``kv.pushpull`` of the first layer's weight gradient in
  place between backward and the update (with one worker its values come back unchanged).
  Backward writes that gradient last and the next forward reads the weight it updates
  first, so a trainer that sums exactly through the store exposes at least this one round
  trip, however it splits and orders the rest: the least such a step takes on these cores.

Modes run in interleaved rounds (:func:`benchmarks.common.interleave`), every worker in
lockstep (a barrier before each round). Every worker prints one ``BENCH_RESULT`` JSON line with
seconds per step for every round and how many cores the worker process kept busy (CPU seconds
÷ wall seconds, all its threads); ``dist_waitall`` also records its forward+backward part (up
to the waitall) so that the communication + update part is known.
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

import mxnet as mx

from benchmarks.common import (
    KEY_STRIDE,
    OffsetKV,
    emit_progress,
    emit_result,
    interleave,
    worker_main,
)
from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches

#: ``bound``'s key, beyond ``dist_perkey``'s range (``KEY_STRIDE`` up)
BOUND_KEY = 3 * KEY_STRIDE


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="cifar_resnet20_v1")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--width", type=int, default=16, help="width of mxlarge's own nets")
    p.add_argument("--fusion-bytes", type=int, default=None,
                   help="gradient fusion bucket (default: mxlarge's; 0: one key per tensor)")
    p.add_argument("--steps", type=int, default=2, help="steps per round")
    p.add_argument("--reps", type=int, default=9, help="rounds")
    p.add_argument("--modes", default="local,dist,dist_waitall")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    from mxnet import autograd

    from mxlarge.kvstore import sync

    kv = sync.create("dist_sync")
    rank = kv.rank
    modes = opts.modes.split(",")
    batches = synthetic_batches(4, opts.batch, opts.size, opts.classes, seed=rank,
                                channels=opts.channels)
    shape = {"channels": opts.channels, "width": opts.width}
    net_d = build_net(opts.net, opts.classes, opts.size, seed=0, **shape)
    trainer_d = recipe_trainer(net_d, kv, fusion_bytes=opts.fusion_bytes)
    loop_d = recipe_loop(net_d, trainer_d)
    loops = {"dist": loop_d}
    if "dist_perkey" in modes:  # the same step, one key per tensor, in its own key range
        net_p = build_net(opts.net, opts.classes, opts.size, seed=0, **shape)
        loops["dist_perkey"] = recipe_loop(net_p, recipe_trainer(net_p, OffsetKV(kv, KEY_STRIDE),
                                                                 fusion_bytes=0))
    net_l = build_net(opts.net, opts.classes, opts.size, seed=0, **shape)
    loop_l = recipe_loop(net_l, recipe_trainer(net_l, "local"))
    fwd_bwd: list[float] = []  # dist_waitall: time to the end of backward, per step

    def overlap_step(loop: Any, x: Any, y: Any) -> None:
        loop.train_step(x, y)
        loop.step += 1

    def waitall_step(loop: Any, x: Any, y: Any) -> None:
        t0 = time.perf_counter()
        t = loop.trainer
        with autograd.record():
            loss = loop.loss_fn(loop.net(x), y)
        autograd.backward([loss])
        mx.nd.waitall()  # every gradient exists before the first push is issued
        fwd_bwd.append(time.perf_counter() - t0)
        t.allreduce_grads()
        t.update(x.shape[0], loop.step)
        loop.step += 1

    trained = [p for p in net_l.collect_params().values() if p.grad_req != "null"]
    flat = mx.nd.zeros(sum(p.data().size for p in trained))
    first = trained[0].grad()  # the first layer's weight gradient: backward writes it last
    if "bound" in modes or "floor" in modes:
        kv.init(BOUND_KEY, flat)
        kv.init(BOUND_KEY + 1, first)

    def bound_step(loop: Any, x: Any, y: Any) -> None:
        kv.pushpull(BOUND_KEY, flat, out=flat)
        overlap_step(loop, x, y)

    def floor_step(loop: Any, x: Any, y: Any) -> None:
        kv.pushpull(BOUND_KEY, flat, out=flat)
        t = loop.trainer
        with autograd.record():
            loss = loop.loss_fn(loop.net(x), y)
        autograd.backward([loss])
        kv.pushpull(BOUND_KEY + 1, first, out=first)  # the update of that weight waits for it
        t.allreduce_grads()
        t.update(x.shape[0], loop.step)
        loop.step += 1

    steps = {"local": (overlap_step, loop_l), "dist_waitall": (waitall_step, loop_d),
             "bound": (bound_step, loop_l), "floor": (floor_step, loop_l),
             **{m: (overlap_step, loop) for m, loop in loops.items()}}

    cores: dict[str, list[float]] = {m: [] for m in modes}  # CPU seconds ÷ wall seconds

    def timed(mode: str) -> float:
        step_fn, loop = steps[mode]
        kv._barrier()  # all workers start the round together (outside the timer)
        mx.nd.waitall()
        c0, t0 = time.process_time(), time.perf_counter()
        for s in range(opts.steps):
            step_fn(loop, *batches[s % len(batches)])
        mx.nd.waitall()
        wall = time.perf_counter() - t0
        cores[mode].append((time.process_time() - c0) / wall)
        return wall / opts.steps

    for mode in modes:  # warm-up: graph build, static allocation, optimizer states
        step_fn, loop = steps[mode]
        for s in range(2):
            step_fn(loop, *batches[s % len(batches)])
    mx.nd.waitall()
    fwd_bwd.clear()

    t = interleave({m: (lambda m=m: timed(m)) for m in modes}, opts.reps,
                   progress=emit_progress if rank == 0 else None)
    per_round = opts.steps
    fb = [sum(fwd_bwd[i:i + per_round]) / per_round for i in range(0, len(fwd_bwd), per_round)]
    emit_result({"rank": rank, "workers": kv.num_workers,
                 "servers": int(os.environ.get("DMLC_NUM_SERVER", "0")),
                 "sec_per_step": t, "worker_cores_busy": cores,
                 "dist_waitall_fwd_bwd": fb, "batch": opts.batch,
                 "steps_per_round": opts.steps, "net": opts.net,
                 "keys": len(trainer_d.store.buckets),
                 "tensors": len(trainer_d.store.pushed)})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
