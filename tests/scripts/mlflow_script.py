"""A script written for one process that logs to MLflow itself, on every rank: ``log_param``
before the Trainer exists, ``log_metric`` after every step. Its Trainer line is mxlarge's, and
one more line logs the trained net (``mxlarge.log_model``), also after a Ctrl-C at the
launcher (a KeyboardInterrupt on rank 0 as a step begins).

Usage: ``python mlflow_script.py STEPS``; 2 workers × 16 images against ``reference_batch=64``
(the LR is scaled down to 0.05).
"""
import sys

import mlflow
import mxnet as mx
from mxnet import autograd, gluon

import mxlarge

kv = mx.kv.create("dist_sync")
mlflow.log_param("script_lr", 0.1)
net = gluon.nn.Dense(4, in_units=8)
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = mxlarge.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                          kvstore=kv, reference_batch=64, warmup_steps=5)
mx.random.seed(0)
x_all = mx.nd.random.uniform(shape=(400, 8))
y_all = (x_all.sum(axis=1) > 4).astype("float32")
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
try:
    for step in range(int(sys.argv[1])):
        i = (step * kv.num_workers + kv.rank) % 25
        x, y = x_all[i * 16:(i + 1) * 16], y_all[i * 16:(i + 1) * 16]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(16)
        mlflow.log_metric("my_loss", float(loss.mean().asscalar()), step=step)
except KeyboardInterrupt:  # Ctrl-C at the launcher: rank 0, as its step begins
    print(f"mlflow_script rank={kv.rank} stopped after {trainer.num_update} steps", flush=True)
model = mxlarge.log_model(trainer, net, x_all[:4])  # the one line: rank 0 logs, others None
print(f"mlflow_script rank={kv.rank} model={model} done", flush=True)
