"""The Trainer's arguments resolved once: both forms, every check, one frozen
:class:`Settings`.

Two forms, told apart by the optimizer argument: **Gluon's** (an optimizer name or
instance and MXNet's ``optimizer_params``, translated by
:mod:`mxlarge.trainer.gluon_args`; the schedule is derived once the global batch B is
known: η(t) = warmed_up(ρ·η_user(t), warmup_steps, warmup_lr) with ρ = scaled_lr(1,
reference_batch, B, scaling) and η_user(t) = lr_scheduler(t + 1) or learning_rate,
:mod:`mxlarge.trainer.lr`), and **mxlarge's explicit form** (a final ``schedule(step) ->
lr``, as :func:`mxlarge.plan.plan` builds it). What cannot be honoured is refused here
with the reason.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mxnet as mx

from mxlarge import schedulers
from mxlarge.kvstore import FUSION_BYTES
from mxlarge.kvstore.any_optimizer import MXNetUpdate
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.kvstore.wires import check_wire_dtype
from mxlarge.plan import SIMULATED_ENV
from mxlarge.protocol.heartbeat import LAUNCHED, FromLauncher, launched_dir
from mxlarge.protocol.reports import launched_reports
from mxlarge.schedulers import Schedule
from mxlarge.timeline import TimelineWindow
from mxlarge.trainer.gluon_args import (
    check_horovod_keywords,
    check_store_for_the_process,
    note_differences,
    optimizer_settings,
)


@dataclass(frozen=True)
class Settings:
    """What a Trainer's arguments decide (:func:`resolve` documents each)."""

    kvstore: str | mx.kv.KVStore
    gluon_form: bool
    sgd: bool  # the momentum-SGD family (LargeBatchSGD); else MXNet's own update
    base: Schedule
    momentum: float
    nesterov: bool
    wd: float
    lars: bool
    lars_eta: float
    lars_eps: float
    multi_precision: bool
    rescale: float  # s: the optimizer's rescale_grad
    begin: int
    mxnet_optimizer: mx.optimizer.Optimizer | None
    reference_batch: int | None
    scaling: str
    warmup_steps: int
    warmup_lr: float | None
    batch_size: int | None
    momentum_correction: bool
    decay_bn_bias: bool
    compression: dict | None
    fusion_bytes: int
    wire_dtype: str
    bn_stats: str
    simulate_workers: int
    heartbeat: Path | None
    reports: Path | None
    timeline: TimelineWindow | None
    breakdown: bool | None
    track: bool

    def updater(self) -> LargeBatchSGD | MXNetUpdate:
        """The optimizer that runs the update, at update :attr:`begin`."""
        updater: LargeBatchSGD | MXNetUpdate
        if self.sgd:
            updater = LargeBatchSGD(
                self.base, momentum=self.momentum, nesterov=self.nesterov,
                momentum_correction=self.momentum_correction, wd=self.wd, lars=self.lars,
                lars_eta=self.lars_eta, lars_eps=self.lars_eps,
                multi_precision=self.multi_precision)
        else:  # any other MXNet optimizer runs its own update (kvstore/any_optimizer.py)
            updater = MXNetUpdate(self.base, self.mxnet_optimizer)
        updater.num_update = self.begin
        return updater

    def note_differences(self, workers: int, rank: int) -> None:
        """The Gluon form's note on how this update differs from gluon.Trainer's
        (:func:`~mxlarge.trainer.gluon_args.note_differences`)."""
        if self.gluon_form:
            note_differences(self.momentum_correction, self.decay_bn_bias, {
                "momentum": self.momentum, "wd": self.wd, "nesterov": self.nesterov},
                lr_changes=not isinstance(self.base, schedulers.Constant)
                or bool(self.warmup_steps), workers=workers, rank=rank,
                scaled=self.reference_batch is not None)


def resolve(optimizer: Any, optimizer_params: Mapping[str, Any] | None,
            kvstore: str | mx.kv.KVStore | None, compression_params: dict | None,
            update_on_kvstore: bool | None, *, reference_batch: int | None = None,
            scaling: str = "linear", warmup_steps: int = 0, warmup_lr: float | None = None,
            batch_size: int | None = None, momentum: float | None = None,
            nesterov: bool | None = None, weight_decay: float | None = None,
            lars: bool | None = None, lars_eta: float | None = None,
            multi_precision: bool | None = None, momentum_correction: bool = True,
            decay_bn_bias: bool = False, compression: dict | None = None,
            fusion_bytes: int = FUSION_BYTES, wire_dtype: str = "float32",
            bn_stats: str = "reduce", simulate_workers: int = 1,
            heartbeat: str | Path | FromLauncher | None = LAUNCHED,
            reports: str | Path | FromLauncher | None = LAUNCHED,
            gradient_predivide_factor: float = 1.0, timeline_start: int | None = None,
            timeline_steps: int | None = None, breakdown: bool | None = None,
            track: bool = True) -> Settings:
    """The :class:`Settings` of ``mxlarge.Trainer(params, optimizer, optimizer_params,
    kvstore, compression_params, update_on_kvstore, **keywords)``.

    Args:
        optimizer: Gluon form: any optimizer name MXNet registers (``sgd``, ``nag``,
            ``lars``/``lbsgd`` run mxlarge's momentum-SGD update; ``adam``, ``lamb``, ... their
            own, :mod:`mxlarge.kvstore.any_optimizer`) or an ``mx.optimizer`` instance.
            Explicit form: ``schedule(step) -> lr``.
        optimizer_params: MXNet optimizer arguments (Gluon form only).
        kvstore: ``local``, ``device``, ``dist_sync`` (or ``dist``, MXNet's name for it),
            ``dist_device_sync``, a store from :func:`mxlarge.kvstore.sync.create` /
            ``mx.kv.create``, or None (no store: one process; several devices are still summed,
            so their replicas stay identical).
        compression_params: Gluon's name for ``compression``.
        update_on_kvstore: None or False; True is refused with the reason.
        reference_batch: B_ref, the global batch ``learning_rate`` was tuned for (Gluon form);
            None keeps ``learning_rate`` as is.
        scaling: ``linear``, ``sqrt`` or ``none`` (:func:`mxlarge.schedulers.scaled_lr`).
        warmup_steps, warmup_lr: gradual warmup from ``warmup_lr`` (default η_user(0)) over the
            first updates (Gluon form).
        batch_size: images per worker and step, to fix the schedule at construction (else the
            first update's batch fixes it).
        momentum, nesterov, weight_decay, lars, lars_eta, multi_precision: explicit form only
            (in the Gluon form they come from the optimizer); ``multi_precision``: float32
            master weights and momentum for float16 weights.
        momentum_correction: rescale the velocity by η_t/η_{t−1} (eq. 9, not MXNet's eq. 10).
        decay_bn_bias: also decay BN γ/β and biases (off in Goyal et al.). A parameter with
            ``wd_mult = 0`` is never decayed.
        compression: e.g. ``{'type': '2bit', 'threshold': 0.5}`` (dist only).
        fusion_bytes: gradients of tensors smaller than this travel packed in buckets of up to
            this many bytes, one push/pull per bucket, bitwise the same sums
            (:func:`mxlarge.kvstore.fusion.fuse`); 0: one key per tensor.
        wire_dtype: ``float32`` or ``float16``: the type float32 gradients travel in (dist
            only; the servers sum in float32, :mod:`mxlarge.kvstore.sync`).
        bn_stats: BN statistics for evaluation/checkpoints: ``local``, ``broadcast``,
            ``reduce`` (:class:`~mxlarge.bnstats.BNStats`).
        simulate_workers: K > 1 reproduces K dist_sync workers in this process: K micro-batches
            of n, each under its own BN running statistics, gradients accumulating
            (``grad_req='add'``), one update with rescale 1/(K·n) (1/(P·K·n) with P dist_sync
            processes). Needs one device. In an elastic job's smaller world the launcher
            sets it (``$MXLARGE_SIMULATE_WORKERS``, :data:`mxlarge.plan.SIMULATED_ENV`): the
            script then runs :meth:`~mxlarge.Trainer.units` (docs/trainer.md).
        heartbeat: the directory a dist worker reports its progress to for the launcher's stall
            watchdog, or None for no reports; the default, ``LAUNCHED``, is the directory the
            launcher gave this process (:func:`~mxlarge.protocol.heartbeat.launched_dir`), none
            outside a launched job.
        reports: the job's report directory, where a timeline's files go; the default,
            ``LAUNCHED``, is the one the launcher gave this process
            (:func:`~mxlarge.protocol.reports.launched_reports`), none outside a launched job.
        timeline_start, timeline_steps: record steps timeline_start ≤ t < timeline_start +
            timeline_steps (3 if not given) on every worker of a launched job as a Chrome trace
            the launcher merges (:mod:`mxlarge.timeline`); without them, ``$MXLARGE_TIMELINE``
            (``START:STEPS``).
        breakdown: time sampled steps part by part
            (:class:`~mxlarge.observers.timer.StepTimer`); None: in a dist worker that reports
            to a launcher (its straggler rule reads the parts).
        track: in a job whose launcher opened an MLflow run (``python -m mxlarge.launcher``),
            rank 0 logs the settings, the LR and the rate into it and the other ranks'
            own MLflow calls go nowhere (:mod:`mxlarge.tracking.script`); False: neither
            (``mxlarge train`` logs through its loop).
        gradient_predivide_factor: Horovod's keyword, 1.0 only (refused otherwise, with the
            reason); Horovod's ``compression=Compression.fp16`` is ``wire_dtype='float16'``.
    """
    check_store_for_the_process(kvstore)
    if update_on_kvstore:
        raise ValueError("update_on_kvstore=True is not supported: on MXNet 1.9.1 the "
                         "servers would run a pickled optimizer that loses wd_mult and LR "
                         "changes; mxlarge sums gradients on the servers and updates on "
                         "every worker (leave it None or False)")
    if compression_params and compression and compression_params != compression:
        raise ValueError("compression_params and compression are the same setting: give one")
    compression = compression or compression_params
    check_horovod_keywords(compression, gradient_predivide_factor)
    gluon_form = isinstance(optimizer, (str, mx.optimizer.Optimizer))
    explicit = {"momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay,
                "lars": lars, "lars_eta": lars_eta, "multi_precision": multi_precision}
    if gluon_form:
        given = [k for k, v in explicit.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: with optimizer {optimizer!r} these go in "
                             "optimizer_params (MXNet's names: momentum, wd, eta, "
                             "multi_precision), as with gluon.Trainer")
        opt = optimizer_settings(optimizer, optimizer_params)
    else:
        opt = _explicit(optimizer, explicit, {
            "optimizer_params": optimizer_params, "reference_batch": reference_batch,
            "warmup_steps": warmup_steps or None, "warmup_lr": warmup_lr,
            "batch_size": batch_size})
    if scaling not in ("linear", "sqrt", "none"):
        raise ValueError(f"scaling {scaling!r}: expected linear, sqrt or none")
    check_wire_dtype(wire_dtype)
    simulate_workers = _simulated(int(simulate_workers), os.environ.get(SIMULATED_ENV))
    return Settings(
        kvstore="local" if kvstore is None else kvstore, gluon_form=gluon_form,
        sgd=opt.get("sgd", True), base=opt["base"], momentum=opt["momentum"],
        nesterov=opt["nesterov"], wd=opt["wd"], lars=opt["lars"], lars_eta=opt["lars_eta"],
        lars_eps=opt["lars_eps"], multi_precision=opt["multi_precision"],
        rescale=opt["rescale"], begin=opt["begin"], mxnet_optimizer=opt["mxnet"],
        reference_batch=reference_batch, scaling=scaling, warmup_steps=int(warmup_steps),
        warmup_lr=warmup_lr, batch_size=batch_size, momentum_correction=momentum_correction,
        decay_bn_bias=decay_bn_bias, compression=compression, fusion_bytes=fusion_bytes,
        wire_dtype=wire_dtype, bn_stats=bn_stats, simulate_workers=simulate_workers,
        heartbeat=_directory(heartbeat, launched_dir),
        reports=_directory(reports, launched_reports),
        timeline=TimelineWindow.of(timeline_start, timeline_steps), breakdown=breakdown,
        track=track)


def _simulated(given: int, launched: str | None) -> int:
    """The simulated workers: ``given``, or the launcher's for an elastic attempt."""
    if launched is None:
        return given
    if given != 1:
        raise ValueError(f"simulate_workers={given}: the launcher runs this attempt with "
                         f"{SIMULATED_ENV}={launched} (--elastic); leave simulate_workers out")
    return int(launched)


def _directory(given: str | Path | FromLauncher | None,
               launched: Callable[[], Path | None]) -> Path | None:
    """``given`` as a path: the launcher's (``launched()``) for ``LAUNCHED``."""
    if given is LAUNCHED:
        return launched()
    if given is None:
        return None
    return Path(given)


#: The keywords :func:`resolve` takes beyond Gluon's positional arguments.
KEYWORDS = frozenset(n for n, p in inspect.signature(resolve).parameters.items()
                     if p.kind is p.KEYWORD_ONLY)


def _explicit(schedule: Any, explicit: dict[str, Any],
              large_batch: dict[str, Any]) -> dict[str, Any]:
    """The explicit form's settings (a final schedule), refusing the Gluon form's keywords."""
    if not callable(schedule):
        raise ValueError(f"optimizer {schedule!r}: expected an optimizer name, an "
                         "mx.optimizer instance or a schedule(step) -> lr")
    given = [k for k, v in large_batch.items() if v is not None]
    if given:
        raise ValueError(f"{', '.join(given)}: a schedule passed to the Trainer is final; "
                         "derive it with mxlarge.plan.plan or mxlarge.schedulers, or pass an "
                         "optimizer name instead")
    get = explicit.get
    return {"base": schedule, "momentum": 0.9 if get("momentum") is None else get("momentum"),
            "nesterov": bool(get("nesterov")), "lars": bool(get("lars")),
            "wd": 1e-4 if get("weight_decay") is None else get("weight_decay"),
            "lars_eta": 0.001 if get("lars_eta") is None else get("lars_eta"),
            "lars_eps": 0.0, "rescale": 1.0, "begin": 0,
            "multi_precision": bool(get("multi_precision")), "mxnet": None}


def named_params(params: Any) -> dict[str, mx.gluon.Parameter]:
    """``params`` by name in their order, each checked for what the Trainer supports."""
    if not hasattr(params, "keys"):  # gluon.Trainer also takes a list of Parameters
        params = list(params)
        bad = [p for p in params if not isinstance(p, mx.gluon.Parameter)]
        if bad:
            raise ValueError(f"params: expected a ParameterDict (net.collect_params()), a "
                             f"dict or a list of Parameters, got a {type(bad[0]).__name__}")
        params = {p.name: p for p in params}
    for name, p in params.items():
        if p._data is None and not p._deferred_init:
            raise ValueError(f"parameter '{name}' is not initialised: call "
                             "net.initialize() before building the Trainer")
        if p.lr_mult != 1.0 or p.wd_mult not in (0.0, 1.0):
            raise ValueError(f"parameter '{name}': lr_mult {p.lr_mult}, wd_mult "
                             f"{p.wd_mult}: only lr_mult 1 and wd_mult 0 or 1 are "
                             "supported (one LR schedule; decay on or off per tensor)")
        if p._stype != "default" or p._grad_stype != "default":
            raise ValueError(f"parameter '{name}': sparse weights or gradients are not "
                             "supported (every gradient is summed dense every step)")
    return dict(params)
