"""Builds a training run from a config: plan, store, data, net, trainer, hooks; runs it.

The same function runs in one process and inside every worker of a launched job. What the job
is comes from :func:`mxlarge.plan.plan` (global batch, LR, steps, schedule) of its world: the one
a launcher decided and passed down (``mxlarge train --world``), else the one the config declares
(:func:`mxlarge.plan.world_of`). The store's real number of workers is checked against it, never
used to re-derive it.
"""
from __future__ import annotations

import dataclasses
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from mxlarge.config import Config
from mxlarge.errors import DivergenceError, InputError
from mxlarge.hooks import Hook
from mxlarge.plan import Plan, World, check_processes, check_timeline, plan, with_world, world_of


@dataclass
class RunResult:
    run_id: str | None
    rank: int
    plan: Plan
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

    plan: Plan
    net: Any
    data: Any
    trainer: Any
    ctx: list
    init_report: Any
    rank: int


def build(cfg: Config, source: str = "<config>", kv: Any = None,
          heartbeat_dir: Path | None = None, world: World | None = None,
          reports_dir: Path | None = None, breakdown: bool | None = None) -> Built:
    """Everything a run needs, in dependency order: world (``world``, else the config's),
    store (rank; its number of workers checked against the world), plan, data shard, net with
    Goyal init, trainer (reporting to ``heartbeat_dir``, if given, for a launcher's stall
    watchdog; a timeline's files into ``reports_dir``; timing its sampled steps with
    ``breakdown``, by default on a dist store)."""
    import mxnet as mx
    import numpy as np

    from mxlarge import data as data_mod
    from mxlarge import nets
    from mxlarge.kvstore import sync
    from mxlarge.trainer import Trainer

    world = world if world is not None else world_of(cfg, source)
    if kv is None and cfg.dist.kvstore.startswith("dist"):
        kv = sync.create(cfg.dist.kvstore)
    if kv is not None:
        check_processes(world, kv.num_workers, source)
    rank = kv.rank if kv is not None else 0
    p = plan(cfg, world, data_mod.train_size(cfg.data), "data", source)
    ctx = contexts(world.devices, cfg.dist.device_type)
    # Same seed on every rank: identical init (rank 0's is broadcast anyway).
    mx.random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed)
    # A worker's batch is devices x (simulated workers) x n consecutive images of the global
    # order, so that each device / virtual worker sees exactly what a real worker would.
    per_worker = dataclasses.replace(cfg.data, batch_size=world.per_process_batch)
    data = data_mod.build_data(per_worker, rank=rank, num_workers=world.processes,
                               seed=cfg.train.seed)
    if cfg.train.amp != "none":
        from mxnet.contrib import amp
        amp.init(target_dtype=cfg.train.amp)  # before the net exists, as AMP requires
    net = nets.build_net(cfg.model, data.num_classes)
    init_report = nets.initialize(net, cfg.model, seed=cfg.train.seed, ctx=ctx,
                                  input_shape=data.input_shape)
    if rank == 0 and init_report.warning():
        print(f"mxlarge: warning: {init_report.warning()}", file=sys.stderr, flush=True)
    if rank == 0 and p.lr_note:
        print(f"mxlarge: note: {p.lr_note}", file=sys.stderr, flush=True)
    if cfg.model.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    o = cfg.optim
    compression = ({"type": "2bit", "threshold": cfg.dist.compression_threshold}
                   if cfg.dist.compression == "2bit" else None)
    if breakdown is None:
        breakdown = cfg.dist.kvstore.startswith("dist")
    window = timeline_keywords(cfg, source, p.total_steps, reports_dir)
    trainer = Trainer(net.collect_params(), p.schedule, momentum=o.momentum, nesterov=o.nesterov,
                      momentum_correction=o.momentum_correction, weight_decay=o.weight_decay,
                      decay_bn_bias=o.decay_bn_bias, lars=o.lars, lars_eta=o.lars_eta,
                      kvstore=kv if kv is not None else cfg.dist.kvstore,
                      compression=compression, fusion_bytes=cfg.dist.fusion_bytes,
                      wire_dtype=cfg.dist.wire_dtype,
                      bn_stats=cfg.dist.bn_stats, simulate_workers=world.simulated,
                      heartbeat=heartbeat_dir, reports=reports_dir, breakdown=breakdown,
                      track=False, **window)
    if cfg.train.amp != "none":
        from mxnet.contrib import amp  # imported above, before the net was built
        amp.init_trainer(trainer)
    return Built(plan=p, net=net, data=data, trainer=trainer, ctx=ctx, init_report=init_report,
                 rank=rank)


class TimelineKeywords(TypedDict, total=False):
    """The Trainer's timeline keywords (:class:`mxlarge.trainer.Trainer`): none, or both."""

    timeline_start: int
    timeline_steps: int


def timeline_keywords(cfg: Config, source: str, total_steps: int,
                      reports_dir: Path | None) -> TimelineKeywords:
    """The Trainer's timeline keywords of ``train.timeline_start``/``timeline_steps``, checked
    against the run's steps (:func:`mxlarge.plan.check_timeline`) and the launcher's report
    directory (:mod:`mxlarge.timeline`)."""
    t = cfg.train
    if t.timeline_start is None:
        return {}
    check_timeline(cfg, total_steps, source)
    if reports_dir is None:
        raise InputError(f"{source}: train.timeline_start = {t.timeline_start}: a timeline is "
                         "recorded in a launched job (mxlarge launch), whose launcher merges "
                         "the workers' files")
    return {"timeline_start": t.timeline_start, "timeline_steps": t.timeline_steps}


def train(cfg: Config, source: str = "<config>", resume: str | None = None,
          run_id: str | None = None, heartbeat_dir: Path | None = None,
          world: World | None = None, reports_dir: Path | None = None) -> RunResult:
    """Trains per ``cfg``; tracks in MLflow unless ``tracking.enabled`` is false.

    Args:
        resume: ``latest`` or a checkpoint directory: continue exactly where it left off, in
            the checkpoint's MLflow run.
        run_id: the MLflow run a caller opened and will end (a launched job's, a sweep
            cell's): every rank logs into it. Without it (and without ``$MLFLOW_RUN_ID``),
            rank 0 opens the run (or reopens the checkpoint's) and ends it FINISHED or FAILED:
            :func:`mxlarge.tracking.open_run` decides.
        heartbeat_dir: where a launched worker reports its progress (what the launcher gave the
            process: :func:`mxlarge.protocol.heartbeat.launched_dir`); None: no reports.
        reports_dir: the job's report directory the launcher gave the process
            (:func:`mxlarge.protocol.reports.launched_reports`), where a timeline's files go.
        world: the job's world as a launcher decided it (``mxlarge train --world``): it
            replaces the config's ``dist.workers`` and ``dist.simulate_workers``
            (:func:`mxlarge.plan.with_world`, which refuses one that contradicts the config).
            None: the config's own (:func:`mxlarge.plan.world_of`).
    """
    import mxnet as mx

    from mxlarge import checkpoint
    from mxlarge import loop as L
    from mxlarge.config import checkpoint_root, dump_yaml
    from mxlarge.persist import CheckpointHook, FinalParamsHook

    t0 = time.perf_counter()
    if world is None:
        world = world_of(cfg, source)
    else:  # what the checkpoints and MLflow record is the config this world runs
        cfg = with_world(cfg, world)
    ckpt_root = checkpoint_root(cfg)
    ckpt = None
    meta = None
    if resume is not None:  # verify before anything is built or written
        ckpt = checkpoint.resolve(resume, ckpt_root)
        meta = checkpoint.read_meta(ckpt)
        checkpoint.check_world(ckpt, meta, world)
    # Building first validates the model and the data before any file is written.
    b = build(cfg, source, heartbeat_dir=heartbeat_dir, world=world, reports_dir=reports_dir)
    trainer = b.trainer
    data = b.data
    p = b.plan
    rank = b.rank
    start_epoch = 0
    if ckpt is not None:
        assert meta is not None  # read with ckpt
        checkpoint.restore(ckpt, meta, net=b.net, trainer=trainer, world=p.world)
        start_epoch = meta["epoch"]
        _warn_config_changes(meta["config"], dump_yaml(cfg), rank)
    opened = None
    if cfg.tracking.enabled or run_id is not None:
        from mxlarge import tracking
        opened = tracking.open_run(cfg, given=run_id, resumed=(meta or {}).get("run_id"),
                                   plan=p, source=source, may_open=rank == 0)
    run = opened.run if opened is not None else None
    hooks: list[Hook] = [L.LossHook(cfg.train.log_every, cfg.train.divergence_factor,
                                      p.steps_per_epoch),
                           L.TimerHook(p.steps_per_epoch),
                           L.EvalHook(data.val, batch_size=max(cfg.data.batch_size, 64),
                                      every=cfg.train.eval_every)]
    if trainer.collectives.distributed and cfg.dist.check_every:
        hooks.append(L.ReplicaCheckHook(cfg.dist.check_every))
    if rank == 0:
        total = (p.total_steps if cfg.train.max_steps is None
                 else min(p.total_steps, cfg.train.max_steps))
        hooks.append(L.ProgressHook(p.steps_per_epoch, cfg.train.epochs, total,
                                    cfg.train.log_every, bar=cfg.train.progress))
    tmpdir = tempfile.TemporaryDirectory(prefix="mxlarge-")
    hooks.append(FinalParamsHook(rank, cfg.train.save_params, tmpdir.name))
    if trainer.collectives.distributed:  # every rank: its heartbeat and a collective
        from mxlarge.breakdown import BreakdownHook
        tag = run.tag if rank == 0 and run is not None else None
        hooks.append(BreakdownHook(socket.gethostname(), tag))
    if cfg.train.checkpoint_every:
        hooks.append(CheckpointHook(ckpt_root, cfg.train.checkpoint_every, cfg.train.keep_last,
                                    cfg, p.world, run.run_id if run else None, rank))
    if run is not None:
        from mxlarge import tracking
        if rank == 0:
            from mxlarge.reporting.plots import plot_training_curves
            facts = {"zero_gamma_blocks": len(b.init_report.zero_gamma),
                     **{f"params_{k}": v for k, v in trainer.role_counts().items()}}
            example, _ = next(iter(data.val.batches(2)))  # the logged model's input example
            hooks.append(tracking.MLflowHook(cfg, run, facts, cfg.train.log_every,
                                             p.global_batch, example.asnumpy(),
                                             launched=heartbeat_dir is not None,
                                             plot=plot_training_curves))
        else:
            hooks.append(tracking.RankThroughputHook(run))
    gns = None
    if cfg.train.gns_every:
        from mxlarge.gns import NoiseScale
        gns = NoiseScale(p.world.batch, p.global_batch, cfg.train.gns_decay)
    loop = L.TrainLoop(net=b.net, trainer=trainer, train_source=data.train,
                       loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=cfg.train.epochs,
                       ctx=b.ctx, hooks=hooks, max_steps=cfg.train.max_steps, gns=gns,
                       gns_every=cfg.train.gns_every, step=meta["step"] if meta else 0,
                       amp=cfg.train.amp != "none")
    ok = False
    try:
        loop.run(start_epoch)
        ok = True
    except DivergenceError as exc:
        if run is not None and rank == 0:
            # a result of the configuration, not a crash: mxlarge report counts the run as one
            # that never reaches the target
            run.tag({"diverged": str(exc)})
        raise
    finally:
        tmpdir.cleanup()
        if opened is not None:
            opened.close(ok)
    return RunResult(run_id=run.run_id if run else None, rank=rank, plan=p, steps=loop.step,
                     history=loop.history, seconds=time.perf_counter() - t0)
