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

A dist Trainer installs :func:`mxlarge.launcher.worker.install_fail_fast`: an uncaught exception
prints its traceback and ends the process at once (status 1), instead of deadlocking in ps-lite's
exit barrier; a normal exit still goes through the barrier, where rank 0 stops the servers.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import mxnet as mx

from mxlarge.kvstore.roles import ParamRole, param_roles, role_counts
from mxlarge.kvstore.sync import SyncStore
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.launcher.heartbeat import Beat
from mxlarge.launcher.worker import install_fail_fast


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
        bn_stats: BN statistics for evaluation/checkpoints: ``local``, ``broadcast``, ``reduce``.
        simulate_workers: K > 1 reproduces K dist_sync workers in this process: the loop runs
            K micro-batches of n, each under its own copy of the BN running statistics
            (:meth:`worker_stats`), gradients accumulate (``grad_req='add'``), and one update
            with rescale 1/(K·n) follows. Needs a local store and one device.
    """

    def __init__(self, params: Mapping[str, mx.gluon.Parameter], schedule: Any, *,
                 momentum: float = 0.9, nesterov: bool = False, momentum_correction: bool = True,
                 weight_decay: float = 1e-4, decay_bn_bias: bool = False, lars: bool = False,
                 lars_eta: float = 0.001, kvstore: str | mx.kv.KVStore = "local",
                 compression: dict | None = None,
                 bn_stats: str = "reduce", simulate_workers: int = 1):
        if bn_stats not in ("local", "broadcast", "reduce"):
            raise ValueError(f"bn_stats {bn_stats!r}: expected local, broadcast or reduce")
        self.names = list(params.keys())
        self.params = list(params.values())
        for name, p in zip(self.names, self.params):
            if p._data is None or any(s == 0 for s in p.shape):
                raise ValueError(f"parameter '{name}' is not initialised (shape {p.shape}): call "
                                 "net.initialize() and run one forward pass first")
        self.roles: list[ParamRole] = param_roles(params, decay_bn_bias=decay_bn_bias)
        self.bn_stats = bn_stats
        self.store = SyncStore(kvstore, self.params, self.roles, compression=compression)
        if self.store.distributed:
            # A dist worker that raises would wait forever in ps-lite's exit barrier for peers
            # that wait in push/pull for it: every script using this Trainer leaves at once.
            install_fail_fast()
        # Progress for the launcher's stall watchdog (None outside a launched job).
        self.heartbeat = Beat.from_env(self.store.rank) if self.store.distributed else None
        self._last_update: mx.nd.NDArray | None = None
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
        self.virtual_stats: list[dict[int, mx.nd.NDArray]] = []
        if self.simulated_workers > 1:
            if self.store.kv is not None:
                raise ValueError("simulate_workers needs a local store and a single device")
            for i in self.pushed:
                self.params[i].grad_req = "add"
            self.virtual_stats = [{i: self.params[i].data().copy() for i in self.store.stats}
                                  for _ in range(self.simulated_workers)]
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

    @property
    def world_size(self) -> int:
        """Gradient contributors per step: workers × devices × simulated workers."""
        return self.num_workers * self.num_devices * self.simulated_workers

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
        beat = self.heartbeat
        if beat is not None:
            beat.step(beat.done, step)  # this worker's gradients of `step` are pushed
            # Python must not run ahead of a stuck job: wait for update step-1 (update `step`'s
            # forward/backward are queued already, so the engine never idles here).
            if self._last_update is not None:
                self._last_update.wait_to_read()
            beat.step(step, step)
        rescale = 1.0 / (batch_size * self.num_workers)
        for weights, grads, states in self._update_args:
            self.updater.apply(step, self.pushed, weights, grads, states, rescale)
        if beat is not None and self._update_args:
            self._last_update = self._update_args[0][0][0]

    def step(self, batch_size: int, step: int) -> None:
        """``allreduce_grads()`` then ``update(batch_size, step)``."""
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

    @contextmanager
    def worker_stats(self, j: int) -> Iterator[None]:
        """Runs the body under virtual worker ``j``'s BN running statistics, keeping updates."""
        bank = self.virtual_stats[j]
        for i, value in bank.items():
            value.copyto(self.params[i].data())
        try:
            yield
        finally:
            # A hybridized net's backward updates the running statistics without the engine
            # ordering that write before a following copy (measured: the copy saw the old
            # values), so wait for all pending work first.
            mx.nd.waitall()
            for i, value in bank.items():
                self.params[i].data().copyto(value)

    def each_unit(self) -> Iterator[tuple[int, int]]:
        """Every gradient contributor this process holds, with its own BN statistics in place.

        Yields ``(unit, device)``: a virtual worker j is unit j on device 0 (inside
        :meth:`worker_stats`), device d of rank r is unit r·devices + d: the number the
        contributor's one-device real counterpart would have as its rank.
        """
        if self.virtual_stats:
            for j in range(self.simulated_workers):
                with self.worker_stats(j):
                    yield j, 0
        else:
            for d in range(self.num_devices):
                yield self.rank * self.num_devices + d, d

    def unit_ids(self) -> list[int]:
        """The unit numbers of :meth:`each_unit`, without swapping statistics."""
        if self.virtual_stats:
            return list(range(self.simulated_workers))
        return [self.rank * self.num_devices + d for d in range(self.num_devices)]

    # -- BN statistics --------------------------------------------------------------------------
    def shared_stats(self) -> dict[int, mx.nd.NDArray]:
        """Statistics for evaluation/checkpoints per ``bn_stats`` (collective on dist)."""
        if not self.virtual_stats:
            return self.store.shared_stats(self.bn_stats)
        if self.bn_stats == "reduce":
            return {i: mx.nd.add_n(*[bank[i] for bank in self.virtual_stats])
                    / self.simulated_workers for i in self.store.stats}
        # local and broadcast: virtual worker 0's own, as rank 0 would have
        return {i: self.virtual_stats[0][i].copy() for i in self.store.stats}

    @contextmanager
    def evaluation_stats(self) -> Iterator[None]:
        """Temporarily swaps in the ``bn_stats`` statistics (collective on every rank).

        Training continues with each worker's own statistics afterwards, as Goyal et al. do.
        """
        mx.nd.waitall()  # pending running-statistic writes are not engine-ordered (see above)
        if (self.bn_stats == "local" and not self.virtual_stats) or not self.store.stats:
            yield
            return
        shared = self.shared_stats()
        saved = {i: [a.copy() for a in self.params[i].list_data()] for i in shared}
        for i, value in shared.items():
            for a in self.params[i].list_data():
                value.copyto(a)
        try:
            yield
        finally:
            for i, copies in saved.items():
                for a, c in zip(self.params[i].list_data(), copies):
                    c.copyto(a)

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
