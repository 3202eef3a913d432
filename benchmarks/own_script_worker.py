"""Worker script of the own-script tracking benchmark: a script's own loop, tracked or not.

Started as every role of a 1 worker + 1 server dist_sync job (:func:`benchmarks.common.launch`).
The worker runs the demo net's step as a script of one's own writes it (forward, backward,
``trainer.step(n)`` on a Gluon-form ``mxlarge.Trainer`` with ``reference_batch``) in
interleaved rounds of two modes: ``tracked``, with the
:class:`~mxlarge.tracking.script.ScriptRun` observer that rank 0 of a launched script adds,
logging into a real run of a SQLite store; ``off``, without it. Prints one ``BENCH_RESULT``
JSON line with seconds per step per round.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import mxnet as mx
from mxnet import autograd, gluon

from benchmarks.common import emit_progress, emit_result, interleave, worker_main
from benchmarks.models import build_net, synthetic_batches


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="small_resnet")
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=50, help="steps per round")
    p.add_argument("--reps", type=int, default=21, help="rounds")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    from mxlarge import Trainer
    from mxlarge.kvstore import sync
    from mxlarge.tracking.run import RunHandle
    from mxlarge.tracking.script import ScriptRun

    kv = sync.create("dist_sync")
    batches = synthetic_batches(4, opts.batch, opts.size, 10, seed=kv.rank,
                                channels=opts.channels)
    net = build_net(opts.net, 10, opts.size, seed=0, channels=opts.channels, width=opts.width)
    trainer = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                      kvstore=kv, reference_batch=opts.batch, track=False)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    store = tempfile.mkdtemp(prefix="mxlarge-bench-store-")
    run = RunHandle.create_plain(f"sqlite:///{store}/mlruns.db", "bench", {})  # schema: untimed
    tracked = ScriptRun(run, trainer)

    def step(s: int) -> None:
        x, y = batches[s % len(batches)]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(opts.batch)

    def timed(on: bool) -> float:
        trainer.observers.remove(tracked)
        if on:
            trainer.observers.add(tracked)
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(opts.steps):
            step(s)
        mx.nd.waitall()
        return (time.perf_counter() - t0) / opts.steps

    for s in range(3):  # warm-up: graph, static allocation, states
        step(s)
    t = interleave({"tracked": lambda: timed(True), "off": lambda: timed(False)}, opts.reps,
                   progress=emit_progress)
    tracked.close()
    from mxlarge.tracking.queries import metric_history
    emit_result({"rank": kv.rank, "sec_per_step": t, "net": opts.net, "batch": opts.batch,
                 "steps_per_round": opts.steps, "tracked_updates": tracked.updates,
                 "points": len(metric_history(run.uri, run.run_id, "train/lr"))})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
