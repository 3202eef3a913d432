"""A GluonCV-style training script (own loop, own data split, ``gluon.Trainer``) for the
migration test: ``tests/e2e/test_migration.py`` changes only its Trainer line (and adds
``import mxlarge``) and checks the result against NumPy.

Usage: ``python gluon_script.py --data D.npz --kvstore local|dist_sync --batch-size n
--steps T --out PREFIX``; writes ``PREFIX-init.params`` and ``PREFIX-<rank>.params``.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--kvstore", default="local")
parser.add_argument("--batch-size", type=int, default=8, help="per worker")
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--out", required=True)
opt = parser.parse_args()

kv = mx.kv.create(opt.kvstore)
rank, num_workers = kv.rank, kv.num_workers
arrays = np.load(opt.data)
X, Y = arrays["x"], arrays["y"]

mx.random.seed(0)
net = gluon.nn.Dense(10, in_units=X.shape[1])
net.initialize(mx.init.Xavier())
if rank == 0:
    net.save_parameters(f"{opt.out}-init.params")

lr_scheduler = mx.lr_scheduler.MultiFactorScheduler(step=[8], factor=0.1, base_lr=opt.lr)
optimizer_params = {"learning_rate": opt.lr, "momentum": 0.9, "wd": 5e-4,
                    "lr_scheduler": lr_scheduler}
trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_params, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

n = opt.batch_size
for step in range(opt.steps):
    lo = (step * num_workers + rank) * n  # this worker's slice of global batch `step`
    data, label = mx.nd.array(X[lo:lo + n]), mx.nd.array(Y[lo:lo + n])
    with autograd.record():
        loss = loss_fn(net(data), label)
    loss.backward()
    trainer.step(n)
mx.nd.waitall()
net.save_parameters(f"{opt.out}-{rank}.params")
