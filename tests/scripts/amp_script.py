"""A user's Gluon AMP script (MXNet's ``mxnet.contrib.amp``, bfloat16 on this CPU; float16 on a
GPU is the same code with ``target_dtype='float16'``), changed only in its Trainer line.

Argv: OUT_DIR TRAINER [--inf-at STEP --inf-rank R] [--clip NORM]. TRAINER is ``gluon`` (the
script as its author wrote it, one process) or ``mxlarge`` (the Trainer line replaced;
``kvstore='dist_sync'`` when launched, else one process). A conv net with BatchNorm, 6 steps.
``--inf-at`` puts an inf into rank R's first gradient at that step (an overflow only one rank
sees); ``--clip`` takes Gluon's split step to clip the unscaled summed gradients. Each rank
writes ``OUT_DIR/<trainer>-<rank>.params`` and prints ``amp_script rank=R num_update=N scale=S``.
"""
from __future__ import annotations

import argparse
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out_dir")
    p.add_argument("trainer", choices=["gluon", "mxlarge"])
    p.add_argument("--inf-at", type=int, default=-1)
    p.add_argument("--inf-rank", type=int, default=0)
    p.add_argument("--clip", type=float, default=0.0,
                   help="allreduce_grads(), amp.unscale, clip_global_norm to this, update()")
    opts = p.parse_args()
    import mxnet as mx  # a scheduler/server serves its role inside this import, then exits
    from mxnet import autograd, gluon
    from mxnet.contrib import amp

    amp.init(target_dtype="bfloat16")  # before the net is built, as AMP requires
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(),
            gluon.nn.Activation("relu"), gluon.nn.Conv2D(8, 3, padding=1),
            gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    optimizer_params = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
    if opts.trainer == "gluon":
        trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_params)
    else:
        import mxlarge
        launched = os.environ.get("DMLC_ROLE") == "worker"
        trainer = mxlarge.Trainer(net.collect_params(), "sgd", optimizer_params,
                                  kvstore="dist_sync" if launched else None,
                                  momentum_correction=False, decay_bn_bias=True)
    amp.init_trainer(trainer)
    rank = getattr(trainer, "rank", 0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    mx.random.seed(100 + rank)  # each rank its own data
    for step in range(6):
        x = mx.nd.random.normal(shape=(4, 3, 8, 8))
        y = mx.nd.array([(rank + step + j) % 4 for j in range(4)])
        with autograd.record():
            loss = loss_fn(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        if step == opts.inf_at and rank == opts.inf_rank:
            net[0].weight.grad()[:] = float("inf")
        if opts.clip:  # Gluon's documented way to touch the summed, unscaled gradients
            trainer.allreduce_grads()
            amp.unscale(trainer)
            gluon.utils.clip_global_norm([q.grad() for q in net.collect_params().values()
                                          if q.grad_req != "null"], opts.clip)
            trainer.update(x.shape[0])
        else:
            trainer.step(x.shape[0])
    mx.nd.waitall()
    net.save_parameters(f"{opts.out_dir}/{opts.trainer}-{rank}.params")
    print(f"amp_script rank={rank} num_update={trainer.optimizer.num_update} "
          f"scale={trainer._amp_loss_scaler.loss_scale}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
