"""A GluonCV ``--dtype float16``-shaped script (``net.cast('float16')`` and
``optimizer_params['multi_precision'] = True``), changed only in its Trainer line.

On this CPU float16 convolutions and GEMM are not implemented, so the net is elementwise: a
per-feature affine map, a tanh, BatchNorm and a weighted sum, trained to regress a target. On a
GPU the same lines train a cast ResNet. Argv: OUT_DIR TRAINER (``gluon``, one process, or
``mxlarge``: ``kvstore='dist_sync'`` when launched) [--wire float16]. 6 steps; each rank
writes ``OUT_DIR/<trainer>-<rank>.params`` and ``OUT_DIR/<trainer>-<rank>.states``.
"""
from __future__ import annotations

import argparse
import os
import sys


def build(mx):
    """The elementwise net: h = tanh(x·w1 + b1), BatchNorm(h), y = Σ_f h·w2 + b2. Gluon keeps
    BatchNorm's parameters in float32 through ``cast``, so the net mixes float16 and float32
    tensors, as a cast ResNet does."""
    from mxnet import gluon

    class Affine(gluon.HybridBlock):
        def __init__(self, features: int = 64, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.w1 = self.params.get("w1", shape=(features,), init=mx.init.Normal(0.5))
                self.b1 = self.params.get("b1", shape=(features,), init=mx.init.Zero())

        def hybrid_forward(self, F, x, w1, b1):
            return F.tanh(F.broadcast_add(F.broadcast_mul(x, w1), b1))

    class Readout(gluon.HybridBlock):
        def __init__(self, features: int = 64, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.w2 = self.params.get("w2", shape=(features,), init=mx.init.Normal(0.5))
                self.b2 = self.params.get("b2", shape=(1,), init=mx.init.Zero())

        def hybrid_forward(self, F, h, w2, b2):
            return F.broadcast_add(F.sum(F.broadcast_mul(h, w2), axis=1, keepdims=True), b2)

    net = gluon.nn.HybridSequential()
    net.add(Affine(), gluon.nn.BatchNorm(in_channels=64), Readout())
    return net


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("trainer", choices=["gluon", "mxlarge"])
    p.add_argument("--wire", default="float32")
    opts = p.parse_args()
    import mxnet as mx  # a scheduler/server serves its role inside this import, then exits
    from mxnet import autograd, gluon

    mx.random.seed(0)
    net = build(mx)
    net.initialize()
    net.cast("float16")
    net.hybridize()
    optimizer_params = {"learning_rate": 0.05, "momentum": 0.9, "wd": 1e-4}
    optimizer_params["multi_precision"] = True
    if opts.trainer == "gluon":
        trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_params)
    else:
        import mxlarge
        launched = os.environ.get("DMLC_ROLE") == "worker"
        trainer = mxlarge.Trainer(net.collect_params(), "sgd", optimizer_params,
                                  kvstore="dist_sync" if launched else None,
                                  momentum_correction=False, decay_bn_bias=True,
                                  wire_dtype=opts.wire)
    rank = getattr(trainer, "rank", 0)
    loss_fn = gluon.loss.L2Loss()
    mx.random.seed(100 + rank)  # each rank its own data
    for _ in range(6):
        x = mx.nd.random.normal(shape=(16, 64)).astype("float16")
        y = (x.astype("float32").sum(axis=1, keepdims=True) * 0.1).astype("float16")
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    mx.nd.waitall()
    net.save_parameters(f"{opts.out_dir}/{opts.trainer}-{rank}.params")
    trainer.save_states(f"{opts.out_dir}/{opts.trainer}-{rank}.states")
    print(f"fp16_script rank={rank} done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
