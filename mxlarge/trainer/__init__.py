"""``mxlarge.Trainer``: a ``gluon.Trainer`` that applies Goyal et al.'s update over a KVStore.

A subclass of ``mx.gluon.Trainer``, as Horovod's ``DistributedTrainer`` is: it overrides
the exchange (:meth:`Trainer.allreduce_grads`), the update (:meth:`Trainer.update`), the
store and the states files, and inherits the rest, so MXNet's AMP and Gluon's own API
work with it. Its arguments are resolved once by :mod:`mxlarge.trainer.settings`
(Gluon's form and mxlarge's explicit one, every keyword documented there); η(t) is
:mod:`mxlarge.trainer.lr`'s, the optimizer states :mod:`mxlarge.trainer.states`', the
exchange the store's (:class:`mxlarge.kvstore.sync.SyncStore`).

One step path: ``step(n)`` is ``allreduce_grads()`` then ``update(n)``, and the loop and
a script's own calls run the same sequence, told to the step observers
(:mod:`mxlarge.observers`: the heartbeat, the breakdown, the timeline, your own). One
counter: :attr:`num_update` counts applied updates; ``step(n)`` applies update
``num_update``, ``step(n, t)`` applies update t and the count follows. The update sums
the gradients over k workers (and devices) and rescales by s/(k·n), s = ``rescale_grad``
(divided by AMP's loss scale under ``amp.scale_loss``): each worker's loss is normalised
by the *global* batch (Goyal §3), where ``gluon.Trainer.step(n)`` on dist_sync applies k
times the update. Under AMP, overflow is decided on the summed gradients, so every rank
skips the same steps, and a skipped step does not count (Gluon's rule). The user's
guide: docs/trainer.md.
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge.bnstats import BNStats
from mxlarge.kvstore.any_optimizer import MXNetUpdate
from mxlarge.kvstore.roles import param_roles, role_counts
from mxlarge.kvstore.sync import SyncStore
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.observers import DataWait, Observers, Step, StepObserver
from mxlarge.observers.worker import worker_observers
from mxlarge.plan import World
from mxlarge.protocol.session import SESSION
from mxlarge.schedulers import Schedule
from mxlarge.trainer import checks
from mxlarge.trainer.deferred import on_init
from mxlarge.trainer.gluon_args import HONOURED, MXNetSchedule, store_name
from mxlarge.trainer.lr import LearningRate
from mxlarge.trainer.settings import KEYWORDS, resolve
from mxlarge.trainer.settings import named_params as _named_params
from mxlarge.trainer.states import NUM_UPDATE_KEY, OptimizerStates

__all__ = ["Trainer", "HONOURED", "MXNetSchedule", "NUM_UPDATE_KEY"]


def _accumulate(params: list[mx.gluon.Parameter], simulated_workers: int) -> None:
    """Gradients accumulate over simulated workers' micro-batches (one device only)."""
    if simulated_workers == 1:
        return
    if params and len(params[0].list_ctx()) > 1:
        raise ValueError("simulate_workers needs a single device per process")
    for p in params:
        if p.grad_req != "null":
            p.grad_req = "add"


def _known(keywords: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(keywords) - KEYWORDS)
    if unknown:
        raise TypeError(f"Trainer() got an unexpected keyword argument {unknown[0]!r}")
    return keywords


def _explicit_step(step: int | bool | None, ignore_stale_grad: bool) -> int | None:
    """The explicit step, if any; gluon.Trainer's second positional is ``ignore_stale_grad``."""
    if isinstance(step, bool):
        ignore_stale_grad = step
        step = None
    if ignore_stale_grad:
        raise ValueError("ignore_stale_grad=True is not supported: on dist_sync every worker "
                         "must push every gradient each step; give parameters that get no "
                         "gradient grad_req='null' before building the Trainer")
    return step


class Trainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` running large-minibatch SGD over a KVStore (module
    docstring).

    ``Trainer(params, optimizer, optimizer_params, kvstore, compression_params,
    update_on_kvstore, observers=(), **keywords)``: Gluon's arguments and mxlarge's
    keywords, all documented at :func:`mxlarge.trainer.settings.resolve`. ``params``:
    ``net.collect_params()`` (initialised; shapes may come from the first forward, when
    the parameter gets rank 0's value: :mod:`mxlarge.trainer.deferred`). ``observers``:
    step observers of your own (:class:`mxlarge.observers.StepObserver`), beside the
    ones the Trainer makes for a launched worker.
    """

    def __init__(self, params: Mapping[str, mx.gluon.Parameter] | Sequence[mx.gluon.Parameter],
                 optimizer: str | mx.optimizer.Optimizer | Schedule = "sgd",
                 optimizer_params: Mapping[str, Any] | None = None,
                 kvstore: str | mx.kv.KVStore | None = "local",
                 compression_params: dict | None = None, update_on_kvstore: bool | None = None,
                 observers: Sequence[StepObserver] = (), **keywords: Any):
        if store_name(kvstore).startswith("dist"):  # first: a refusal below must end it too
            SESSION.install_fail_fast()  # else it waits in ps-lite's exit barrier forever
        s = resolve(optimizer, optimizer_params, kvstore, compression_params, update_on_kvstore,
                    **_known(keywords))
        self.settings = s
        named = _named_params(params)
        self.names = list(named)
        self.updater: LargeBatchSGD | MXNetUpdate = s.updater()
        # Gluon's own construction with no store of its own: ``_params`` in this order,
        # ``_optimizer`` the updater, the attributes AMP and Gluon's helpers read.
        super().__init__(list(named.values()), self.updater, kvstore=None,
                         update_on_kvstore=False)
        self.params: list[mx.gluon.Parameter] = self._params
        self._scale = s.rescale  # Gluon's s; AMP's scale_loss divides it by the loss scale
        self._args_current = False  # the update's argument lists hold the gradient arrays
        self._current: Step | None = None  # the step in progress
        self.observers = Observers(list(observers))
        self.store = SyncStore(s.kvstore, self.params, compression=s.compression,
                               fusion_bytes=s.fusion_bytes, wire_dtype=s.wire_dtype,
                               on_grads=self._grads_changed, observers=self.observers)
        self.collectives = self.store.collectives
        self._init_kvstore()
        own = worker_observers(self.collectives, s.heartbeat, s.reports, s.timeline, s.breakdown,
                               self if s.track else None, self.store.holders)
        for observer in own:
            self.observers.add(observer)
        self.lr = LearningRate(self.updater, s.base, (
            s.reference_batch, s.scaling, s.warmup_steps, s.warmup_lr) if s.gluon_form else None,
            s.mxnet_optimizer)
        self.opt_states = OptimizerStates(self.updater, self.params, self.names)
        self.simulated_workers = s.simulate_workers
        _accumulate(self.params, self.simulated_workers)
        self._first_step_checked = False
        self._batch_warned = False
        if self.rank == 0:
            s.note_differences(self.num_workers, self.rank)
        # Rank 0's values: now for parameters with shapes, for the others at their
        # deferred initialisation (the first forward), before that forward reads them.
        self._pending = {i for i, p in enumerate(self.params) if p._data is None}
        self._broadcast([i for i in range(len(self.params)) if i not in self._pending])
        for i in sorted(self._pending):
            # mypy cannot type a lambda with a default argument against Callable[[], None]
            on_init(self.params[i], lambda i=i: self._parameter_ready(i))  # type: ignore[misc]
        if not self._pending:
            self._ready()

    # -- gluon.Trainer's store hooks: the store is made at construction, never lazily --
    def _init_kvstore(self) -> None:
        self._kvstore = self.collectives.kv
        self._distributed = self.collectives.distributed
        self._update_on_kvstore = False
        self._kv_initialized = True
        self._params_to_init: list[mx.gluon.Parameter] = []

    def _init_params(self) -> None:
        """Nothing to do: parameters got rank 0's values (``_broadcast``)."""

    def _row_sparse_pull(self, parameter: Any, out: Any, row_id: Any,
                         full_idx: bool = False) -> None:
        raise ValueError("sparse parameters are not supported by mxlarge.Trainer")

    # -- readiness: every shape known --------------------------------------------------
    def _broadcast(self, indices: list[int]) -> None:
        self.store.init_params(indices)

    def _parameter_ready(self, i: int) -> None:
        self._broadcast([i])
        self._pending.discard(i)
        if not self._pending:
            self._ready(in_forward=True)

    def _ready(self, in_forward: bool = False) -> None:
        """Everything that needs the shapes: roles, the store's plan, optimizer states, BN."""
        s = self.settings
        self.roles = param_roles(dict(zip(self.names, self.params)),
                                 decay_bn_bias=s.decay_bn_bias)
        plan = self.store.plan(self.roles, in_forward=in_forward)
        self.pushed = list(plan.pushed)
        self.updater.no_decay = tuple(sorted(
            i for i in self.pushed if not self.roles[i].decay or self.params[i].wd_mult == 0.0))
        half = [self.names[i] for i in self.pushed
                if np.dtype(self.params[i].dtype) == np.float16]
        if half and not self.updater.multi_precision:
            warnings.warn(f"float16 weights ({half[0]}, ...) are updated in float16: pass "
                          "multi_precision=True (optimizer_params) to keep float32 master "
                          "weights and momentum, as MXNet's SGD recommends", stacklevel=3)
        self.opt_states.create(plan.pushed)
        self.bn = BNStats(self.params, plan.stats, self.collectives, s.bn_stats,
                          self.simulated_workers)
        self._gather_update_args()
        if s.batch_size is not None and self.lr.batch is None:
            checks.note_scaled_down(self.lr.fix(s.batch_size, self.world), self.num_workers,
                                    self.rank)

    def _grads_changed(self) -> None:
        """The store made other arrays some parameters' gradients (``on_grads``)."""
        self._args_current = False

    def _gather_update_args(self) -> None:
        """The update's arguments per device: weights, gradients and states of the
        pushed parameters (Gluon keeps its arrays for the life of the parameters)."""
        self._args_current = True
        self._update_args = [
            ([self.params[i].list_data()[d] for i in self.pushed], self._grads_of(d),
             self.opt_states.on_device(d)) for d in range(self.num_devices if self.params else 0)]

    def _device_arrays(self, part: int) -> list[mx.nd.NDArray]:
        """Device 0's weights (``part`` 0) or gradients (1) of the pushed parameters, as the
        update's argument lists hold them (gathered again when the store changed them)."""
        if not self._args_current:
            self._gather_update_args()
        if not self._update_args:
            return []
        return self._update_args[0][part]

    @property
    def is_ready(self) -> bool:
        """Whether every parameter has its shape (deferred ones get it at the first forward)."""
        return not self._pending

    def _check_ready(self) -> None:
        if self._pending:
            names = [self.names[i] for i in sorted(self._pending)][:3]
            raise ValueError(f"parameters {', '.join(names)} were never initialised: run the "
                             "net's forward pass (inside autograd.record()) before step()")

    # -- the schedule ------------------------------------------------------------------
    def world(self, batch_size: int) -> World:
        """This job's :class:`~mxlarge.plan.World` for ``batch_size`` images per worker."""
        units = self.num_devices * self.simulated_workers
        if batch_size % units:
            raise ValueError(f"batch size {batch_size} does not split evenly over "
                             f"{units} device(s)/simulated worker(s)")
        return World(processes=self.num_workers, devices=self.num_devices,
                     simulated=self.simulated_workers, batch=batch_size // units)

    @property
    def schedule(self) -> Schedule:
        """η(t), the schedule the updates follow (after :meth:`set_learning_rate` calls)."""
        return self.lr.schedule

    def set_learning_rate(self, lr: float) -> None:
        """``lr`` (as is: already scaled) from the next update on (:meth:`LearningRate.set`)."""
        self.lr.set(lr)

    @property
    def learning_rate(self) -> float:
        """η of the most recent update, as gluon.Trainer's (:meth:`LearningRate.current`)."""
        return self.lr.current()

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

    def lr_at(self, step: int) -> float:
        """η(step) of the schedule."""
        return self.updater.lr_at(step)

    # -- facts -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.collectives.rank

    @property
    def num_workers(self) -> int:
        return self.collectives.num_workers

    @property
    def num_devices(self) -> int:
        return len(self.params[0].list_ctx())

    @property
    def num_units(self) -> int:
        """Gradient contributors per step, Goyal's k: workers · devices · simulated."""
        return self.num_workers * self.num_devices * self.simulated_workers

    def units(self) -> Iterator[tuple[int, mx.Context]]:
        """Yields this process's units ``(u, ctx)``, u of :attr:`num_units`: unit u is
        worker u of the declared world, whatever process computes it. A script that
        computes unit u's share of the step under each keeps an ``--elastic`` job's
        smaller world (2 workers → 1 worker × 2 simulated) the same training.

        With simulated workers each yield has that unit's BN running statistics in
        place, and the gradients, which accumulate (``grad_req='add'``), are zeroed
        before the first.
        """
        contexts = self.params[0].list_ctx()
        if self.simulated_workers == 1:
            for d, ctx in enumerate(contexts):
                yield self.rank * len(contexts) + d, ctx
            return
        if self._pending:
            raise ValueError("units() with simulated workers needs every shape: run the "
                             "net's forward once before the training loop")
        for g in self.grads(0):
            g[:] = 0
        for unit, _ in self.bn.each_unit():
            yield unit, contexts[0]

    def role_counts(self) -> dict[str, int]:
        return role_counts(self.roles)

    def grads(self, device: int = 0) -> list[mx.nd.NDArray]:
        """The gradient arrays of the pushed parameters on ``device``, in order."""
        if self._args_current and device < len(self._update_args):
            return list(self._update_args[device][1])  # no lookup per parameter a step
        return self._grads_of(device)

    def _grads_of(self, device: int) -> list[mx.nd.NDArray]:
        return [self.params[i].list_grad()[device] for i in self.pushed]

    # -- the step ----------------------------------------------------------------------
    def begin_step(self, t: int | None = None, data: DataWait | None = None) -> Step:
        """Begins step ``t`` (default :attr:`num_update`) and tells the observers;
        returns it.

        The loop calls it before its forward, with its wait for the batch (``data``). A
        script's step begins by itself at ``allreduce_grads()`` (or ``update()``)."""
        if t is None:
            t = self.num_update
        self._current = Step(int(t), data)
        self.observers.step_begun(self._current)
        return self._current

    def _in_progress(self, t: int | None = None) -> Step:
        """The step in progress, begun at ``t`` (default :attr:`num_update`) if there is none."""
        if self._current is None:
            return self.begin_step(t)
        return self._current

    def allreduce_grads(self) -> None:
        """Sums gradients over workers and devices (exposed for gradient statistics). A
        16-bit wire carries s·g (s: the AMP-unscaled ``rescale_grad``), so its range
        does not depend on AMP's loss scale; the gradients come back in their own scale.
        The first call of a dist job also checks the data is sharded
        (:mod:`mxlarge.trainer.checks`)."""
        self._check_ready()
        step = self._in_progress()
        first = None
        if not self._first_step_checked:
            self._first_step_checked = True
            if self.collectives.distributed and self.num_workers > 1 and self.pushed:
                first = checks.checksum(self.grads(0))
        self.observers.exchange_begun(step, self._device_arrays(1))
        self.store.allreduce_grads(prescale=self._scale, step=step)
        # the store may have made bucket views the gradients (in_forward plans): the sums
        # are in the arrays gathered again
        self.observers.exchange_done(step, self._device_arrays(1))
        if first is not None:
            checks.warn_if_unsharded(first.asnumpy(), self.collectives)

    def update(self, batch_size: int, step: int | None = None,
               ignore_stale_grad: bool = False) -> bool:
        """Applies update ``step`` (default :attr:`num_update`) to already-reduced
        gradients, with rescale s/(k·n); then ``num_update = step + 1``. Under AMP, a
        step whose summed gradients overflowed is skipped on every rank and the count
        stays (Gluon's rule). Returns whether the update was applied. Ends the step in
        progress.

        Args:
            batch_size: images this worker processed in the step, over all its devices (n per
                device times devices). The first call fixes the Gluon form's schedule.
            step: updates applied so far, for loops that own the counter.
            ignore_stale_grad: False only (every gradient is summed every step).
        """
        step = _explicit_step(step, ignore_stale_grad)
        self._check_ready()
        if self.lr.batch is None:
            checks.note_scaled_down(self.lr.fix(batch_size, self.world), self.num_workers,
                                    self.rank)
        elif batch_size != self.lr.batch and not self._batch_warned:  # one comparison a step
            self._batch_warned = checks.warn_if_global(batch_size, self.lr.batch,
                                                       self.num_workers, self.rank)
        t = self.num_update if step is None else int(step)
        current = self._in_progress(t)
        self._current = None
        self.observers.update_begun(current)
        applied = self._apply(t, batch_size)
        current.applied = applied
        self.observers.update_done(current, applied, self._device_arrays(0))
        return applied

    def _apply(self, t: int, batch_size: int) -> bool:
        """The optimizer's update t, and AMP's overflow rule: whether it was applied."""
        if not self._args_current:
            self._gather_update_args()
        self.opt_states.refresh_masters()
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
        self.num_update = t + 1
        return True

    def step(self, batch_size: int, step: int | None = None,
             ignore_stale_grad: bool = False) -> bool:
        """``allreduce_grads()`` then ``update(batch_size, step)``; whether it was applied."""
        step = _explicit_step(step, ignore_stale_grad)  # refused before anything is pushed
        self._check_ready()
        self.begin_step(step)
        self.allreduce_grads()
        return self.update(batch_size, step)

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Tells the launcher's stall watchdog that this worker is ``what`` (e.g.
        evaluating) rather than stepping: such a phase may last 10 stall timeouts. A
        no-op outside a launched job."""
        with self.observers.busy(what):
            yield

    def check_replicas(self, step: int) -> None:
        """Every pushed weight's sum is bitwise rank 0's (:mod:`mxlarge.kvstore.collectives`)."""
        self.collectives.check_replicas(
            step, [self.params[i].list_data()[0] for i in self.pushed],
            [self.roles[i].name for i in self.pushed])

    # -- states ------------------------------------------------------------------------
    def state_arrays(self) -> dict[str, mx.nd.NDArray]:
        """Device 0's optimizer states by ``<part>:<i>`` (:mod:`mxlarge.trainer.states`)."""
        self._check_ready()
        return self.opt_states.arrays(getattr(self, "_amp_loss_scaler", None))

    def save_states(self, fname: str) -> None:
        """Writes :meth:`state_arrays` and the update count (``num_update``, an int64
        array) as an MXNet NDArray file (no pickle)."""
        self._check_ready()
        self.opt_states.save(fname, self.num_update, getattr(self, "_amp_loss_scaler", None))

    def load_states(self, fname: str) -> None:
        """Loads what :meth:`save_states` wrote, or ``gluon.Trainer.save_states``'s file
        (its momentum and master weights; :mod:`mxlarge.trainer.states`), and the update
        count with it (the schedule position and the momentum correction)."""
        count = self.opt_states.load(fname, getattr(self, "_amp_loss_scaler", None))
        if count is not None:
            self.num_update = count
