"""Worker script of benchmark 16: training steps recorded by the timeline and not.

Started as every role of a 1 worker + 1 server dist_sync job (:func:`benchmarks.common.launch`).
The worker steps one ``mxlarge.Trainer`` through ``TrainLoop.train_step`` in interleaved rounds
of ``--steps`` steps of two modes: ``timeline``, every step of the round recorded
(a :class:`mxlarge.timeline.record.Recorder` observing the Trainer over the round, its file
written after the last update, as a launched job's window), and ``off``. Prints one
``BENCH_RESULT`` JSON line with seconds per step per round and the spans one round recorded.
"""
from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

import mxnet as mx

from benchmarks.common import emit_progress, emit_result, interleave, worker_main
from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--net", default="cifar_resnet20_v1")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="steps per round (the window)")
    p.add_argument("--reps", type=int, default=21, help="rounds")
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    from mxlarge.kvstore import sync
    from mxlarge.timeline import PREFIX, TimelineWindow
    from mxlarge.timeline.record import Recorder

    kv = sync.create("dist_sync")
    batches = synthetic_batches(4, opts.batch, opts.size, 10, seed=kv.rank)
    net = build_net(opts.net, 10, opts.size, seed=0)
    trainer = recipe_trainer(net, kv)
    loop = recipe_loop(net, trainer)
    folder = Path(tempfile.mkdtemp(prefix="mxlarge-bench-timeline-"))
    spans: list[int] = []

    def timed(on: bool) -> float:
        rec = None
        if on:
            rec = Recorder(TimelineWindow(loop.step, opts.steps), folder, kv.rank,
                           socket.gethostname(), kv._barrier)
            trainer.observers.add(rec)
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(opts.steps):
            loop.train_step(*batches[s % len(batches)])
            loop.step += 1
        mx.nd.waitall()
        t = (time.perf_counter() - t0) / opts.steps
        if rec is not None:
            record = json.loads((folder / f"{PREFIX}{kv.rank}.json").read_text())
            spans.append(len(record["spans"]))
            trainer.observers.remove(rec)
        return t

    for s in range(3):  # warm-up: graph, static allocation, states
        loop.train_step(*batches[s % len(batches)])
        loop.step += 1
    t = interleave({"timeline": lambda: timed(True), "off": lambda: timed(False)}, opts.reps,
                   progress=emit_progress)
    emit_result({"rank": kv.rank, "sec_per_step": t, "steps_per_round": opts.steps,
                 "net": opts.net, "batch": opts.batch, "spans": spans[-1],
                 "buckets": len(trainer.store.buckets)})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
