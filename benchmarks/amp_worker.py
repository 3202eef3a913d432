"""Worker of benchmark ``amp_cost``: training steps of one net in one precision, on request.

AMP (``mxnet.contrib.amp.init``) patches MXNet for the whole process, so each precision runs in
a process of its own; the driver asks the two processes for rounds in turn (one line ``go`` on
stdin: time ``--steps`` steps, print their seconds per step; ``quit`` ends), so that the two
are measured back to back as every other ratio here. The step is ``TrainLoop.train_step`` with
the recipe's ``mxlarge.Trainer`` on a local store (AMP's loss scaling in the loop, as
``mxlarge train`` runs it).
"""
from __future__ import annotations

import argparse
import sys
import time

NETS = {"demo": ("small_resnet", 10, 8, 1), "resnet50": ("resnet50_v1b", 1000, 32, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--amp", choices=("none", "bfloat16"), default="none")
    p.add_argument("--net", choices=tuple(NETS), default="demo")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=8)
    opts = p.parse_args(argv)
    import mxnet as mx

    from benchmarks.models import build_net, recipe_loop, recipe_trainer, synthetic_batches

    if opts.amp != "none":
        from mxnet.contrib import amp
        amp.init(target_dtype=opts.amp)  # before the net is built
    name, classes, size, channels = NETS[opts.net]
    net = build_net(name, classes, size, seed=0, channels=channels)
    trainer = recipe_trainer(net, None)
    loop = recipe_loop(net, trainer)
    if opts.amp != "none":
        amp.init_trainer(trainer)
        loop.amp = True
    batches = synthetic_batches(4, opts.batch, size, classes, channels=channels)

    def steps(n: int) -> float:
        mx.nd.waitall()
        t0 = time.perf_counter()
        for s in range(n):
            loop.train_step(*batches[s % len(batches)])
            loop.step += 1
        mx.nd.waitall()
        return (time.perf_counter() - t0) / n

    steps(3)  # warm-up: graph, static allocation, optimizer states
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        print(f"{steps(opts.steps):.9f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
