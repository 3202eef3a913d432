"""Worker script of benchmark 14: forward+backward of the same graph under mxlarge and Gluon.

Started by :func:`mxlarge.launcher.run_local` as every role of a 1 worker + 1 server dist_sync
job; a scheduler or server serves its role inside ``import mxnet`` and exits there. The worker
builds the same hybridized net twice from seed 0 (the same graph and initial weights) and steps
each with its own trainer on the job's store, in interleaved rounds:

* ``gluon``: ``gluon.Trainer(params, 'sgd', opt, kvstore=kv, update_on_kvstore=False)``,
  ``step(k·n)``, its store initialised before the first forward (the peers benchmark's
  ``gluon``);
* ``mxlarge``: ``mxlarge.Trainer(params, 'sgd', opt, kvstore=kv, decay_bn_bias=True)``,
  ``step(n)``, its keys in their own range of the store (``OffsetKV``): gradient fusion's views,
  the heartbeat the launcher asked for, everything a launched job has.

Both apply the same update (SGD η, m, λ on every tensor, constant η), so their weights stay
equal and every round runs both on the same values. Each step is timed in two parts with
``mx.nd.waitall()`` between them, nothing overlapping: forward+backward (from the forward's
first operator to the last gradient written), then ``trainer.step`` to its end. In a round the
two trainers' steps alternate step by step (the pair's order reversed every other step), so
both see the same moments of a shared machine; a round's figure per mode is the median over
its steps. Prints one ``BENCH_RESULT`` JSON line.
"""
from __future__ import annotations

import argparse
import statistics
import time

import mxnet as mx

from benchmarks.common import KEY_STRIDE, OffsetKV, emit_progress, emit_result, worker_main
from benchmarks.models import build_net, synthetic_batches

MODES = ("gluon", "mxlarge")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="cifar_resnet20_v1")
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--width", type=int, default=16, help="width of mxlarge's own nets")
    p.add_argument("--batch", type=int, default=32, help="images per worker and step (n)")
    p.add_argument("--steps", type=int, default=6, help="steps per round and mode")
    p.add_argument("--reps", type=int, default=21, help="rounds")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    import numpy as np
    from mxnet import autograd, gluon

    import mxlarge

    kv = mx.kv.create("dist_sync")
    k, n = kv.num_workers, opts.batch
    opt = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
    batches = synthetic_batches(4, n, opts.size, opts.classes, seed=kv.rank,
                                channels=opts.channels)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    nets, steps = {}, {}
    for mode in MODES:
        nets[mode] = build_net(opts.net, opts.classes, opts.size, seed=0,
                               channels=opts.channels, width=opts.width)
        params = nets[mode].collect_params()
        if mode == "gluon":
            trainer = gluon.Trainer(params, "sgd", opt, kvstore=kv, update_on_kvstore=False)
            # Gluon's lazy store init races the first push (docs/mxnet-facts.md): done first
            trainer._init_kvstore()
            trainer._init_params()
            mx.nd.waitall()
            steps[mode] = (trainer, k * n)
        else:
            trainer = mxlarge.Trainer(params, "sgd", opt, kvstore=OffsetKV(kv, KEY_STRIDE),
                                      decay_bn_bias=True)
            steps[mode] = (trainer, n)
    fb: dict[str, list[float]] = {m: [] for m in MODES}
    cu: dict[str, list[float]] = {m: [] for m in MODES}

    def split_step(mode: str, s: int) -> None:
        net, (trainer, b) = nets[mode], steps[mode]
        x, y = batches[s % len(batches)]
        mx.nd.waitall()
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        mx.nd.waitall()
        t1 = time.perf_counter()
        trainer.step(b)
        mx.nd.waitall()
        fb[mode].append(t1 - t0)
        cu[mode].append(time.perf_counter() - t1)

    def round_(r: int) -> dict[str, float]:
        """One round: the modes' steps interleaved step by step, the pair's order reversed every
        other step (each pair ~2 steps apart in time: a loaded machine's bursts hit both)."""
        kv._barrier()
        start = {m: len(fb[m]) for m in MODES}
        for s in range(opts.steps):  # both modes: the same batches in the same order
            for mode in (MODES if (r + s) % 2 == 0 else MODES[::-1]):
                split_step(mode, s)
        emit_progress()
        return {m: statistics.median(fb[m][start[m]:]) for m in MODES}

    for mode in MODES:  # warm-up: graph, static allocation, optimizer states
        for s in range(3):
            split_step(mode, s)
    for mode in MODES:
        fb[mode].clear()
        cu[mode].clear()
    rounds = [round_(r) for r in range(opts.reps)]
    t = {m: [x[m] for x in rounds] for m in MODES}
    # the same update on the same graph: the weights must still agree
    diff = max(float(np.abs(a.data().asnumpy() - b.data().asnumpy()).max())
               for a, b in zip(nets["gluon"].collect_params().values(),
                               nets["mxlarge"].collect_params().values(), strict=True)
               if a.grad_req != "null")
    emit_result({"rank": kv.rank, "fwd_bwd": t, "comm_update_median": {
        m: statistics.median(cu[m]) for m in MODES}, "steps_per_round": opts.steps,
        "net": opts.net, "batch": n, "max_abs_weight_diff": diff,
        "keys": len(steps["mxlarge"][0].store.buckets),
        "tensors": len(steps["mxlarge"][0].store.pushed)})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
