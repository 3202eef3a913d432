"""A user's own Gluon training script with ``mxlarge.Trainer(kvstore='dist_sync')``.

Run as every role under ``python -m mxlarge.launcher -n 2 -s 1 -- python own_loop.py ...``.
Nothing in it knows about ps-lite's exit barrier, heartbeats or the launcher: what the tests
check is what mxlarge gives such a script for free.

Options:

``--steps N``
    train N steps of a small dense net on fixed random data (default 20).
``--raise-rank R --raise-step S``
    the worker of kvstore rank R raises ``RuntimeError`` before step S.
``--sleep-from S --sleep SECONDS``
    every worker sleeps before each step from S on (a window to stop or kill one).
``--busy-at S --busy SECONDS``
    every worker spends SECONDS in ``trainer.busy("evaluating")`` before step S (a long
    evaluation: the watchdog's busy allowance).
``--ckpt DIR --save-every K``
    the resume hook of docs/trainer.md: ``mxlarge.resume.restore`` at the start, ``save`` every K
    steps.
``--raise-once FILE``
    with ``--raise-rank/--raise-step``: raise only if FILE does not exist yet (creating it),
    i.e. in the first attempt of a restarted job.
``--out PATH``
    rank 0 saves the final parameters there.
"""
import argparse
import os
import time

if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
    import mxnet  # noqa: F401  (runs the ps-lite role and exits)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import mxlarge  # noqa: E402
import mxlarge.resume  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--raise-rank", type=int, default=-1)
    p.add_argument("--raise-step", type=int, default=-1)
    p.add_argument("--sleep-from", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--busy-at", type=int, default=-1)
    p.add_argument("--busy", type=float, default=0.0)
    p.add_argument("--ckpt", default=None)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--raise-once", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(32, 8))
    y = mx.nd.floor(mx.nd.random.uniform(0, 4, shape=(32,)))
    net(x)
    trainer = mxlarge.Trainer(net.collect_params(), lambda step: 0.1, kvstore="dist_sync")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = 0 if a.ckpt is None else mxlarge.resume.restore(a.ckpt, net, trainer)
    print(f"own_loop rank={trainer.rank} pid={os.getpid()} start={start}", flush=True)
    for step in range(start, a.steps):
        if trainer.rank == a.raise_rank and step == a.raise_step:
            if a.raise_once is None or not os.path.exists(a.raise_once):
                if a.raise_once is not None:
                    open(a.raise_once, "w").close()
                raise RuntimeError(f"own_loop raising at step {step}")
        if 0 <= a.sleep_from <= step:
            time.sleep(a.sleep)
        if step == a.busy_at:
            with trainer.busy("evaluating"):
                time.sleep(a.busy)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0], step)
        print(f"own_loop rank={trainer.rank} step={step}", flush=True)
        if a.ckpt is not None and (step + 1) % a.save_every == 0:
            mxlarge.resume.save(a.ckpt, step + 1, net, trainer)
    if a.out is not None and trainer.rank == 0:
        net.save_parameters(a.out)
    print(f"own_loop rank={trainer.rank} done lead={trainer.store.lead}", flush=True)


if __name__ == "__main__":
    main()
