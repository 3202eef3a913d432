"""Worker script of benchmark 8: the training step with and without the stall-watchdog heartbeat.

Started by :func:`mxlarge.launcher.run_local` (whose watchdog is on, so every worker gets
``MXLARGE_HEARTBEAT_DIR``) as every role of a 1 worker + 1 server job; a scheduler or server
serves its role inside ``import mxnet`` and exits there. The worker steps one
``mxlarge.Trainer`` on the job's dist_sync store through ``TrainLoop.train_step`` in interleaved
rounds of two modes:

* ``heartbeat``: as launched: per update, the result handed to the heartbeat's watcher
  thread (which waits for it and then writes the record with one ``pwrite``;
  :mod:`mxlarge.protocol.heartbeat`), and the training thread's wait whenever it is
  ``AHEAD`` updates ahead;
* ``off``: the same trainer with its heartbeat observer removed
  (``trainer.observers.remove``).

What is in both modes and so not in the ratio: the heartbeat's writer thread (one ``pwrite`` a
second) and the launcher's watchdog (one scan of the heartbeat directory every 0.5 s, in
another process). Prints one ``BENCH_RESULT`` JSON line with seconds per step per round.
"""
from __future__ import annotations

import argparse
import time

import mxnet as mx

from benchmarks.common import emit_progress, emit_result, interleave, worker_main
from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="cifar_resnet20_v1")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--width", type=int, default=16, help="width of mxlarge's own nets")
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--reps", type=int, default=21, help="rounds")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    from mxlarge.kvstore import sync

    kv = sync.create("dist_sync")
    batches = synthetic_batches(4, opts.batch, opts.size, 10, seed=kv.rank,
                                channels=opts.channels)
    net = build_net(opts.net, 10, opts.size, seed=0, channels=opts.channels, width=opts.width)
    from mxlarge.observers.heartbeat import HeartbeatObserver

    loop = recipe_loop(net, recipe_trainer(net, kv))
    trainer = loop.trainer
    observer = trainer.observers.find(HeartbeatObserver)
    if observer is None:
        raise RuntimeError("no heartbeat: the launcher did not set MXLARGE_HEARTBEAT_DIR")
    beat = observer.writer

    def timed(on: bool) -> float:
        trainer.observers.remove(observer)
        if on:
            trainer.observers.add(observer)
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(opts.steps):
            loop.train_step(*batches[s % len(batches)])
            loop.step += 1
        mx.nd.waitall()
        return (time.perf_counter() - t0) / opts.steps

    for s in range(3):  # warm-up: graph, static allocation, states
        loop.train_step(*batches[s % len(batches)])
        loop.step += 1
    t = interleave({"heartbeat": lambda: timed(True), "off": lambda: timed(False)}, opts.reps,
                   progress=emit_progress)
    # The training thread's heartbeat work per update, alone: the issue and the hand-off of a
    # result that exists (the watcher thread writes the record meanwhile).
    n = 2000
    done = mx.nd.zeros(1)
    mx.nd.waitall()
    t0 = time.perf_counter()
    for i in range(n):
        beat.issue(loop.step + i)
        beat.completes(loop.step + i, done)
    hot_path = (time.perf_counter() - t0) / n
    emit_result({"rank": kv.rank, "sec_per_step": t, "steps_per_round": opts.steps,
                 "net": opts.net, "batch": opts.batch, "hot_path_sec": hot_path})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
