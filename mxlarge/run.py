"""Builds a training run from a config: store, net, data, schedule, trainer, hooks; runs it.

The same function runs in one process and inside every worker of a launched job: the rank and
world size come from the KVStore, the per-worker batch n stays as configured, and the global
batch k·n drives the LR scaling rule (:func:`mxlarge.config.derive`).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from mxlarge.config import Config, ConfigError, derive


@dataclass
class RunResult:
    run_id: str | None
    rank: int
    num_workers: int
    steps: int
    history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def final(self) -> dict[str, float]:
        return self.history[-1] if self.history else {}


def _warn_config_changes(old_yaml: str, new_yaml: str, rank: int) -> None:
    """Resuming with other settings is allowed (e.g. more epochs); say what changed."""
    import yaml

    from mxlarge.config import config_from_dict, flatten

    if rank != 0 or old_yaml == new_yaml:
        return
    old = flatten(config_from_dict(yaml.safe_load(old_yaml), "checkpoint"))
    new = flatten(config_from_dict(yaml.safe_load(new_yaml), "config"))
    changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in new if old.get(k) != new[k]]
    if changed:
        print("mxlarge: resuming with changed settings: " + "; ".join(changed), flush=True)


def contexts(devices: int = 1, device_type: str = "cpu") -> list:
    """``mx.cpu(i)`` or ``mx.gpu(i)`` for i < devices (MXNet treats cpu(i) as separate devices)."""
    import mxnet as mx
    make = mx.gpu if device_type == "gpu" else mx.cpu
    return [make(i) for i in range(devices)]


@dataclass
class Built:
    """What :func:`build` makes: the parts of one run on this rank."""

    net: Any
    data: Any
    trainer: Any
    derived: Any
    schedule: Any
    ctx: list
    init_report: Any
    rank: int
    workers: int


def build(cfg: Config, source: str = "<config>", kv: Any = None) -> Built:
    """Everything a run needs, in dependency order: store (rank, world size), scaling, data
    shard, net with Goyal init, schedule, trainer."""
    import mxnet as mx
    import numpy as np

    from mxlarge import data as data_mod
    from mxlarge import nets, schedulers
    from mxlarge.kvstore import sync
    from mxlarge.trainer import Trainer

    if kv is None and (cfg.dist.kvstore.startswith("dist")):
        kv = sync.create(cfg.dist.kvstore)
    rank = kv.rank if kv is not None else 0
    workers = kv.num_workers if kv is not None else 1
    simulated = cfg.dist.simulate_workers
    train_samples = data_mod.train_size(cfg.data)
    derived = derive(cfg, workers * simulated, train_samples, source)
    ctx = contexts(cfg.dist.devices, cfg.dist.device_type)
    # Same seed on every rank: identical init (rank 0's is broadcast anyway).
    mx.random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    # A worker's batch is devices x (simulated workers) x n consecutive images of the global
    # order, so that each device / virtual worker sees exactly what a real worker would.
    per_worker = dataclasses.replace(cfg.data,
                                     batch_size=cfg.data.batch_size * cfg.dist.devices * simulated)
    data = data_mod.build_data(per_worker, rank=rank, num_workers=workers, seed=cfg.train.seed)
    net = nets.build_net(cfg.model, data.num_classes)
    init_report = nets.initialize(net, cfg.model, seed=cfg.train.seed, ctx=ctx,
                                  input_shape=data.input_shape)
    if cfg.model.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    schedule = schedulers.from_config(cfg, derived)
    if cfg.train.gns_every and derived.global_batch == cfg.data.batch_size:
        raise ConfigError(f"{source}: train.gns_every = {cfg.train.gns_every}: the gradient noise "
                          "scale needs 2 or more workers, devices or simulated workers")
    o = cfg.optim
    compression = ({"type": "2bit", "threshold": cfg.dist.compression_threshold}
                   if cfg.dist.compression == "2bit" else None)
    trainer = Trainer(net.collect_params(), schedule, momentum=o.momentum, nesterov=o.nesterov,
                      momentum_correction=o.momentum_correction, weight_decay=o.weight_decay,
                      decay_bn_bias=o.decay_bn_bias, lars=o.lars, lars_eta=o.lars_eta,
                      kvstore=kv if kv is not None else cfg.dist.kvstore,
                      compression=compression, bn_stats=cfg.dist.bn_stats,
                      simulate_workers=simulated)
    return Built(net=net, data=data, trainer=trainer, derived=derived, schedule=schedule,
                 ctx=ctx, init_report=init_report, rank=rank, workers=workers)


def train(cfg: Config, source: str = "<config>", resume: str | None = None) -> RunResult:
    """Trains per ``cfg``; tracks in MLflow on rank 0 unless ``tracking.enabled`` is false.

    A launched job passes its MLflow run through ``MXLARGE_RUN_ID``/``MLFLOW_TRACKING_URI``.
    ``resume`` (``latest`` or a checkpoint directory) continues a run exactly where its
    checkpoint left it, in the same MLflow run.
    """
    import mxnet as mx

    from mxlarge import checkpoint
    from mxlarge import loop as L
    from mxlarge.config import checkpoint_root, dump_yaml

    t0 = time.perf_counter()
    ckpt_root = checkpoint_root(cfg)
    ckpt = meta = None
    if resume is not None:  # verify before anything is built or written
        ckpt = checkpoint.resolve(resume, ckpt_root)
        meta = checkpoint.read_meta(ckpt)
    # Building first validates the model and the data before any file is written.
    b = build(cfg, source)
    trainer, data, derived = b.trainer, b.data, b.derived
    rank = b.rank
    layout = checkpoint.Layout(b.workers, cfg.dist.devices, cfg.dist.simulate_workers)
    start_epoch = 0
    if ckpt is not None:
        checkpoint.restore(ckpt, meta, net=b.net, trainer=trainer, layout=layout)
        start_epoch = meta["epoch"]
        _warn_config_changes(meta["config"], dump_yaml(cfg), rank)
    uri = None
    run_id = os.environ.get("MXLARGE_RUN_ID") or (meta or {}).get("run_id") or None
    owns_run = "MXLARGE_RUN_ID" not in os.environ
    if cfg.tracking.enabled:
        from mxlarge import tracking
        uri = tracking.tracking_uri(cfg)
        tracking.check_reachable(uri)
    hooks: list[L.Hook] = [L.LossHook(cfg.train.log_every, cfg.train.divergence_factor),
                           L.TimerHook(),
                           L.EvalHook(data.val, batch_size=max(cfg.data.batch_size, 64),
                                      every=cfg.train.eval_every)]
    if trainer.store.distributed and cfg.dist.check_every:
        hooks.append(L.ReplicaCheckHook(cfg.dist.check_every))
    if rank == 0 and cfg.train.progress:
        hooks.append(L.ProgressHook(data.train.steps_per_epoch, cfg.train.epochs))
    tmpdir = tempfile.TemporaryDirectory(prefix="mxlarge-")
    final = L.FinalParamsHook(rank, cfg.train.save_params, tmpdir.name)
    hooks.append(final)
    mlflow_hook = None
    if cfg.tracking.enabled and rank == 0:
        tags = {"world_size": b.workers, "global_batch": derived.global_batch,
                "peak_lr": derived.peak_lr, "kvstore": cfg.dist.kvstore,
                "zero_gamma_blocks": len(b.init_report.zero_gamma),
                **{f"params_{k}": v for k, v in trainer.role_counts().items()}}
        mlflow_hook = tracking.MLflowHook(cfg, uri, run_id, tags, cfg.train.log_every, final,
                                          owns_run=owns_run)
    if cfg.train.checkpoint_every:
        # before the MLflow hook: an epoch's metrics are logged once its checkpoint exists
        hooks.append(L.CheckpointHook(
            ckpt_root, cfg.train.checkpoint_every, cfg.train.keep_last, cfg,
            cfg.train.seed, layout, lambda: mlflow_hook.run_id if mlflow_hook else run_id, rank))
    if mlflow_hook is not None:
        hooks.append(mlflow_hook)
    if cfg.tracking.enabled and run_id is not None:
        hooks.append(tracking.RankThroughputHook(uri, run_id, rank))
    gns = None
    if cfg.train.gns_every:
        from mxlarge.gns import NoiseScale
        gns = NoiseScale(cfg.data.batch_size, derived.global_batch, cfg.train.gns_decay)
    loop = L.TrainLoop(net=b.net, trainer=trainer, train_source=data.train,
                       loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=cfg.train.epochs,
                       ctx=b.ctx, hooks=hooks, max_steps=cfg.train.max_steps, gns=gns,
                       gns_every=cfg.train.gns_every, step=meta["step"] if meta else 0)
    try:
        loop.run(start_epoch)
    finally:
        tmpdir.cleanup()
    return RunResult(run_id=mlflow_hook.run_id if mlflow_hook else run_id, rank=rank,
                     num_workers=b.workers, steps=loop.step, history=loop.history,
                     seconds=time.perf_counter() - t0)
