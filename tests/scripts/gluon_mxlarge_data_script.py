"""The migrated script's loop on mxlarge's data shard and model zoo (as a GluonCV script uses
GluonCV's), so that ``tests/e2e/test_migration.py`` can compare it with ``mxlarge train`` on
the same images. Usage: ``python gluon_mxlarge_data_script.py CONFIG KVSTORE OUT_PREFIX``;
writes ``OUT_PREFIX-<rank>.params`` after 12 steps.
"""
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxlarge
from mxlarge import nets
from mxlarge.config import load_config
from mxlarge.data import build_data

cfg = load_config(sys.argv[1])
kv = mx.kv.create(sys.argv[2])
mx.random.seed(cfg.train.seed)
np.random.seed(cfg.train.seed)
data = build_data(cfg.data, rank=kv.rank, num_workers=kv.num_workers, seed=cfg.train.seed)
net = nets.build_net(cfg.model, data.num_classes)
nets.initialize(net, cfg.model, seed=cfg.train.seed, ctx=[mx.cpu()],
                input_shape=data.input_shape)
net.hybridize(static_alloc=True, static_shape=True)

lr_scheduler = mx.lr_scheduler.MultiFactorScheduler(step=[10], factor=0.1, base_lr=0.05)
optimizer_params = {"learning_rate": 0.05, "momentum": 0.9, "wd": 5e-4,
                    "lr_scheduler": lr_scheduler}
trainer = mxlarge.Trainer(net.collect_params(), "sgd", optimizer_params, kvstore=kv,
                          reference_batch=8, warmup_steps=7)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for step, (x, y) in enumerate(data.train.epoch(0)):
    if step == 12:
        break
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(x.shape[0])
mx.nd.waitall()
net.save_parameters(f"{sys.argv[3]}-{kv.rank}.params")
