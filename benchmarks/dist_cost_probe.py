"""Where the demo net's dist cost goes (``make bench`` row ``dist_cost_demo_1w1s``).

    python -m benchmarks.dist_cost_probe [--reps 8] [--env OMP_WAIT_POLICY=PASSIVE ...]

Launches 1 worker + 1 server on 127.0.0.1 (the row's job) and runs the demo net (small_resnet
width 16 on 1×8×8, batch 128) under three trainers in one worker, in alternating rounds:
``local`` (mxlarge.Trainer, local store: no exchange), ``dist`` (the job's dist_sync store, the
default fusion: one bucket) and ``dist_2b`` (the same with 40 KiB buckets: two). For each it
records, per step (medians over the rounds' steps):

* ``whole``: ``TrainLoop.train_step`` then ``waitall`` (what the row times);
* ``split``: forward+backward, ``allreduce_grads``, ``update``, each followed by ``waitall``;
* ``issue``: the Python wall time of issuing forward, backward, ``allreduce_grads`` and
  ``update`` (no waitall between them), then the wait for the engine; and the Python thread's
  CPU time while issuing the forward (wall above CPU: the thread was not running);

and ``bare_pushpull``: MXNet's own ``kv.pushpull`` of as many floats as one key (the
exchange's floor, no trainer), back to back and right after a local forward+backward.
Prints one JSON object (ms). Ad hoc: not part of ``make bench``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

ROLE_MODES = ("local", "dist", "dist_2b")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--reps", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="steps per round and kind")
    p.add_argument("--env", nargs="*", default=[], help="NAME=VALUE for every process")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _med(rows: list[tuple[float, ...]]) -> list[float]:
    return [round(1e3 * statistics.median(c), 3) for c in zip(*rows)]


def work(opts: argparse.Namespace) -> None:
    import mxnet as mx
    from mxnet import autograd

    from benchmarks.common import KEY_STRIDE, OffsetKV, emit_result
    from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches
    from mxlarge.kvstore import sync

    kv = sync.create("dist_sync")
    batches = synthetic_batches(4, 128, 8, 10, seed=0, channels=1)
    loops = {}
    for mode, store, fusion in (("local", "local", None), ("dist", kv, None),
                                ("dist_2b", OffsetKV(kv, KEY_STRIDE), 40960)):
        net = build_net("small_resnet", 10, 8, seed=0, channels=1, width=16)
        loops[mode] = recipe_loop(net, recipe_trainer(net, store, fusion_bytes=fusion))
    rec: dict[str, dict[str, list[tuple[float, ...]]]] = {
        m: {"whole": [], "split": [], "issue": []} for m in loops}
    # the floor: MXNet's own pushpull of the demo net's gradient floats as one key, no trainer
    net = loops["dist"].net
    floats = sum(p.data().size for p in net.collect_params().values() if p.grad_req != "null")
    flat = mx.nd.zeros(floats)
    kv.init(3 * KEY_STRIDE, flat)
    mx.nd.waitall()
    bare_rows: list[tuple[float, ...]] = []

    def bare() -> tuple[float, ...]:
        t0 = time.perf_counter()
        kv.pushpull(3 * KEY_STRIDE, flat, out=flat)
        flat.wait_to_read()
        return (time.perf_counter() - t0,)

    def bare_after_compute(loop: Any, x: Any, y: Any) -> tuple[float, ...]:
        """The same after a local forward+backward, as in a step (every thread of the job was
        idle or computing for ~20 ms, not exchanging)."""
        with autograd.record():
            loss = loop.loss_fn(loop.net(x), y)
        autograd.backward([loss])
        mx.nd.waitall()
        return bare()

    def whole(loop: Any, x: Any, y: Any) -> tuple[float, ...]:
        t0 = time.perf_counter()
        loop.train_step(x, y)
        mx.nd.waitall()
        return (time.perf_counter() - t0,)

    def split(loop: Any, x: Any, y: Any) -> tuple[float, ...]:
        t = loop.trainer
        t0 = time.perf_counter()
        with autograd.record():
            loss = loop.loss_fn(loop.net(x), y)
        autograd.backward([loss])
        mx.nd.waitall()
        t1 = time.perf_counter()
        t.allreduce_grads()
        mx.nd.waitall()
        t2 = time.perf_counter()
        t.update(x.shape[0], loop.step)
        mx.nd.waitall()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    def issue(loop: Any, x: Any, y: Any) -> tuple[float, ...]:
        t = loop.trainer
        t0, c0 = time.perf_counter(), time.thread_time()
        with autograd.record():
            loss = loop.loss_fn(loop.net(x), y)
        t1, c1 = time.perf_counter(), time.thread_time()
        autograd.backward([loss])
        t2 = time.perf_counter()
        t.allreduce_grads()
        t3 = time.perf_counter()
        t.update(x.shape[0], loop.step)
        t4 = time.perf_counter()
        mx.nd.waitall()
        return t1 - t0, c1 - c0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t4

    kinds = {"whole": whole, "split": split, "issue": issue}
    for r in range(opts.reps + 1):  # round 0 warms up (graphs, buckets, states) and is dropped
        for mode in (ROLE_MODES if r % 2 else ROLE_MODES[::-1]):
            loop = loops[mode]
            for kind, fn in kinds.items():
                for s in range(opts.steps):
                    got = fn(loop, *batches[s % len(batches)])
                    loop.step += 1
                    if r:
                        rec[mode][kind].append(got)
        for s in range(opts.steps):
            got = bare()
            cold = bare_after_compute(loops["local"], *batches[s % len(batches)])
            if r:
                bare_rows.append(got + cold)
    emit_result({m: {k: _med(v) for k, v in kinds_.items()} for m, kinds_ in rec.items()}
                | {"bare_pushpull": _med(bare_rows), "floats": floats}
                | {"buckets": {m: len(lp.trainer.store.buckets) for m, lp in loops.items()
                               if lp.trainer.store.kv is not None}}
                | {"copied": {m: len(lp.trainer.store.views.copied) for m, lp in loops.items()
                              if lp.trainer.store.kv is not None}})


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    if opts.worker:  # every role of the job: a scheduler or server serves inside this import
        import mxnet  # noqa: F401

        from benchmarks.common import worker_main
        return worker_main(_parse, work, argv)
    from benchmarks.common import launch
    env = dict(e.split("=", 1) for e in opts.env)
    res = launch("benchmarks.dist_cost_probe",
                 ["--worker", "--reps", str(opts.reps), "--steps", str(opts.steps)],
                 workers=1, servers=1, env=env)[0]
    res.pop("rank", None)
    print(json.dumps({"env": env, "ms": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
