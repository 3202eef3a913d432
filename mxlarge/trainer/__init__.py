"""``mxlarge.Trainer``: a ``gluon.Trainer`` that applies Goyal et al.'s update over a KVStore.

A subclass of ``mx.gluon.Trainer``, as Horovod's ``DistributedTrainer`` is: it overrides the
exchange (:meth:`Trainer.allreduce_grads`), the update (:meth:`Trainer.update`), the store and
the states files, and inherits the rest, so MXNet's AMP and Gluon's own API work with it. Two
forms, told apart by the second argument: **Gluon's** (an optimizer name or instance and
MXNet's ``optimizer_params``, translated by :mod:`mxlarge.trainer.gluon_args`; the schedule is
derived once the global batch B is known: η(t) = warmed_up(ρ·η_user(t), warmup_steps,
warmup_lr) with ρ = scaled_lr(1, reference_batch, B, scaling) and η_user(t) =
lr_scheduler(t + 1) or learning_rate), and **mxlarge's explicit form** (a final
``schedule(step) -> lr``, as :func:`mxlarge.plan.plan` builds it).

One counter: :attr:`num_update` counts applied updates; ``step(n)`` applies update
``num_update``, ``step(n, t)`` applies update t and the count follows. The update sums the
gradients over k workers (and devices) and rescales by s/(k·n), s = ``rescale_grad`` (divided
by AMP's loss scale under ``amp.scale_loss``): each worker's loss is normalised by the *global*
batch (Goyal §3), where ``gluon.Trainer.step(n)`` on dist_sync applies k times the update.
Under AMP, overflow is decided on the summed gradients, so every rank skips the same steps, and
a skipped step does not count (Gluon's rule). ``multi_precision`` keeps float32 master weights
and momentum for float16 weights; ``wire_dtype='float16'`` is the 16-bit wire
(:mod:`mxlarge.kvstore.sync`). What cannot be honoured is refused with the reason; a parameter
without its shape gets rank 0's value at its initialisation (:mod:`mxlarge.trainer.deferred`);
a dist Trainer makes its process leave at once on an uncaught exception
(:func:`mxlarge.protocol.failfast.install_fail_fast`). The user's guide: docs/trainer.md.

Over 500 lines because it is one class with Gluon's whole Trainer surface (both forms'
arguments documented in place, the step, the states, the facts the loop reads); what is not
the class (argument translation, states files, deferred init) has its own module.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge import schedulers
from mxlarge.bnstats import BNStats
from mxlarge.kvstore import FUSION_BYTES
from mxlarge.kvstore.any_optimizer import MXNetUpdate
from mxlarge.kvstore.roles import ParamRole, param_roles, role_counts
from mxlarge.kvstore.sync import WIRE_DTYPES, SyncStore
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.plan import World
from mxlarge.protocol.failfast import BEFORE_EXIT, install_fail_fast
from mxlarge.protocol.heartbeat import LAUNCHED, Beat, Launched, launched_dir, settle
from mxlarge.schedulers import Schedule
from mxlarge.trainer import states as states_file
from mxlarge.trainer.deferred import on_init
from mxlarge.trainer.gluon_args import (
    HONOURED,
    MXNetSchedule,
    check_horovod_keywords,
    check_store_for_the_process,
    note_differences,
    optimizer_settings,
    store_name,
)
from mxlarge.trainer.states import NUM_UPDATE_KEY

__all__ = ["Trainer", "HONOURED", "MXNetSchedule", "NUM_UPDATE_KEY"]


def _explicit_step(step: int | bool | None, ignore_stale_grad: bool) -> int | None:
    """The explicit step, if any; gluon.Trainer's second positional is ``ignore_stale_grad``."""
    if isinstance(step, bool):
        step, ignore_stale_grad = None, step
    if ignore_stale_grad:
        raise ValueError("ignore_stale_grad=True is not supported: on dist_sync every worker "
                         "must push every gradient each step; give parameters that get no "
                         "gradient grad_req='null' before building the Trainer")
    return step


class Trainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` running large-minibatch SGD over a KVStore (module docstring).

    Args:
        params: ``net.collect_params()`` (initialised; shapes may come from the first forward).
        optimizer: Gluon form: any optimizer name MXNet registers (``sgd``, ``nag``,
            ``lars``/``lbsgd`` run mxlarge's momentum-SGD update; ``adam``, ``lamb``, ... their
            own, :mod:`mxlarge.kvstore.any_optimizer`) or an ``mx.optimizer`` instance.
            Explicit form: ``schedule(step) -> lr``.
        optimizer_params: MXNet optimizer arguments (Gluon form only).
        kvstore: ``local``, ``device``, ``dist_sync`` (or ``dist``, MXNet's name for it),
            ``dist_device_sync``, a store from
            :func:`mxlarge.kvstore.sync.create` / ``mx.kv.create``, or None (no store: one
            process; several devices are still summed, so their replicas stay identical).
        compression_params: Gluon's name for ``compression``.
        update_on_kvstore: None or False; True is refused (module docstring).
        reference_batch: B_ref, the global batch ``learning_rate`` was tuned for (Gluon form);
            None keeps ``learning_rate`` as is.
        scaling: ``linear``, ``sqrt`` or ``none`` (:func:`mxlarge.schedulers.scaled_lr`).
        warmup_steps, warmup_lr: gradual warmup from ``warmup_lr`` (default η_user(0)) over
            the first updates (Gluon form).
        batch_size: images per worker and step, to fix the schedule at construction (else the
            first update's batch fixes it).
        momentum, nesterov, weight_decay, lars, lars_eta: explicit form only (in the Gluon form
            they come from the optimizer).
        momentum_correction: rescale the velocity by η_t/η_{t−1} (eq. 9, not MXNet's eq. 10).
        decay_bn_bias: also decay BN γ/β and biases (off in Goyal et al.). A parameter with
            ``wd_mult = 0`` is never decayed.
        compression: e.g. ``{'type': '2bit', 'threshold': 0.5}`` (dist only).
        fusion_bytes: gradients of tensors smaller than this travel packed in buckets of up
            to this many bytes, one push/pull per bucket, bitwise the same sums
            (:func:`mxlarge.kvstore.fusion.fuse`); 0: one key per tensor.
        bn_stats: BN statistics for evaluation/checkpoints: ``local``, ``broadcast``, ``reduce``
            (owned by :attr:`bn`, a :class:`~mxlarge.bnstats.BNStats`).
        simulate_workers: K > 1 reproduces K dist_sync workers in this process: the loop runs
            K micro-batches of n, each under its own copy of the BN running statistics
            (``trainer.bn.worker(j)``), gradients accumulate (``grad_req='add'``), and one
            update with rescale 1/(K·n) follows (1/(P·K·n) with P dist_sync processes, each
            simulating K: the servers sum the P accumulated gradients). Needs one device.
        wire_dtype: ``float32`` or ``float16``: the type float32 gradients travel in (dist
            only; the servers sum in float32, :mod:`mxlarge.kvstore.sync`).
        multi_precision: explicit form only (the Gluon form takes it from
            ``optimizer_params``): float32 master weights and momentum for float16 weights.
        gradient_predivide_factor: Horovod's keyword, 1.0 only (refused otherwise, with the
            reason); Horovod's ``compression=Compression.fp16`` is ``wire_dtype='float16'``.
        heartbeat: the directory a dist worker reports its progress to for the launcher's stall
            watchdog (:mod:`mxlarge.protocol.heartbeat`; the file is named by the kvstore rank),
            or None for no reports. The default, :data:`~mxlarge.protocol.heartbeat.LAUNCHED`,
            is for a script of your own run by ``mxlarge launch`` or ``python -m
            mxlarge.launcher``: the directory that launcher gave the process
            (:func:`~mxlarge.protocol.heartbeat.launched_dir`), none outside a launched job.
            ``mxlarge train`` passes the directory its process root read.
    """

    def __init__(self, params: Mapping[str, mx.gluon.Parameter] | Sequence[mx.gluon.Parameter],
                 optimizer: str | mx.optimizer.Optimizer | Schedule = "sgd",
                 optimizer_params: Mapping[str, Any] | None = None,
                 kvstore: str | mx.kv.KVStore | None = "local",
                 compression_params: dict | None = None, update_on_kvstore: bool | None = None,
                 *, reference_batch: int | None = None, scaling: str = "linear",
                 warmup_steps: int = 0, warmup_lr: float | None = None,
                 batch_size: int | None = None,
                 momentum: float | None = None, nesterov: bool | None = None,
                 weight_decay: float | None = None, lars: bool | None = None,
                 lars_eta: float | None = None, multi_precision: bool | None = None,
                 momentum_correction: bool = True,
                 decay_bn_bias: bool = False, compression: dict | None = None,
                 fusion_bytes: int = FUSION_BYTES, wire_dtype: str = "float32",
                 bn_stats: str = "reduce", simulate_workers: int = 1,
                 heartbeat: str | Path | Launched | None = LAUNCHED,
                 gradient_predivide_factor: float = 1.0):
        if store_name(kvstore).startswith("dist"):
            # A dist worker that raises would wait forever in ps-lite's exit barrier for peers
            # that wait in push/pull for it: every script using this Trainer leaves at once
            # (installed first: the process may have a dist store already, see sync.create,
            # and a refused argument below must end it too).
            install_fail_fast()
        check_store_for_the_process(kvstore)
        if update_on_kvstore:
            raise ValueError("update_on_kvstore=True is not supported: on MXNet 1.9.1 the "
                             "servers would run a pickled optimizer that loses wd_mult and LR "
                             "changes; mxlarge sums gradients on the servers and updates on "
                             "every worker (leave it None or False)")
        if compression_params and compression and compression_params != compression:
            raise ValueError("compression_params and compression are the same setting: "
                             "give one")
        compression = compression or compression_params
        check_horovod_keywords(compression, gradient_predivide_factor)
        gluon_form = isinstance(optimizer, (str, mx.optimizer.Optimizer))
        opt = self._settings(optimizer, optimizer_params, gluon_form, {
            "momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay,
            "lars": lars, "lars_eta": lars_eta, "multi_precision": multi_precision}, {
            "optimizer_params": optimizer_params, "reference_batch": reference_batch,
            "warmup_steps": warmup_steps or None, "warmup_lr": warmup_lr,
            "batch_size": batch_size})
        if scaling not in ("linear", "sqrt", "none"):
            raise ValueError(f"scaling {scaling!r}: expected linear, sqrt or none")
        if wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype {wire_dtype!r}: expected one of "
                             f"{', '.join(WIRE_DTYPES)}")
        named = self._named(params)
        self.names = list(named)
        self.updater: LargeBatchSGD | MXNetUpdate
        if opt.get("sgd", True):
            self.updater = LargeBatchSGD(
                opt["base"], momentum=opt["momentum"], nesterov=opt["nesterov"],
                momentum_correction=momentum_correction, wd=opt["wd"],
                lars=opt["lars"], lars_eta=opt["lars_eta"], lars_eps=opt["lars_eps"],
                multi_precision=opt["multi_precision"])
        else:  # any other MXNet optimizer runs its own update (kvstore/any_optimizer.py)
            self.updater = MXNetUpdate(opt["base"], opt["mxnet"])
        self.updater.num_update = opt["begin"]
        # Gluon's own construction, with no store of its own: ``_params`` in this order,
        # ``_optimizer`` the updater, the attributes AMP and Gluon's helpers read.
        super().__init__(list(named.values()), self.updater, kvstore=None,
                         update_on_kvstore=False)
        self.params: list[mx.gluon.Parameter] = self._params
        self._param_map = named
        self._scale = opt["rescale"]
        kind = "local" if kvstore is None else kvstore
        self.store = SyncStore(kind, self.params, compression=compression,
                               fusion_bytes=fusion_bytes, wire_dtype=wire_dtype)
        self._init_kvstore()
        # Progress for the launcher's stall watchdog (None outside a launched job).
        beats = launched_dir() if heartbeat is LAUNCHED else heartbeat
        self.heartbeat = (Beat(beats, self.store.rank)
                          if beats is not None and self.store.distributed else None)
        if self.heartbeat is not None and settle not in BEFORE_EXIT:
            BEFORE_EXIT.append(settle)  # a failing worker's last record names its step
        self._base: Schedule = opt["base"]
        self._lb = (reference_batch, scaling, int(warmup_steps), warmup_lr) if gluon_form \
            else None
        # The MXNet optimizer the Gluon form was given: what it refuses, this Trainer refuses.
        self._mxnet_optimizer: mx.optimizer.Optimizer | None = opt["mxnet"]
        self._batch: int | None = None  # images per worker and step the schedule is fixed for
        self._main: Schedule = self._base
        self._overrides: list[tuple[int, float]] = []  # set_learning_rate: (from step, lr)
        self._decay_bn_bias = decay_bn_bias
        self._bn_mode = bn_stats
        self.simulated_workers = int(simulate_workers)
        if self.simulated_workers > 1:
            if self.params and self.num_devices > 1:
                raise ValueError("simulate_workers needs a single device per process")
            for p in self.params:
                if p.grad_req != "null":
                    p.grad_req = "add"
        self._first_step_checked = False
        self._loaded: dict[str, mx.nd.NDArray] | None = None  # states loaded before shapes
        self._masters_current = False  # master copies taken from the weights (or a file)
        if gluon_form and self.store.rank == 0:
            note_differences(momentum_correction, decay_bn_bias, opt,
                             lr_changes=not isinstance(opt["base"], schedulers.Constant)
                             or bool(warmup_steps), workers=self.num_workers, rank=self.rank,
                             scaled=reference_batch is not None)
        self._batch_warned = False
        # Rank 0's initial values: now for parameters with shapes, at their initialisation for
        # the others (deferred: the first forward), before that forward reads it.
        self.store.init_params([i for i, p in enumerate(self.params) if p._data is not None])
        self._pending = {i for i, p in enumerate(self.params) if p._data is None}
        for i in sorted(self._pending):
            on_init(self.params[i], lambda i=i: self._parameter_ready(i))
        self._batch_size = batch_size
        if not self._pending:
            self._ready()

    @staticmethod
    def _settings(optimizer: Any, optimizer_params: Mapping[str, Any] | None, gluon_form: bool,
                  explicit: dict[str, Any], large_batch: dict[str, Any]) -> dict[str, Any]:
        """The update's settings from either form (module docstring), refusing the other
        form's keywords."""
        if gluon_form:
            given = [k for k, v in explicit.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: with optimizer {optimizer!r} these go "
                                 "in optimizer_params (MXNet's names: momentum, wd, eta, "
                                 "multi_precision), as with gluon.Trainer")
            return optimizer_settings(optimizer, optimizer_params)
        if not callable(optimizer):
            raise ValueError(f"optimizer {optimizer!r}: expected an optimizer name, an "
                             "mx.optimizer instance or a schedule(step) -> lr")
        given = [k for k, v in large_batch.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: a schedule passed to the Trainer is "
                             "final; derive it with mxlarge.plan.plan or "
                             "mxlarge.schedulers, or pass an optimizer name instead")
        get = explicit.get
        return {"base": optimizer, "momentum": 0.9 if get("momentum") is None else
                get("momentum"), "nesterov": bool(get("nesterov")), "lars": bool(get("lars")),
                "wd": 1e-4 if get("weight_decay") is None else get("weight_decay"),
                "lars_eta": 0.001 if get("lars_eta") is None else get("lars_eta"),
                "lars_eps": 0.0, "rescale": 1.0, "begin": 0,
                "multi_precision": bool(get("multi_precision")), "mxnet": None}

    @staticmethod
    def _named(params: Any) -> dict[str, mx.gluon.Parameter]:
        """``params`` by name in their order, each checked for what this Trainer supports."""
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

    # -- gluon.Trainer's store hooks: the store is made at construction, never lazily -------------
    def _init_kvstore(self) -> None:
        self._kvstore = self.store.kv
        self._distributed = self.store.distributed
        self._update_on_kvstore = False
        self._kv_initialized = True
        self._params_to_init = []

    def _init_params(self) -> None:
        """Nothing to do: parameters get rank 0's values at construction or at their deferred
        initialisation (:mod:`mxlarge.trainer.deferred`)."""

    def _row_sparse_pull(self, parameter: Any, out: Any, row_id: Any,
                         full_idx: bool = False) -> None:
        raise ValueError("sparse parameters are not supported by mxlarge.Trainer")

    def _parameter_ready(self, i: int) -> None:
        self.store.init_params([i])
        self._pending.discard(i)
        if not self._pending:
            self._ready(in_forward=True)

    def _ready(self, in_forward: bool = False) -> None:
        """Everything that needs the shapes: roles, store keys, optimizer states, BN stats."""
        self.roles: list[ParamRole] = param_roles(self._param_map,
                                                  decay_bn_bias=self._decay_bn_bias)
        self.store.ready(self.roles, in_forward=in_forward)
        self.pushed = self.store.pushed
        self.updater.no_decay = tuple(sorted(
            i for i in self.pushed if not self.roles[i].decay or self.params[i].wd_mult == 0.0))
        half = [self.names[i] for i in self.pushed
                if np.dtype(self.params[i].dtype) == np.float16]
        if half and not self.updater.multi_precision:
            warnings.warn(f"float16 weights ({half[0]}, ...) are updated in float16: pass "
                          "multi_precision=True (optimizer_params) to keep float32 master "
                          "weights and momentum, as MXNet's SGD recommends", stacklevel=3)
        # one optimizer state per (parameter, device): devices apply identical updates
        self.states = [[self.updater.create_state_multi_precision(i, w)
                        for w in self.params[i].list_data()] for i in range(len(self.params))]
        self.bn = BNStats(self.params, self.store.stats, self.store, self._bn_mode,
                          self.simulated_workers)
        self._gather_update_args()
        if self._loaded is not None:
            loaded, self._loaded = self._loaded, None
            self._set_states(loaded, "load_states")
        if self._batch_size is not None and self._batch is None:
            self._fix_schedule(self._batch_size)

    def _gather_update_args(self) -> None:
        """The update's arguments per device, gathered once per version of the gradient
        arrays: Gluon keeps its arrays for the life of the parameters (loading weights copies
        into them), and the store replaces a fused bucket's gradients by views of its buffer
        (``SyncStore.grads_version`` counts it)."""
        self._grads_version = self.store.grads_version
        self._update_args = [
            ([self.params[i].list_data()[d] for i in self.pushed],
             [self.params[i].list_grad()[d] for i in self.pushed],
             [self.states[i][d] for i in self.pushed])
            for d in range(len(self.params[0].list_ctx()) if self.params else 0)]

    @property
    def is_ready(self) -> bool:
        """Whether every parameter has its shape (deferred ones get it at the first forward)."""
        return not self._pending

    def _check_ready(self) -> None:
        if self._pending:
            names = [self.names[i] for i in sorted(self._pending)][:3]
            raise ValueError(f"parameters {', '.join(names)} were never initialised: run the "
                             "net's forward pass (inside autograd.record()) before step()")

    # -- the schedule ---------------------------------------------------------------------------
    def world(self, batch_size: int) -> World:
        """This job's :class:`~mxlarge.plan.World` for ``batch_size`` images per worker."""
        units = self.num_devices * self.simulated_workers
        if batch_size % units:
            raise ValueError(f"batch size {batch_size} does not split evenly over "
                             f"{units} device(s)/simulated worker(s)")
        return World(processes=self.num_workers, devices=self.num_devices,
                     simulated=self.simulated_workers, batch=batch_size // units)

    def _fix_schedule(self, batch_size: int) -> None:
        """Gluon form: derives η(t) from the global batch (module docstring), once."""
        self._batch = batch_size
        if self._lb is None:
            return
        reference, scaling, warmup, warmup_lr = self._lb
        world = self.world(batch_size)
        factor = (schedulers.scaled_lr(1.0, reference, world.global_batch, scaling)
                  if reference else 1.0)
        main = schedulers.Scaled(self._base, factor) if factor != 1.0 else self._base
        start = self._base(0) if warmup_lr is None else warmup_lr
        self._main = schedulers.warmed_up(main, warmup, start)
        self._compose()

    def _compose(self) -> None:
        if self._overrides:
            self.updater.schedule = schedulers.Join(
                (self._main, *[schedulers.Constant(lr) for _, lr in self._overrides]),
                tuple(t for t, _ in self._overrides))
        else:
            self.updater.schedule = self._main

    @property
    def schedule(self) -> Schedule:
        """η(t), the schedule the updates follow (after :meth:`set_learning_rate` calls)."""
        return self.updater.schedule

    def set_learning_rate(self, lr: float) -> None:
        """Uses ``lr`` (as is: already scaled) from the next update on.

        The schedule becomes Join(old, Constant(lr)) at t0 = :attr:`num_update`, a pure function
        of the step again, so the momentum correction η_t/η_{t−1} still applies at t0.

        Raises:
            UserWarning: an ``lr_scheduler`` was given in ``optimizer_params``: MXNet's
                ``Optimizer.set_learning_rate`` raises it, as it does under gluon.Trainer.
        """
        if self._mxnet_optimizer is not None and self._mxnet_optimizer.lr_scheduler is not None:
            self._mxnet_optimizer.set_learning_rate(lr)  # raises gluon.Trainer's UserWarning
        t0 = self.num_update
        if self._overrides and self._overrides[-1][0] == t0:
            self._overrides[-1] = (t0, float(lr))
        else:
            self._overrides.append((t0, float(lr)))
        self._compose()

    @property
    def learning_rate(self) -> float:
        """η of the most recent update, as gluon.Trainer's; η of the next one before any update
        and right after :meth:`set_learning_rate` (which gluon.Trainer returns at once).

        In the Gluon form the scaling and warmup are known once the global batch is: before the
        first update (without ``batch_size=``) this is the unscaled η_user(0).
        """
        t = self.num_update
        if t == 0 or (self._overrides and self._overrides[-1][0] == t):
            return self.lr_at(t)
        return self.lr_at(t - 1)

    @property
    def num_update(self) -> int:
        """Updates applied (the step of the next one); ``optimizer.num_update``, as in MXNet."""
        return self.updater.num_update

    @num_update.setter
    def num_update(self, value: int) -> None:
        self.updater.num_update = int(value)

    @property
    def optimizer(self) -> LargeBatchSGD | MXNetUpdate:
        """The optimizer that runs the update (an ``mx.optimizer.Optimizer``)."""
        return self.updater

    # -- facts ----------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.store.rank

    @property
    def num_workers(self) -> int:
        return self.store.num_workers

    @property
    def num_devices(self) -> int:
        return len(self.params[0].list_ctx())

    def lr_at(self, step: int) -> float:
        """η(step) of the schedule."""
        return self.updater.lr_at(step)

    def role_counts(self) -> dict[str, int]:
        return role_counts(self.roles)

    # -- the step -------------------------------------------------------------------------------
    def allreduce_grads(self) -> None:
        """Sums gradients over workers and devices (exposed for gradient statistics).

        The first call of a dist job also checks the data is sharded (:meth:`_check_sharded`).
        """
        self._check_ready()
        first = None
        if not self._first_step_checked:
            self._first_step_checked = True
            if self.store.distributed and self.num_workers > 1 and self.pushed:
                # computed before the sum overwrites the gradients (the engine orders the read)
                grads = [self.params[i].list_grad()[0] for i in self.pushed]
                grads = [g if g.dtype == np.float32 else g.astype(np.float32) for g in grads]
                first = mx.nd.concat(mx.nd.add_n(*[g.sum() for g in grads]),
                                     mx.nd.add_n(*[g.norm() for g in grads]), dim=0)
        self._allreduce_grads()
        if first is not None:
            self._check_sharded(first.asnumpy())

    def _allreduce_grads(self) -> None:
        """The exchange (what Horovod's DistributedTrainer overrides too). A 16-bit wire
        carries s·g (s: the AMP-unscaled ``rescale_grad``), so its range does not depend on
        AMP's loss scale; the gradients come back in their own scale."""
        self.store.allreduce_grads(prescale=self._scale)

    def _check_sharded(self, checksum: Any) -> None:
        """Warns once, on rank 0, when every worker's first gradients are bitwise equal
        (``checksum``: Σ sums and Σ norms of this worker's gradients; one exact gather):
        the workers read the same data, and k identical copies train."""
        if not self.store.same_on_every_rank(checksum) or self.rank != 0:
            return
        print(f"mxlarge.Trainer (kvstore rank 0 of {self.num_workers}): warning: the first "
              f"gradients of all {self.num_workers} "
              "workers are bitwise equal: every worker reads the same data, so the job trains "
              f"{self.num_workers} identical copies. Give each worker its own part: "
              "mx.io.ImageRecordIter(..., num_parts=trainer.num_workers, "
              "part_index=trainer.rank), or a DataLoader with a split sampler "
              "(gluoncv.data.sampler.SplitSampler(len(dataset), num_parts=trainer.num_workers, "
              "part_index=trainer.rank))", file=sys.stderr, flush=True)

    def _check_batch(self, batch_size: int) -> None:
        """Warns once (kvstore rank 0) when ``step(b)`` gets b = k·n, k workers and n the
        batch the schedule was fixed for: a gluon script's ``step(batch_size * num_workers)``,
        which here would make steps k times smaller (the mean is over k·b images)."""
        k, n = self.num_workers, self._batch
        if k < 2 or n is None or batch_size != k * n:
            return
        self._batch_warned = True
        if self.rank == 0:
            print(f"mxlarge.Trainer (kvstore rank 0 of {k}): warning: step({batch_size}) is "
                  f"{k}x the batch of {n} the schedule was fixed for (batch_size=, or the "
                  "first step's): step(n) takes this worker's own n (the mean is over the "
                  f"{k}*n global batch already), so these steps are {k}x smaller",
                  file=sys.stderr, flush=True)

    def update(self, batch_size: int, step: int | None = None,
               ignore_stale_grad: bool = False) -> bool:
        """Applies update ``step`` (default :attr:`num_update`) to already-reduced gradients,
        with rescale s/(k·n); then ``num_update = step + 1``. Under AMP, a step whose summed
        gradients overflowed is skipped on every rank and the count stays (Gluon's rule).
        Returns whether the update was applied.

        Args:
            batch_size: images this worker processed in the step, over all its devices (n per
                device times devices). The first call fixes the Gluon form's schedule.
            step: updates applied so far, for loops that own the counter.
            ignore_stale_grad: False only (every gradient is summed every step).
        """
        step = _explicit_step(step, ignore_stale_grad)
        self._check_ready()
        if self._batch is None:
            self._fix_schedule(batch_size)
        elif batch_size != self._batch and not self._batch_warned:  # one comparison a step
            self._check_batch(batch_size)
        t = self.num_update if step is None else int(step)
        beat = self.heartbeat
        if beat is not None:
            beat.issue(t)  # this worker's gradients of update t are pushed
        if self._grads_version != self.store.grads_version:
            self._gather_update_args()
        if not self._masters_current:
            self._refresh_masters()
        scaler = getattr(self, "_amp_loss_scaler", None)
        if scaler is not None and self.simulated_workers > 1:
            raise ValueError("simulate_workers with AMP is not supported: MXNet 1.9.1's "
                             "bfloat16 convolution and dense kernels write no gradient when "
                             "it accumulates (grad_req='add'; docs/mxnet-facts.md)")
        # the summed gradients are bitwise the same on every rank, so is this decision
        if scaler is not None and scaler.has_overflow(self._params):
            return False
        rescale = self._scale / (batch_size * self.num_workers)
        for weights, grads, states in self._update_args:
            self.updater.apply(t, self.pushed, weights, grads, states, rescale)
        if beat is not None and self._update_args:
            # a weight update t writes: exists once it is complete; Python waits only when
            # it is AHEAD updates ahead of that (mxlarge.protocol.heartbeat)
            beat.completes(t, self._update_args[0][0][0])
        self.num_update = t + 1
        return True

    def step(self, batch_size: int, step: int | None = None,
             ignore_stale_grad: bool = False) -> bool:
        """``allreduce_grads()`` then ``update(batch_size, step)``; whether it was applied."""
        step = _explicit_step(step, ignore_stale_grad)  # refused before anything is pushed
        self.allreduce_grads()
        return self.update(batch_size, step)

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Tells the launcher's stall watchdog that this worker is ``what`` (e.g. evaluating)
        rather than stepping: such a phase may last 10 stall timeouts (see
        :mod:`mxlarge.launcher.watchdog`). A no-op outside a launched job."""
        if self.heartbeat is None:
            yield
            return
        with self.heartbeat.busy(what):
            yield

    def check_replicas(self, step: int) -> None:
        self.store.check_replicas(step)

    def grad_sq(self, device: int, minus: list[mx.nd.NDArray] | None = None) -> float:
        """Σ‖g‖² over pushed gradients on ``device`` (of g − minus, if given). Synchronises."""
        grads = [self.params[i].list_grad()[device] for i in self.pushed]
        if minus is not None:
            grads = [g - m for g, m in zip(grads, minus)]
        total = 0.0
        for lo in range(0, len(grads), 32):
            chunk = grads[lo:lo + 32]
            total += float(mx.nd.multi_sum_sq(*chunk, num_arrays=len(chunk)).sum().asscalar())
        return total

    def grad_copies(self) -> list[mx.nd.NDArray]:
        return [self.params[i].grad().copy() for i in self.pushed]

    # -- simulated workers ----------------------------------------------------------------------
    def zero_grads(self) -> None:
        """Clears accumulated gradients (``grad_req='add'``) before a simulated step."""
        for i in self.pushed:
            for g in self.params[i].list_grad():
                g[:] = 0

    # -- states ---------------------------------------------------------------------------------
    def _refresh_masters(self) -> None:
        """Float32 master copies from the current float16 weights, at the first update (weights
        loaded after construction count; a states file's masters are kept)."""
        self._masters_current = True
        for i in self.pushed:
            for w, state in zip(self.params[i].list_data(), self.states[i]):
                master = self.updater.parts(state, w.dtype).get("master")
                if master is not None:
                    w.astype(np.float32).copyto(master)

    def _parts(self, i: int, state: Any) -> dict[str, mx.nd.NDArray]:
        """Parameter i's optimizer state by part (:mod:`mxlarge.trainer.states`)."""
        dtype = self.params[i].dtype if 0 <= i < len(self.params) else None
        return self.updater.parts(state, dtype)

    def state_arrays(self) -> dict[str, mx.nd.NDArray]:
        """Device 0's momentum buffers and float32 master weights, keyed ``momentum:<i>`` and
        ``master:<i>`` by parameter position (:mod:`mxlarge.trainer.states`)."""
        self._check_ready()
        if not self._masters_current:
            self._refresh_masters()
        out = states_file.state_arrays(self.states, self.pushed, self._parts)
        scaler = getattr(self, "_amp_loss_scaler", None)
        if scaler is not None:  # AMP's dynamic loss scale, so a resume continues it exactly
            out[states_file.AMP_KEY] = mx.nd.array(
                [scaler._loss_scale, scaler._next_loss_scale, scaler._unskipped],
                dtype="float64")
        return out

    def save_states(self, fname: str) -> None:
        """Writes :meth:`state_arrays` and the update count (``num_update``, an int64 array) as
        an MXNet NDArray file (no pickle)."""
        mx.nd.save(fname, {**self.state_arrays(),
                           NUM_UPDATE_KEY: mx.nd.array([self.num_update], dtype="int64")})

    def load_states(self, fname: str) -> None:
        """Loads what :meth:`save_states` wrote, or ``gluon.Trainer.save_states``'s file.

        The update count is restored (and with it the schedule position and the momentum
        correction: a run resumed by ``step(n)`` continues where it stopped): from
        ``num_update`` in mxlarge's file, from the pickled optimizer's ``num_update`` in Gluon's.
        From Gluon's file only the momentum (MXNet's velocity, the same eq. (10) quantity) and
        the master weights are taken, read with an unpickler that constructs nothing but MXNet
        classes; the LR schedule comes from this Trainer's arguments. Keys and shapes are
        checked; before the first forward of a net with deferred initialisation the states
        are kept, and checked and set once the shapes are known.
        """
        loaded, count = states_file.read(fname, self.names, self._parts)
        amp_state = loaded.pop(states_file.AMP_KEY, None)
        scaler = getattr(self, "_amp_loss_scaler", None)
        if amp_state is not None and scaler is not None:
            scale, following, unskipped = amp_state.asnumpy().tolist()
            scaler._loss_scale, scaler._next_loss_scale = scale, following
            scaler._unskipped = int(unskipped)
        if self._pending:
            self._loaded = loaded
        else:
            self._set_states(loaded, fname)
        if count is not None:
            self.num_update = count

    def _set_states(self, loaded: dict[str, mx.nd.NDArray], fname: str) -> None:
        expected = states_file.state_arrays(self.states, self.pushed, self._parts)
        states_file.check(loaded, expected, self.names, fname)
        for d in range(self.num_devices if self.params else 0):
            for key, target in states_file.state_arrays(self.states, self.pushed, self._parts,
                                                        device=d).items():
                loaded[key].astype(target.dtype).copyto(target)
        self._masters_current = True
