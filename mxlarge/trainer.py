"""``mxlarge.Trainer``: a drop-in for ``gluon.Trainer`` that applies Goyal et al.'s update.

Two forms, told apart by the second argument:

* **Gluon's** (the one-line migration, as Horovod's ``hvd.DistributedTrainer``)::

      trainer = mxlarge.Trainer(net.collect_params(), "sgd",
                                {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4},
                                kvstore="dist_sync", reference_batch=256, warmup_steps=500)
      ...
      trainer.step(batch_size)                 # per-worker images, as with gluon.Trainer

  ``optimizer`` is a name (``sgd``, ``nag``, ``lars``, ``lbsgd``) or an ``mx.optimizer``
  instance of those classes; ``optimizer_params`` are MXNet's own (``learning_rate``,
  ``momentum``, ``wd``, ``rescale_grad``, ``lr_scheduler``, ...), parsed by MXNet itself. The
  schedule is derived here, once the global batch is known (at construction with
  ``batch_size=``, else at the first update)::

      η_user(t) = lr_scheduler(t + 1)  or  learning_rate    (MXNet asks for 1 on update 0)
      B         = World(store workers, devices, simulated, n).global_batch
      ρ         = schedulers.scaled_lr(1, reference_batch, B, scaling)   (1 without a reference)
      η(t)      = warmed_up(ρ · η_user, warmup_steps, warmup_lr)         (warmup_lr = η_user(0))

* **mxlarge's explicit form**, for loops that already own a schedule::

      trainer = mxlarge.Trainer(net.collect_params(), schedule, momentum=0.9, weight_decay=1e-4)

  ``schedule(step) -> lr`` is final (build it with :func:`mxlarge.plan.plan` or
  :mod:`mxlarge.schedulers`); the large-batch keywords are refused there.

**One counter.** The trainer counts applied updates in :attr:`num_update`. ``step(n)`` applies
update ``num_update``; ``step(n, t)`` applies update ``t`` (a loop that owns its counter, e.g.
after a resume) and the trainer's count follows it (``num_update = t + 1``). Either way there
is one count per program, and both forms read the LR from it.

``step(n)`` sums the gradients over all k workers (and devices) and applies the update with
rescale s/(k·n) (s = ``rescale_grad``, 1 by default): each worker's loss is normalised by the
*global* batch (Goyal §3), not by its own n as ``gluon.Trainer.step(n)`` would, which on
dist_sync applies k times the intended update because servers sum.

What cannot be honoured is refused with the reason (:data:`REFUSED`): the optimizer never runs
on the servers (``update_on_kvstore=True`` loses ``wd_mult`` and LR changes on MXNet 1.9.1),
and every gradient is pushed every step (``ignore_stale_grad=True``).

**Deferred initialisation** (Gluon's shapes from the first forward): the Trainer may be built
before it. A parameter with its shape gets rank 0's value at construction; one without gets it
the moment Gluon initialises it (its ``_init_impl``, inside the first forward, before the
forward reads it), waited for, so no gradient push can race it; the optimizer states, buckets
and BN statistics follow once the last shape is known (as Horovod-MXNet broadcasts a deferred
parameter at its initialisation).

**What differs from gluon.Trainer** by default, said once on rank 0's stderr at construction:
momentum correction and no decay on BN γ/β and biases; ``momentum_correction=False,
decay_bn_bias=True`` give gluon.Trainer's update bitwise (sgd; nag without weight decay: MXNet's
in-place NAG kernel reads the updated weight in its decay term). The first step of a dist job
warns (rank 0) when every worker's gradients are bitwise equal: unsharded data.

A dist Trainer installs :func:`mxlarge.protocol.failfast.install_fail_fast`: an uncaught exception
prints its traceback and ends the process at once (status 1), instead of deadlocking in ps-lite's
exit barrier; a normal exit still goes through the barrier, where rank 0 stops the servers.
"""
from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mxnet as mx

from mxlarge import schedulers
from mxlarge.bnstats import BNStats
from mxlarge.kvstore import FUSION_BYTES
from mxlarge.kvstore.roles import ParamRole, param_roles, role_counts
from mxlarge.kvstore.sync import SyncStore
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.plan import World
from mxlarge.protocol.failfast import install_fail_fast
from mxlarge.protocol.heartbeat import LAUNCHED, Beat, Launched, launched_dir
from mxlarge.schedulers import Schedule

# Optimizer classes whose update mxlarge's LargeBatchSGD reproduces, by MXNet class name.
HONOURED = {"SGD": "sgd", "NAG": "nag", "LARS": "lars", "LBSGD": "lbsgd"}
# The update count's key in save_states files (the momentum keys are "momentum:<index>").
NUM_UPDATE_KEY = "num_update"


class MXNetSchedule:
    """η(t) = scheduler(t + 1) of a stateful MXNet/GluonCV LR scheduler, as a function of t.

    MXNet's optimizers call their scheduler with ``num_update`` = 1 on the first update, and
    schedulers such as ``MultiFactorScheduler`` or GluonCV's ``LRSequential`` must be called in
    increasing order; the values are computed in order once and kept, so the schedule can be
    asked for any step (the momentum correction asks for t − 1 and t).
    """

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.values: list[float] = []

    def __call__(self, step: int) -> float:
        while len(self.values) <= step:
            self.values.append(float(self.scheduler(len(self.values) + 1)))
        return self.values[step]


def _note_differences(momentum_correction: bool, decay_bn_bias: bool,
                      opt: Mapping[str, Any]) -> None:
    """The Gluon form's one note on stderr (rank 0, at construction): what this update does by
    default that gluon.Trainer's does not, and the keywords that make it gluon's."""
    differ = []
    if momentum_correction and opt["momentum"]:
        differ.append("momentum correction (the velocity is rescaled by lr_t/lr_{t-1} when "
                      "the LR changes: Goyal et al.'s eq. 9, not MXNet's eq. 10)")
    if not decay_bn_bias and opt["wd"]:
        differ.append("no weight decay on BatchNorm gamma/beta and biases")
    if not differ:
        return
    nag = (" (nag with wd: the decay term reads the weight before the update, MXNet's in-place "
           "kernel the updated one)" if opt["nesterov"] and opt["wd"] else "")
    print(f"mxlarge.Trainer: note: the update differs from gluon.Trainer's by "
          f"{' and '.join(differ)}; momentum_correction=False, decay_bn_bias=True give "
          f"gluon.Trainer's update{nag}", file=sys.stderr, flush=True)


def _optimizer_settings(optimizer: str | mx.optimizer.Optimizer,
                        optimizer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """What an MXNet optimizer (name + params, or instance) asks for, as LargeBatchSGD
    arguments; MXNet parses the params itself, so its own names and defaults apply."""
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name not in HONOURED.values():
            raise ValueError(f"optimizer {optimizer!r} is not supported: mxlarge applies "
                             "Goyal et al.'s momentum SGD; expected one of "
                             f"{', '.join(HONOURED.values())}")
        opt = mx.optimizer.create(name, **dict(optimizer_params or {}))
    else:
        if optimizer_params:
            raise ValueError("optimizer_params must be None when an optimizer instance is "
                             "given (as in gluon.Trainer)")
        opt = optimizer
        if type(opt).__name__ not in HONOURED:
            raise ValueError(f"optimizer {type(opt).__name__} is not supported: mxlarge "
                             "applies Goyal et al.'s momentum SGD; expected an instance of "
                             f"mx.optimizer.{', '.join(HONOURED)}")
    kind = HONOURED[type(opt).__name__]
    if opt.clip_gradient is not None:
        raise ValueError("clip_gradient is not supported: Goyal et al.'s update does not clip "
                         "(clip the summed gradient yourself between allreduce_grads() and "
                         "update())")
    if opt.multi_precision:
        raise ValueError("multi_precision is not supported: mxlarge keeps float32 weights")
    if opt.lr_mult or opt.wd_mult:
        raise ValueError("per-index lr_mult/wd_mult on the optimizer are not supported: set "
                         "Parameter.wd_mult = 0 for tensors without weight decay")
    if kind == "lbsgd":
        # LBSGD's own warmup/batch scaling would be applied on top of mxlarge's.
        defaults = {"warmup_strategy": "linear", "warmup_epochs": 5, "batch_scale": 1}
        changed = [k for k, v in defaults.items() if getattr(opt, k) != v]
        if changed or opt.init_updates:
            raise ValueError(f"lbsgd's {', '.join(changed) or 'begin_epoch'} are not "
                             "supported: use the Trainer's reference_batch, scaling, "
                             "warmup_steps and warmup_lr keywords (the warmup and LR "
                             "scaling are derived from the store's world size)")
    lars = kind in ("lars", "lbsgd")
    base: Schedule
    if opt.lr_scheduler is not None:
        base = MXNetSchedule(opt.lr_scheduler)
    else:
        base = schedulers.Constant(float(opt.lr))
    return {"base": base, "momentum": float(getattr(opt, "momentum", 0.0)),
            "nesterov": kind == "nag", "wd": float(opt.wd), "lars": lars,
            "lars_eta": float(getattr(opt, "eta", 0.001)),
            "lars_eps": float(getattr(opt, "eps", 0.0)) if kind == "lars" else 0.0,
            "rescale": float(opt.rescale_grad), "begin": int(opt.begin_num_update),
            "mxnet": opt}


class _GluonStates(pickle.Unpickler):
    """Reads ``gluon.Trainer.save_states`` files: a pickle of (states, optimizer) or states.

    Only MXNet (and GluonCV scheduler) classes and plain containers may be constructed: a
    states file is data, never code to run.
    """

    _ALLOWED_MODULES = ("mxnet.", "gluoncv.")
    _ALLOWED = {("builtins", "bytearray"), ("copyreg", "_reconstructor"),
                ("builtins", "object")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED or module.startswith(self._ALLOWED_MODULES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a states file")


def _explicit_step(step: int | bool | None, ignore_stale_grad: bool) -> int | None:
    """The explicit step, if any; gluon.Trainer's second positional is ``ignore_stale_grad``."""
    if isinstance(step, bool):
        step, ignore_stale_grad = None, step
    if ignore_stale_grad:
        raise ValueError("ignore_stale_grad=True is not supported: on dist_sync every worker "
                         "must push every gradient each step; give parameters that get no "
                         "gradient grad_req='null' before building the Trainer")
    return step


class Trainer:
    """Large-minibatch SGD over a KVStore (module docstring: the two forms, the one counter).

    Args:
        params: ``net.collect_params()`` (initialised; shapes may come from the first forward).
        optimizer: Gluon form: ``sgd``, ``nag``, ``lars``/``lbsgd`` or an ``mx.optimizer``
            instance of SGD/NAG/LARS/LBSGD. Explicit form: ``schedule(step) -> lr``.
        optimizer_params: MXNet optimizer arguments (Gluon form only).
        kvstore: ``local``, ``device``, ``dist_sync``, ``dist_device_sync``, a store from
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
            (:func:`mxlarge.kvstore.sync.fuse`); 0: one key per tensor.
        bn_stats: BN statistics for evaluation/checkpoints: ``local``, ``broadcast``, ``reduce``
            (owned by :attr:`bn`, a :class:`~mxlarge.bnstats.BNStats`).
        simulate_workers: K > 1 reproduces K dist_sync workers in this process: the loop runs
            K micro-batches of n, each under its own copy of the BN running statistics
            (``trainer.bn.worker(j)``), gradients accumulate (``grad_req='add'``), and one
            update with rescale 1/(K·n) follows (1/(P·K·n) with P dist_sync processes, each
            simulating K: the servers sum the P accumulated gradients). Needs one device.
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
                 lars_eta: float | None = None, momentum_correction: bool = True,
                 decay_bn_bias: bool = False, compression: dict | None = None,
                 fusion_bytes: int = FUSION_BYTES,
                 bn_stats: str = "reduce", simulate_workers: int = 1,
                 heartbeat: str | Path | Launched | None = LAUNCHED):
        if update_on_kvstore:
            raise ValueError("update_on_kvstore=True is not supported: on MXNet 1.9.1 the "
                             "servers would run a pickled optimizer that loses wd_mult and LR "
                             "changes; mxlarge sums gradients on the servers and updates on "
                             "every worker (leave it None or False)")
        if compression_params and compression and compression_params != compression:
            raise ValueError("compression_params and compression are the same setting: "
                             "give one")
        compression = compression or compression_params
        explicit = {"momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay,
                    "lars": lars, "lars_eta": lars_eta}
        gluon_form = isinstance(optimizer, (str, mx.optimizer.Optimizer))
        if gluon_form:
            given = [k for k, v in explicit.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: with optimizer {optimizer!r} these go "
                                 "in optimizer_params (MXNet's names: momentum, wd, eta), as "
                                 "with gluon.Trainer")
            opt = _optimizer_settings(optimizer, optimizer_params)
        elif callable(optimizer):
            lb = {"optimizer_params": optimizer_params, "reference_batch": reference_batch,
                  "warmup_steps": warmup_steps or None, "warmup_lr": warmup_lr,
                  "batch_size": batch_size}
            given = [k for k, v in lb.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: a schedule passed to the Trainer is "
                                 "final; derive it with mxlarge.plan.plan or "
                                 "mxlarge.schedulers, or pass an optimizer name instead")
            opt = {"base": optimizer, "momentum": 0.9 if momentum is None else momentum,
                   "nesterov": bool(nesterov), "lars": bool(lars),
                   "wd": 1e-4 if weight_decay is None else weight_decay,
                   "lars_eta": 0.001 if lars_eta is None else lars_eta, "lars_eps": 0.0,
                   "rescale": 1.0, "begin": 0, "mxnet": None}
        else:
            raise ValueError(f"optimizer {optimizer!r}: expected an optimizer name, an "
                             "mx.optimizer instance or a schedule(step) -> lr")
        if scaling not in ("linear", "sqrt", "none"):
            raise ValueError(f"scaling {scaling!r}: expected linear, sqrt or none")
        if not hasattr(params, "keys"):  # gluon.Trainer also takes a list of Parameters
            params = list(params)
            bad = [p for p in params if not isinstance(p, mx.gluon.Parameter)]
            if bad:
                raise ValueError(f"params: expected a ParameterDict (net.collect_params()), a "
                                 f"dict or a list of Parameters, got a {type(bad[0]).__name__}")
            params = {p.name: p for p in params}
        self.names = list(params.keys())
        self.params = list(params.values())
        self._param_map = dict(params)
        for name, p in zip(self.names, self.params):
            if p._data is None and not p._deferred_init:
                raise ValueError(f"parameter '{name}' is not initialised: call "
                                 "net.initialize() before building the Trainer")
            if p.lr_mult != 1.0 or p.wd_mult not in (0.0, 1.0):
                raise ValueError(f"parameter '{name}': lr_mult {p.lr_mult}, wd_mult "
                                 f"{p.wd_mult}: only lr_mult 1 and wd_mult 0 or 1 are "
                                 "supported (one LR schedule; decay on or off per tensor)")
        kind = "local" if kvstore is None else kvstore
        if (kind if isinstance(kind, str) else kind.type).startswith("dist"):
            # A dist worker that raises would wait forever in ps-lite's exit barrier for peers
            # that wait in push/pull for it: every script using this Trainer leaves at once
            # (installed first: the process may have a dist store already, see sync.create).
            install_fail_fast()
        self.store = SyncStore(kind, self.params, compression=compression,
                               fusion_bytes=fusion_bytes)
        # Progress for the launcher's stall watchdog (None outside a launched job).
        beats = launched_dir() if heartbeat is LAUNCHED else heartbeat
        self.heartbeat = (Beat(beats, self.store.rank)
                          if beats is not None and self.store.distributed else None)
        self._last_update: mx.nd.NDArray | None = None
        self.scale = opt["rescale"]
        self._base: Schedule = opt["base"]
        self._lb = (reference_batch, scaling, int(warmup_steps), warmup_lr) if gluon_form \
            else None
        # The MXNet optimizer the Gluon form was given: what it refuses, this Trainer refuses.
        self._mxnet_optimizer: mx.optimizer.Optimizer | None = opt["mxnet"]
        self._batch: int | None = None  # images per worker and step the schedule is fixed for
        self._main: Schedule = self._base
        self._overrides: list[tuple[int, float]] = []  # set_learning_rate: (from step, lr)
        self.updater = LargeBatchSGD(
            self._base, momentum=opt["momentum"], nesterov=opt["nesterov"],
            momentum_correction=momentum_correction, wd=opt["wd"],
            lars=opt["lars"], lars_eta=opt["lars_eta"], lars_eps=opt["lars_eps"])
        self.updater.num_update = opt["begin"]
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
        if gluon_form and self.store.rank == 0:
            _note_differences(momentum_correction, decay_bn_bias, opt)
        # Rank 0's initial values: now for parameters with shapes, at their initialisation for
        # the others (deferred: the first forward), before that forward reads them.
        self.store.init_params([i for i, p in enumerate(self.params) if p._data is not None])
        self._pending = {i for i, p in enumerate(self.params) if p._data is None}
        for i in sorted(self._pending):
            self._watch(i)
        self._batch_size = batch_size
        if not self._pending:
            self._ready()

    def _watch(self, i: int) -> None:
        """Runs :meth:`_parameter_ready` right after parameter ``i`` gets its data (Gluon's
        ``_init_impl``: the first forward's deferred initialisation, or a load)."""
        p = self.params[i]
        init_impl = p._init_impl

        def hook(data: mx.nd.NDArray, ctx_list: list) -> None:
            init_impl(data, ctx_list)
            del p._init_impl  # the class's method again
            self._parameter_ready(i)

        p._init_impl = hook

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
        # one optimizer state per (parameter, device): devices apply identical updates
        self.states = [[self.updater.create_state(i, w) for w in self.params[i].list_data()]
                       for i in range(len(self.params))]
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
    def optimizer(self) -> LargeBatchSGD:
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
                first = mx.nd.concat(mx.nd.add_n(*[g.sum() for g in grads]),
                                     mx.nd.add_n(*[g.norm() for g in grads]), dim=0)
        self.store.allreduce_grads()
        if first is not None:
            self._check_sharded(first.asnumpy())

    def _check_sharded(self, checksum: Any) -> None:
        """Warns once, on rank 0, when every worker's first gradients are bitwise equal
        (``checksum``: Σ sums and Σ norms of this worker's gradients; one exact gather):
        the workers read the same data, and k identical copies train."""
        if not self.store.same_on_every_rank(checksum) or self.rank != 0:
            return
        print(f"mxlarge.Trainer: warning: the first gradients of all {self.num_workers} "
              "workers are bitwise equal: every worker reads the same data, so the job trains "
              f"{self.num_workers} identical copies. Give each worker its own part: "
              "mx.io.ImageRecordIter(..., num_parts=trainer.num_workers, "
              "part_index=trainer.rank), or a DataLoader with a split sampler "
              "(gluoncv.data.sampler.SplitSampler(len(dataset), num_parts=trainer.num_workers, "
              "part_index=trainer.rank))", file=sys.stderr, flush=True)

    def update(self, batch_size: int, step: int | None = None,
               ignore_stale_grad: bool = False) -> None:
        """Applies update ``step`` (default :attr:`num_update`) to already-reduced gradients,
        with rescale s/(k·n); then ``num_update = step + 1``.

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
        t = self.num_update if step is None else int(step)
        beat = self.heartbeat
        if beat is not None:
            beat.step(beat.done, t)  # this worker's gradients of update t are pushed
            # Python must not run ahead of a stuck job: wait for update t-1 (update t's
            # forward/backward are queued already, so the engine never idles here).
            if self._last_update is not None:
                self._last_update.wait_to_read()
            beat.step(t, t)
        rescale = self.scale / (batch_size * self.num_workers)
        if self._grads_version != self.store.grads_version:
            self._gather_update_args()
        for weights, grads, states in self._update_args:
            self.updater.apply(t, self.pushed, weights, grads, states, rescale)
        if beat is not None and self._update_args:
            self._last_update = self._update_args[0][0][0]
        self.num_update = t + 1

    def step(self, batch_size: int, step: int | None = None,
             ignore_stale_grad: bool = False) -> None:
        """``allreduce_grads()`` then ``update(batch_size, step)``."""
        step = _explicit_step(step, ignore_stale_grad)  # refused before anything is pushed
        self.allreduce_grads()
        self.update(batch_size, step)

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
    def state_arrays(self) -> dict[str, mx.nd.NDArray]:
        """Momentum buffers (device 0) keyed ``momentum:<parameter index>``.

        Positions, not names: Gluon 1.x names parameters with process-global counters, so the
        same net built twice in one process gets different names.
        """
        self._check_ready()
        return {f"momentum:{i}": self.states[i][0]
                for i in self.pushed if self.states[i][0] is not None}

    def save_states(self, fname: str) -> None:
        """Writes the momentum buffers and the update count (``num_update``, an int64 array) as
        an MXNet NDArray file (no pickle)."""
        mx.nd.save(fname, {**self.state_arrays(),
                           NUM_UPDATE_KEY: mx.nd.array([self.num_update], dtype="int64")})

    def load_states(self, fname: str) -> None:
        """Loads what :meth:`save_states` wrote, or ``gluon.Trainer.save_states``'s file.

        The update count is restored (and with it the schedule position and the momentum
        correction: a run resumed by ``step(n)`` continues where it stopped): from
        ``num_update`` in mxlarge's file, from the pickled optimizer's ``num_update`` in Gluon's.
        Gluon's file is a pickle of (states by parameter index, optimizer); besides the count
        only its momentum is taken (MXNet's velocity, the same eq. (10) quantity mxlarge's
        kernels keep), read with an unpickler that constructs nothing but MXNet classes. The LR
        schedule comes from this Trainer's arguments, not from the file. Keys and shapes are
        checked (a file of another net, or from a list of parameters rather than a
        ParameterDict, is refused); before the first forward of a net with deferred
        initialisation, the momentum is kept and checked and set once the shapes are known.
        """
        with open(fname, "rb") as fh:
            head = fh.read(1)
        if head == b"\x80":
            loaded, count = self._gluon_states(fname)
        else:
            loaded = mx.nd.load(fname)
            count = loaded.pop(NUM_UPDATE_KEY, None)
            count = None if count is None else int(count.asnumpy()[0])
        if self._pending:
            self._loaded = loaded
        else:
            self._set_states(loaded, fname)
        if count is not None:
            self.num_update = count

    def _set_states(self, loaded: dict[str, mx.nd.NDArray], fname: str) -> None:
        expected = self.state_arrays()
        missing = sorted(set(expected) - set(loaded))
        extra = sorted(set(loaded) - set(expected))
        if missing or extra:
            raise ValueError(f"{fname}: optimizer states do not match this net "
                             f"(missing {missing[:3]}, unexpected {extra[:3]})")
        for key, value in expected.items():
            if loaded[key].shape != value.shape:
                name = self.names[int(key.split(":")[1])]
                raise ValueError(f"{fname}: '{key}' ({name}) has shape {loaded[key].shape}, "
                                 f"expected {value.shape}")
        for key in expected:
            for s in self.states[int(key.split(":")[1])]:
                loaded[key].copyto(s)

    def _gluon_states(self, fname: str) -> tuple[dict[str, mx.nd.NDArray], int | None]:
        """Gluon's states by parameter index, re-keyed to this Trainer's positions (gluon.Trainer
        numbers a ParameterDict's parameters in *sorted name* order), and the pickled
        optimizer's ``num_update`` (None when the file has no optimizer)."""
        with open(fname, "rb") as fh:
            try:
                obj = _GluonStates(io.BytesIO(fh.read())).load()
            except (pickle.UnpicklingError, AttributeError, ImportError, EOFError) as e:
                raise ValueError(f"{fname}: not a gluon.Trainer states file ({e})") from None
        states, optimizer = obj if isinstance(obj, tuple) and len(obj) == 2 else (obj, None)
        if not isinstance(states, dict):
            raise ValueError(f"{fname}: not a gluon.Trainer states file")
        by_gluon_index = {j: self.names.index(name) for j, name in enumerate(sorted(self.names))}
        out = {}
        for index, state in states.items():
            if isinstance(state, (tuple, list)):
                raise ValueError(f"{fname}: multi-precision states are not supported")
            if state is not None:
                out[f"momentum:{by_gluon_index.get(int(index), -1)}"] = state
        count = getattr(optimizer, "num_update", None)
        return out, None if count is None else int(count)
