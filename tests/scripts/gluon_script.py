"""A GluonCV-style training script (own loop, own data split, ``gluon.Trainer``) for the
migration tests: ``tests/e2e/test_migration.py`` changes only its Trainer line (and adds
``import mxlarge``) and checks the result.

Shaped like GluonCV's ``train_imagenet.py``: ``net.initialize()`` with the shapes learnt at the
first forward (``--net conv``/``conv-bn``), optionally hybridized; NAG or SGD; an LRSequential
of a linear warmup and a cosine or step decay (``--lr-mode``; ``multifactor`` is MXNet's
MultiFactorScheduler without warmup); ``trainer.step(batch_size)`` with no step;
``--resume-params/--resume-states/--resume-epoch``; params and states saved after every epoch.
Every worker seeds MXNet with its rank (so an initial broadcast that did not happen shows).

Usage: ``python gluon_script.py --data D.npz --kvstore local|dist_sync --batch-size n
--steps T --out PREFIX``; writes ``PREFIX-init.params`` (rank 0, ``--net dense`` only),
``PREFIX-first-<rank>.params`` (the parameters the first forward used) and
``PREFIX-out0-<rank>.npy`` (its output), ``PREFIX-<rank>.params`` (final), and with
``--save-dir`` ``DIR/e<epoch>.params|.states`` (rank 0) and ``DIR/e<epoch>-<rank>.params`` (every
rank: its own BN running statistics); ``--resume-params`` may name ``{rank}``.
"""
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--kvstore", default="local")
parser.add_argument("--batch-size", type=int, default=8, help="per worker")
parser.add_argument("--steps", type=int, default=12, help="per epoch")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--wd", type=float, default=5e-4)
parser.add_argument("--net", choices=["dense", "conv", "conv-bn"], default="dense")
parser.add_argument("--hybridize", action="store_true")
parser.add_argument("--optimizer", choices=["sgd", "nag"], default="sgd")
parser.add_argument("--lr-mode", choices=["multifactor", "cosine", "step"],
                    default="multifactor")
parser.add_argument("--warmup-epochs", type=int, default=0)
parser.add_argument("--unsharded", action="store_true",
                    help="every worker reads the same batches (an unsplit RecordIO)")
parser.add_argument("--resume-epoch", type=int, default=0)
parser.add_argument("--resume-params", default="")
parser.add_argument("--resume-states", default="")
parser.add_argument("--save-dir", default="")
parser.add_argument("--out", required=True)
opt = parser.parse_args()

kv = mx.kv.create(opt.kvstore)
rank, num_workers = kv.rank, kv.num_workers
arrays = np.load(opt.data)
X, Y = arrays["x"], arrays["y"]

mx.random.seed(rank)
if opt.net == "dense":
    net = gluon.nn.Dense(10, in_units=X.shape[1])
else:
    X = X.reshape(len(X), 1, 8, 8)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1))
    if opt.net == "conv-bn":
        net.add(gluon.nn.BatchNorm())
    net.add(gluon.nn.Activation("relu"), gluon.nn.MaxPool2D(2), gluon.nn.Dense(10))
if opt.resume_params:
    net.load_parameters(opt.resume_params.format(rank=rank))
else:
    net.initialize(mx.init.Xavier())
if opt.hybridize:
    net.hybridize()
if rank == 0 and opt.net == "dense":
    net.save_parameters(f"{opt.out}-init.params")

n, steps = opt.batch_size, opt.steps
if opt.lr_mode == "multifactor":
    lr_scheduler = mx.lr_scheduler.MultiFactorScheduler(step=[8], factor=0.1, base_lr=opt.lr)
else:
    from gluoncv.utils import LRScheduler, LRSequential

    lr_scheduler = LRSequential([
        LRScheduler("linear", base_lr=0, target_lr=opt.lr, nepochs=opt.warmup_epochs,
                    iters_per_epoch=steps),
        LRScheduler(opt.lr_mode, base_lr=opt.lr, target_lr=0,
                    nepochs=opt.epochs - opt.warmup_epochs, iters_per_epoch=steps,
                    step_epoch=[opt.epochs - 1], step_factor=0.1)])
optimizer_params = {"learning_rate": opt.lr, "momentum": 0.9, "wd": opt.wd,
                    "lr_scheduler": lr_scheduler}
trainer = gluon.Trainer(net.collect_params(), opt.optimizer, optimizer_params, kvstore=kv)
if opt.resume_states:
    trainer.load_states(opt.resume_states)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

for epoch in range(opt.resume_epoch, opt.epochs):
    for step in range(steps):
        b = epoch * steps + step  # global batch b
        lo = b * n if opt.unsharded else (b * num_workers + rank) * n  # this worker's slice
        data, label = mx.nd.array(X[lo:lo + n]), mx.nd.array(Y[lo:lo + n])
        with autograd.record():
            out = net(data)
            loss = loss_fn(out, label)
        loss.backward()
        if epoch == opt.resume_epoch and step == 0:
            net.save_parameters(f"{opt.out}-first-{rank}.params")
            np.save(f"{opt.out}-out0-{rank}.npy", out.asnumpy())
        trainer.step(n)
    mx.nd.waitall()
    if opt.save_dir:
        net.save_parameters(f"{opt.save_dir}/e{epoch + 1}-{rank}.params")
    if rank == 0:
        print(f"[Epoch {epoch}] lr={trainer.learning_rate:.6f} "
              f"num_update={trainer.optimizer.num_update}", flush=True)
        if opt.save_dir:
            net.save_parameters(f"{opt.save_dir}/e{epoch + 1}.params")
            trainer.save_states(f"{opt.save_dir}/e{epoch + 1}.states")
net.save_parameters(f"{opt.out}-{rank}.params")
