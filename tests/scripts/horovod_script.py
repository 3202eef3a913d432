"""A Horovod-style MNIST script migrated to ``mxlarge.Trainer``, as a user would write it.

Horovod's ``hvd.init(); rank, size = hvd.rank(), hvd.size()`` became the script's own
``kv = mx.kv.create('dist')`` (MXNet's synchronous store, as in its own examples);
``hvd.DistributedTrainer(params, opt)`` became ``mxlarge.Trainer(..., kvstore='dist_sync')``
(a second store by name, the same kind: mxlarge reuses the
process's); ``hvd.broadcast_parameters`` is gone (the Trainer gives every worker rank 0's
values, also for parameters initialised at the first forward, which this net's all are).
The data is split with a sampler over this rank's part, unless ``--unsharded`` (every worker
reads all of it). Every worker seeds MXNet with its rank. ``--trainer-kvstore`` names another
store type for the Trainer (refused: the process has a 'dist' store). Horovod's
``--fp16-allreduce`` and ``--gradient-predivide-factor`` are kept (see their comment).

Usage, under ``python -m mxlarge.launcher -n 2 -s 1 --``: ``python horovod_script.py --data
D.npz --out PREFIX [--unsharded] [--epochs E] [--batch-size n]``; writes
``PREFIX-first-<rank>.params`` (what the first forward used), ``PREFIX-out0-<rank>.npy`` (its
output) and ``PREFIX-<rank>.params`` (final).
"""
import argparse

import mxnet as mx
import numpy as np
from gluoncv.data.sampler import SplitSampler
from mxnet import autograd, gluon

import mxlarge

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--samples", type=int, default=128, help="images used (of the file)")
parser.add_argument("--unsharded", action="store_true")
parser.add_argument("--trainer-kvstore", default="dist_sync")
# Horovod's MNIST example's flags, migrated: --fp16-allreduce (hvd.Compression.fp16) is the
# 16-bit wire; --gradient-predivide-factor is passed on (mxlarge takes 1.0 only, saying why)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
args = parser.parse_args()

kv = mx.kv.create("dist")
rank, size = kv.rank, kv.num_workers

arrays = np.load(args.data)
dataset = gluon.data.ArrayDataset(arrays["x"][:args.samples], arrays["y"][:args.samples])
sampler = (gluon.data.SequentialSampler(len(dataset)) if args.unsharded else
           SplitSampler(len(dataset), num_parts=size, part_index=rank))
train_data = gluon.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                   last_batch="discard")

mx.random.seed(rank)
net = gluon.nn.Sequential()
net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())

optimizer_params = {"learning_rate": 0.05 * size, "momentum": 0.9, "wd": 1e-4}
trainer = mxlarge.Trainer(net.collect_params(), "sgd", optimizer_params,
                          kvstore=args.trainer_kvstore,
                          wire_dtype="float16" if args.fp16_allreduce else "float32",
                          gradient_predivide_factor=args.gradient_predivide_factor)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

for epoch in range(args.epochs):
    for i, (data, label) in enumerate(train_data):
        with autograd.record():
            output = net(data)
            loss = loss_fn(output, label)
        loss.backward()
        if epoch == 0 and i == 0:
            net.save_parameters(f"{args.out}-first-{rank}.params")
            np.save(f"{args.out}-out0-{rank}.npy", output.asnumpy())
        trainer.step(args.batch_size)
mx.nd.waitall()
net.save_parameters(f"{args.out}-{rank}.params")
wire = trainer.settings.wire_dtype
print(f"horovod_script rank {rank} of {size} done, wire {wire}", flush=True)
