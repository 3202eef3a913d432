"""``mxlarge.Trainer``: a ``gluon.Trainer``-like object that applies Goyal et al.'s update.

Use it in your own Gluon loop the way ``gluon.Trainer`` is used, with one difference: the step
number is passed in (the loop owns the only counter, as in timm's scheduler contract)::

    trainer = mxlarge.Trainer(net.collect_params(), schedule=sched, kvstore="dist_sync")
    for step, (x, y) in enumerate(batches):
        with autograd.record():
            loss = loss_fn(net(x), y)          # per-sample losses; backward sums them
        loss.backward()
        trainer.step(x.shape[0], step)         # per-worker batch n

``step(n, t)`` sums the gradients over all k workers (and devices) and applies update ``t``
with rescale 1/(k·n): each worker's loss is normalised by the *global* batch (Goyal §3), not by
its own n as ``gluon.Trainer.step(n)`` would, which on dist_sync applies k times the intended
update because servers sum.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mxnet as mx

from mxlarge.bnstats import BNStats
from mxlarge.kvstore.roles import ParamRole, param_roles, role_counts
from mxlarge.kvstore.sync import SyncStore
from mxlarge.kvstore.updater import LargeBatchSGD


class Trainer:
    """Large-minibatch SGD over a KVStore.

    Args:
        params: ``net.collect_params()`` (initialised, shapes known).
        schedule: ``schedule(step) -> lr`` (see :mod:`mxlarge.schedulers`).
        momentum: m.
        nesterov: Nesterov momentum.
        momentum_correction: rescale the velocity by η_t/η_{t−1}.
        weight_decay: λ for conv/dense weights.
        decay_bn_bias: also decay BN γ/β and biases (off in Goyal et al.).
        lars: layer-wise adaptive rate scaling; ``lars_eta`` its coefficient.
        kvstore: ``local``, ``device``, ``dist_sync`` or ``dist_device_sync``, or a store from
            :func:`mxlarge.kvstore.sync.create`.
        compression: e.g. ``{'type': '2bit', 'threshold': 0.5}`` (dist only).
        bn_stats: BN statistics for evaluation/checkpoints: ``local``, ``broadcast``, ``reduce``
            (owned by :attr:`bn`, a :class:`~mxlarge.bnstats.BNStats`).
        simulate_workers: K > 1 reproduces K dist_sync workers in this process: the loop runs
            K micro-batches of n, each under its own copy of the BN running statistics
            (``trainer.bn.worker(j)``), gradients accumulate (``grad_req='add'``), and one
            update with rescale 1/(K·n) follows. Needs a local store and one device.
    """

    def __init__(self, params: Mapping[str, mx.gluon.Parameter], schedule: Any, *,
                 momentum: float = 0.9, nesterov: bool = False, momentum_correction: bool = True,
                 weight_decay: float = 1e-4, decay_bn_bias: bool = False, lars: bool = False,
                 lars_eta: float = 0.001, kvstore: str | mx.kv.KVStore = "local",
                 compression: dict | None = None,
                 bn_stats: str = "reduce", simulate_workers: int = 1):
        self.names = list(params.keys())
        self.params = list(params.values())
        for name, p in zip(self.names, self.params):
            if p._data is None or any(s == 0 for s in p.shape):
                raise ValueError(f"parameter '{name}' is not initialised (shape {p.shape}): call "
                                 "net.initialize() and run one forward pass first")
        self.roles: list[ParamRole] = param_roles(params, decay_bn_bias=decay_bn_bias)
        self.store = SyncStore(kvstore, self.params, self.roles, compression=compression)
        self.pushed = self.store.pushed
        self.updater = LargeBatchSGD(
            schedule, momentum=momentum, nesterov=nesterov,
            momentum_correction=momentum_correction, wd=weight_decay,
            no_decay=[i for i in self.pushed if not self.roles[i].decay],
            lars=lars, lars_eta=lars_eta)
        # one optimizer state per (parameter, device): devices apply identical updates
        self.states = [[self.updater.create_state(i, w) for w in self.params[i].list_data()]
                       for i in range(len(self.params))]
        self.simulated_workers = int(simulate_workers)
        if self.simulated_workers > 1:
            if self.store.kv is not None:
                raise ValueError("simulate_workers needs a local store and a single device")
            for i in self.pushed:
                self.params[i].grad_req = "add"
        self.bn = BNStats(self.params, self.store.stats, self.store, bn_stats,
                          self.simulated_workers)
        # The update's arguments per device, gathered once: Gluon keeps these arrays for the
        # life of the parameters (loading weights copies into them), and grad_req is final here.
        self._update_args = [
            ([self.params[i].list_data()[d] for i in self.pushed],
             [self.params[i].list_grad()[d] for i in self.pushed],
             [self.states[i][d] for i in self.pushed])
            for d in range(len(self.params[0].list_ctx()) if self.params else 0)]

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

    def learning_rate(self, step: int) -> float:
        """η(step) of the schedule."""
        return self.updater.lr_at(step)

    def role_counts(self) -> dict[str, int]:
        return role_counts(self.roles)

    # -- the step -------------------------------------------------------------------------------
    def allreduce_grads(self) -> None:
        """Sums gradients over workers and devices (exposed for gradient statistics)."""
        self.store.allreduce_grads()

    def update(self, batch_size: int, step: int) -> None:
        """Applies update ``step`` to already-reduced gradients.

        Args:
            batch_size: images this worker processed in the step, over all its devices.
            step: updates applied so far.
        """
        rescale = 1.0 / (batch_size * self.num_workers)
        for weights, grads, states in self._update_args:
            self.updater.apply(step, self.pushed, weights, grads, states, rescale)

    def step(self, batch_size: int, step: int) -> None:
        """``allreduce_grads()`` then ``update(batch_size, step)``."""
        self.allreduce_grads()
        self.update(batch_size, step)

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
        return {f"momentum:{i}": self.states[i][0]
                for i in self.pushed if self.states[i][0] is not None}

    def save_states(self, fname: str) -> None:
        """Writes the momentum buffers as an MXNet NDArray file (no pickle)."""
        mx.nd.save(fname, self.state_arrays())

    def load_states(self, fname: str) -> None:
        """Loads what :meth:`save_states` wrote, checking keys and shapes first."""
        loaded = mx.nd.load(fname)
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
