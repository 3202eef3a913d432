"""Gluon's usual init pattern under dist_sync, as a user's own script (run by the launcher).

``net.initialize()``, one forward pass in inference mode (which gives shapes, and on CPU leaves
the convolution weights in MKLDNN's layout), then ``mxlarge.Trainer(..., kvstore='dist_sync')``
and a few steps. Argv: OUT_DIR HYBRIDIZE(0/1). Every worker writes ``OUT_DIR/rank-<r>.params``.
"""
from __future__ import annotations

import sys


def main() -> int:
    out_dir, hybridize = sys.argv[1], sys.argv[2] == "1"
    import mxnet as mx  # a scheduler/server serves its role inside this import, then exits

    from mxlarge.protocol.failfast import fail_fast

    with fail_fast():
        from mxnet import autograd, gluon

        import mxlarge

        mx.random.seed(0)
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(),
                gluon.nn.Activation("relu"), gluon.nn.Conv2D(8, 3, padding=1),
                gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
                gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(4))
        net.initialize(mx.init.Xavier())
        if hybridize:
            net.hybridize()
        net(mx.nd.zeros((2, 3, 8, 8)))  # inference mode: shapes known
        trainer = mxlarge.Trainer(net.collect_params(), lambda step: 0.1,
                                  kvstore="dist_sync")
        rank = trainer.rank
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        mx.random.seed(100 + rank)  # each rank its own data
        for step in range(4):
            x = mx.nd.random.normal(shape=(4, 3, 8, 8))
            y = mx.nd.array([(rank + step + j) % 4 for j in range(4)])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(x.shape[0], step)
            trainer.check_replicas(step)
        mx.nd.waitall()
        net.save_parameters(f"{out_dir}/rank-{rank}.params")
        print(f"gluon_loop_worker done rank={rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
