"""Worker script of benchmark 15: the training step with and without the step breakdown.

Started as every role of a 1 worker + 1 server dist_sync job (:func:`benchmarks.common.launch`).
The worker steps one ``mxlarge.Trainer`` through ``TrainLoop.train_step`` in interleaved rounds
of two modes: ``breakdown``, as ``mxlarge launch`` runs it (the Trainer's
:class:`~mxlarge.observers.timer.StepTimer`: one step in :data:`mxlarge.breakdown.EVERY` timed
part by part with engine syncs, :func:`mxlarge.breakdown.sampled`, its window and the
heartbeat's record; and the :class:`~mxlarge.breakdown.BreakdownHook`'s ``after_step``), and
``off``. A round runs
``rounds_of`` × ``EVERY`` steps, the step counter running on over the rounds of both modes, so
a breakdown round times ``rounds_of`` sampled steps on average (1 to 3 of 20). Prints one
``BENCH_RESULT`` JSON line with seconds per step per round and the steps the breakdown timed.
"""
from __future__ import annotations

import argparse
import socket
import time

import mxnet as mx

from benchmarks.common import emit_progress, emit_result, interleave, worker_main
from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="cifar_resnet20_v1")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--rounds-of", type=int, default=2, help="sampling periods per round")
    p.add_argument("--reps", type=int, default=21, help="rounds")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    from mxlarge.breakdown import EVERY, BreakdownHook
    from mxlarge.kvstore import sync
    from mxlarge.observers.timer import StepTimer

    kv = sync.create("dist_sync")
    batches = synthetic_batches(4, opts.batch, opts.size, 10, seed=kv.rank)
    net = build_net(opts.net, 10, opts.size, seed=0)
    loop = recipe_loop(net, recipe_trainer(net, kv))
    trainer = loop.trainer
    timer = StepTimer()
    hook = BreakdownHook(socket.gethostname())
    steps = EVERY * opts.rounds_of
    sampled = {"breakdown": 0, "off": 0}  # steps timed part by part, per mode

    def timed(on: bool) -> float:
        trainer.observers.remove(timer)
        if on:
            trainer.observers.add(timer)
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(steps):
            out = loop.train_step(*batches[s % len(batches)])
            loop.step += 1
            if out.sample is not None:
                sampled["breakdown" if on else "off"] += 1
                hook.after_step(loop, out)
        mx.nd.waitall()
        return (time.perf_counter() - t0) / steps

    for s in range(3):  # warm-up: graph, static allocation, states
        loop.train_step(*batches[s % len(batches)])
        loop.step += 1
    loop.step = 0
    t = interleave({"breakdown": lambda: timed(True), "off": lambda: timed(False)}, opts.reps,
                   progress=emit_progress)
    emit_result({"rank": kv.rank, "sec_per_step": t, "steps_per_round": steps,
                 "net": opts.net, "batch": opts.batch, "sampled": sampled})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
