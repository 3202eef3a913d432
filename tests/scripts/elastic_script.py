"""A user's own Gluon script written for ``python -m mxlarge.launcher --elastic``.

What makes it elastic, beside the Trainer line: the data of each step is unit u's of
``trainer.num_units`` (unit u is worker u of the declared world), computed under each of
``trainer.units()``, and it resumes through ``mxlarge.resume``. After a lost worker the
launcher runs it as 1 worker x 2 simulated workers and the training is the same.

Options: ``--steps N`` (default 60), ``--ckpt DIR`` and ``--save-every K`` (default 10),
``--sleep SECONDS`` before each step (a window to kill a worker), ``--final DIR`` (the last
state saved there too, for the tests to compare).
"""
import argparse
import os
import time

if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
    import mxnet  # noqa: F401  (runs the ps-lite role and exits)

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

import mxlarge  # noqa: E402
import mxlarge.resume  # noqa: E402

BATCH = 16  # images per unit and step


def shard(step: int, unit: int) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """Unit ``unit``'s batch of step ``step``: the same whichever process computes it."""
    rng = np.random.RandomState(1000 * step + unit)
    x = rng.uniform(-1, 1, size=(BATCH, 8)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32") + 2 * (x[:, 2] > 0)
    return mx.nd.array(x), mx.nd.array(y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--final", default=None)
    a = p.parse_args()

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net(shard(0, 0)[0])  # every shape known before the Trainer
    trainer = mxlarge.Trainer(net.collect_params(), "sgd",
                              {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4},
                              kvstore="dist_sync", reference_batch=32, warmup_steps=10)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = mxlarge.resume.restore(a.ckpt, net, trainer)
    print(f"elastic_script rank={trainer.rank} units={trainer.num_units} start={start}",
          flush=True)
    for step in range(start, a.steps):
        time.sleep(a.sleep)
        mine = 0
        for unit, ctx in trainer.units():
            x, y = shard(step, unit)
            with autograd.record():
                loss = loss_fn(net(x.as_in_context(ctx)), y.as_in_context(ctx))
            loss.backward()
            mine += BATCH
        trainer.step(mine, step)
        if (step + 1) % a.save_every == 0:
            mxlarge.resume.save(a.ckpt, step + 1, net, trainer)
    if a.final is not None:
        mxlarge.resume.save(a.final, a.steps, net, trainer)
    print(f"elastic_script rank={trainer.rank} done", flush=True)


if __name__ == "__main__":
    main()
