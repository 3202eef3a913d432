"""Worker script of the peers' accuracy twin: the MNIST-1D recipe at 16× through one peer's trainer.

Started like :mod:`benchmarks.peer_worker` (every role of a dist_sync job, or every rank of a
``horovodrun`` job). The experiment is ``experiments/proxy/mnist1d-recipe.yaml`` with
:data:`OVERRIDES`: 2 workers × 256 signals = global batch 512 = 16 × the reference 32; 16 epochs
of 39 steps over 20,000 signals; LR 0.05 × 16 = 0.8 after a 2-epoch linear warmup from 0.05,
÷10 at epochs 8 and 12; momentum 0.9, λ 5e-4; the 1-D ResNet with zero-γ: same data shards,
net, initialisation (seed) and loop for every peer; only the trainer line differs.

* ``mxlarge``: ``mxlarge.Trainer(params, plan.schedule, momentum, weight_decay, kvstore=kv,
  bn_stats=...)``, what ``mxlarge train`` runs: the schedule of :func:`mxlarge.plan.plan`,
  momentum correction, no decay on BN γ/β and biases, evaluation with the workers' BN
  statistics averaged (``bn_stats: reduce``).
* the peers, as a user would write the same recipe with MXNet's own tools: LR 0.8 and
  ``mx.lr_scheduler.MultiFactorScheduler(step=decay steps, factor=0.1, base_lr=0.8,
  warmup_steps=W, warmup_begin_lr=0.05, warmup_mode='linear')`` (MXNet asks it for update
  u = t + 1, so its warmup runs one step ahead of mxlarge's), decay on every tensor, no
  momentum correction (eq. 10 across the two LR drops and every warmup step), evaluation with
  rank 0's own BN statistics. The step argument is each peer's global-mean form
  (:mod:`benchmarks.peer_worker`).

Every rank evaluates the whole validation set after each epoch; rank 0 reports the errors, the
final error (median of the last 5 epochs, Goyal et al.'s rule) and the training wall time.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import mxnet as mx

from benchmarks.common import ROOT, emit_result, worker_main

CONFIG = Path(ROOT) / "experiments" / "proxy" / "mnist1d-recipe.yaml"
#: 16× the reference batch of 32 with 2 real workers: n = 256 per worker.
OVERRIDES = ["data.batch_size=256", "dist.workers=2", "dist.kvstore=dist_sync"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peer", required=True,
                   choices=("mxlarge", "gluon_kv", "gluon", "horovod"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=None,
                   help="shorter runs (smoke tests): warmup and drops scale with the epochs")
    return p.parse_args(argv)


def peer_trainer(peer: str, params: Any, plan: Any, cfg: Any) -> tuple[Any, int, int]:
    """(trainer, rank, k) for ``peer``; the peers' optimizer is the hand-written recipe."""
    o = cfg.optim
    if peer == "horovod":
        import horovod.mxnet as hvd

        hvd.init()
        hvd.broadcast_parameters(params, root_rank=0)
        rank, k, kv = hvd.rank(), hvd.size(), None
    else:
        kv = mx.kv.create("dist_sync")
        rank, k = kv.rank, kv.num_workers
    if peer == "mxlarge":
        import mxlarge

        return (mxlarge.Trainer(params, plan.schedule, momentum=o.momentum,
                                weight_decay=o.weight_decay, kvstore=kv,
                                bn_stats=cfg.dist.bn_stats), rank, k)
    sched = mx.lr_scheduler.MultiFactorScheduler(
        step=[int(d) for d in plan.decay_steps], factor=float(o.decay_factor),
        base_lr=float(plan.peak_lr), warmup_steps=int(plan.warmup_steps),
        warmup_begin_lr=float(plan.warmup_lr), warmup_mode="linear")
    opt = {"learning_rate": float(plan.peak_lr), "momentum": float(o.momentum),
           "wd": float(o.weight_decay), "lr_scheduler": sched}
    if peer == "horovod":
        import horovod.mxnet as hvd

        return hvd.DistributedTrainer(params, "sgd", opt), rank, k
    trainer = mx.gluon.Trainer(params, "sgd", opt, kvstore=kv,
                               update_on_kvstore=None if peer == "gluon_kv" else False)
    if peer == "gluon":  # the initial-broadcast race (benchmarks.peer_worker.make_trainer)
        trainer._init_kvstore()
        trainer._init_params()
        mx.nd.waitall()
    return trainer, rank, k


def work(opts: argparse.Namespace) -> None:
    from mxnet import autograd

    from mxlarge.config import load_config
    from mxlarge.data import build_data
    from mxlarge.nets import build_net, initialize
    from mxlarge.plan import plan_for
    from mxlarge.stats import final_error

    overrides = [*OVERRIDES, f"train.seed={opts.seed}"]
    if opts.epochs is not None:
        o = load_config(CONFIG, OVERRIDES).optim
        f = opts.epochs / load_config(CONFIG, OVERRIDES).train.epochs
        overrides += [f"train.epochs={opts.epochs}", f"optim.warmup_epochs={o.warmup_epochs * f}",
                      f"optim.decay_epochs={[e * f for e in o.decay_epochs]}"]
    cfg = load_config(CONFIG, overrides)
    plan = plan_for(cfg)
    net = build_net(cfg.model, 10)
    # the net first (its initialisation needs no data), then the trainer: its rank shards data
    from mxlarge.data.mnist1d import INPUT_SHAPE

    initialize(net, cfg.model, seed=opts.seed, ctx=[mx.cpu()], input_shape=INPUT_SHAPE)
    trainer, rank, k = peer_trainer(opts.peer, net.collect_params(), plan, cfg)
    data = build_data(cfg.data, rank=rank, num_workers=k, seed=opts.seed)
    n = cfg.data.batch_size
    b = k * n if opts.peer in ("gluon_kv", "gluon") else n
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()

    def val_error() -> float:
        wrong = total = 0
        for x, y in data.val.batches(256):
            pred = net(x).argmax(axis=1)
            wrong += int((pred != y).sum().asscalar())
            total += x.shape[0]
        return wrong / total

    errors, t, t0 = [], 0, time.perf_counter()
    for epoch in range(cfg.train.epochs):
        for x, y in data.train.epoch(epoch):
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            if opts.peer == "mxlarge":
                trainer.step(n, t)
            else:
                trainer.step(b)
            t += 1
        if opts.peer == "mxlarge":
            with trainer.bn.evaluation():
                errors.append(val_error())
        else:
            errors.append(val_error())
    mx.nd.waitall()
    emit_result({"rank": rank, "peer": opts.peer, "seed": opts.seed, "workers": k,
                 "steps": t, "val_errors": errors, "final_error": final_error(errors),
                 "seconds": time.perf_counter() - t0})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
