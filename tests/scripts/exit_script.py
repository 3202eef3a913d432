"""A script shape users write: a small conv net with BatchNorm, ``net.initialize()`` plus an
inference forward, a dist_sync Trainer, 5 steps, and the script ends right after its last
``trainer.step()`` (no ``mx.nd.waitall()``), as most scripts end.

Usage: ``python exit_script.py [--trainer mxlarge|mxlarge-own-store|gluon|gluon-sync]
[--steps N] [--hang-in-exit] [--raise-at-end]``. ``mxlarge-own-store``: ``mxlarge.Trainer``
given the script's own ``mx.kv.create('dist_sync')`` (README's "Your own script").
``gluon``: ``gluon.Trainer(kvstore='dist_sync')`` (MXNet's own store); ``gluon-sync``:
``gluon.Trainer`` given a store from ``mxlarge.kvstore.sync.create``.
``--hang-in-exit``: rank 1 hangs in an ``atexit`` handler that runs after everything else (a
process stuck in its exit after its work is done). ``--raise-at-end``: rank 1 raises right
after its last step.
"""
import argparse
import atexit
import os
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxlarge
from mxlarge.kvstore import sync

parser = argparse.ArgumentParser()
parser.add_argument("--trainer", default="mxlarge",
                    choices=["mxlarge", "mxlarge-own-store", "gluon", "gluon-sync"])
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--hang-in-exit", action="store_true")
parser.add_argument("--raise-at-end", action="store_true")
opt = parser.parse_args()

rank = []  # this worker's kvstore rank, once known
if opt.hang_in_exit:
    # Registered before the store exists, so it runs after mxlarge's own exit handler: the
    # worker has said it finished, then never exits.
    atexit.register(lambda: rank == [1] and time.sleep(3600))

net = gluon.nn.HybridSequential()
net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
        gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(10))
net.initialize()
x = mx.nd.array(np.random.default_rng(os.getpid()).uniform(size=(8, 1, 8, 8)))  # own data
y = mx.nd.array([i % 10 for i in range(8)])
net(x)  # an inference forward: the shapes are known from here on
if opt.trainer == "mxlarge":
    trainer = mxlarge.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                              kvstore="dist_sync")
elif opt.trainer == "mxlarge-own-store":
    trainer = mxlarge.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                              kvstore=mx.kv.create("dist_sync"))
elif opt.trainer == "gluon":
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                            kvstore="dist_sync")
else:
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                            kvstore=sync.create("dist_sync"))
if opt.trainer.startswith("mxlarge"):
    rank.append(trainer.rank)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for _ in range(opt.steps):
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(8)
print(f"done {opt.steps} steps", flush=True)
if opt.raise_at_end and sync.live_dist_store().rank == 1:
    raise RuntimeError("exit_script raising after its last step")
