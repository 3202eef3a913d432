"""BatchNorm running statistics: the one owner, for workers, devices and simulated workers.

Goyal et al. compute BN statistics per worker over its own n images and never exchange them.
In mxlarge every *unit* (a gradient contributor: a device of a worker, or a simulated worker)
keeps its own running mean/var (``grad_req == 'null'``; never pushed or pulled). Units are
numbered as their one-device real counterparts would be ranked: device d of rank r is unit
r·devices + d; simulated worker j of rank r is unit r·simulated + j (the same numbers in every
world of the same units: a checkpoint's ``bn-<u>.nd`` resumes in any of them).

Evaluation, final parameters and the checkpoint's ``model.params`` need *one* set of statistics,
chosen by ``dist.bn_stats``:

* ``local``: this rank's own (device 0, or simulated worker 0);
* ``broadcast``: rank 0's (device 0, or simulated worker 0);
* ``reduce``: the mean over every unit: Σ_u stats_u / units (what a single model would be
  evaluated with).

Simulated workers swap their statistics in and out of the net (:meth:`BNStats.worker`). A
hybridized net's backward writes the running statistics without the engine ordering that write
before a following copy (on MXNet 1.9.1 the copy saw the old values), so every swap or copy
waits for pending work first.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mxnet as mx

MODES = ("local", "broadcast", "reduce")


class BNStats:
    """Owns the statistics of ``params[i]`` for ``i`` in ``indices``.

    Args:
        params: every parameter of the net, in the trainer's order.
        indices: positions of the BN running statistics among them.
        store: the store's :class:`~mxlarge.kvstore.collectives.Collectives` (rank, sums).
        mode: ``local``, ``broadcast`` or ``reduce`` (module docstring).
        simulated: simulated workers in this process (one device), each with its own copy.
    """

    def __init__(self, params: Sequence[Any], indices: Sequence[int], store: Any,
                 mode: str = "reduce", simulated: int = 1):
        if mode not in MODES:
            raise ValueError(f"bn_stats {mode!r}: expected local, broadcast or reduce")
        self.params = list(params)
        self.indices = list(indices)
        self.store = store
        self.mode = mode
        self.simulated = int(simulated)
        self.devices = len(self.params[0].list_ctx()) if self.params else 1
        self.banks: list[dict[int, mx.nd.NDArray]] = []
        if self.simulated > 1:
            self.banks = [{i: self.params[i].data().copy() for i in self.indices}
                          for _ in range(self.simulated)]

    # -- units ----------------------------------------------------------------------------------
    @contextmanager
    def worker(self, j: int) -> Iterator[None]:
        """Runs the body under simulated worker ``j``'s statistics, keeping its updates."""
        bank = self.banks[j]
        for i, value in bank.items():
            value.copyto(self.params[i].data())
        try:
            yield
        finally:
            mx.nd.waitall()  # the running-statistic write is not engine-ordered (docstring)
            for i, value in bank.items():
                self.params[i].data().copyto(value)

    def unit_ids(self) -> list[int]:
        """The units this process holds (module docstring), without swapping statistics."""
        if self.banks:
            return [self.store.rank * self.simulated + j for j in range(self.simulated)]
        return [self.store.rank * self.devices + d for d in range(self.devices)]

    def each_unit(self) -> Iterator[tuple[int, int]]:
        """Yields ``(unit, device)`` with that unit's own statistics in place on ``device``."""
        if self.banks:
            for j, unit in enumerate(self.unit_ids()):
                with self.worker(j):
                    yield unit, 0
        else:
            for d, unit in enumerate(self.unit_ids()):
                yield unit, d

    # -- the one set for evaluation and checkpoints ---------------------------------------------
    def shared(self) -> dict[int, mx.nd.NDArray]:
        """The statistics chosen by ``mode`` (collective on a dist store: every rank calls it)."""
        mx.nd.waitall()  # pending running-statistic writes (docstring)
        if self.banks:  # this process's first simulated worker stands for its device
            if self.mode == "reduce":
                units = self.store.num_workers * self.simulated
                return {i: self.store.sum_stat(i, [bank[i] for bank in self.banks]) / units
                        for i in self.indices}
            if self.mode == "broadcast":
                return {i: self.store.rank0_stat(i, self.banks[0][i]) for i in self.indices}
            return {i: self.banks[0][i].copy() for i in self.indices}
        out: dict[int, mx.nd.NDArray] = {}
        for i in self.indices:
            arrays = self.params[i].list_data()
            if self.mode == "local" or not self.store.aggregates:
                out[i] = arrays[0].copy()
            elif self.mode == "reduce":
                out[i] = self.store.sum_stat(i, arrays) / (self.store.num_workers * self.devices)
            else:
                out[i] = self.store.rank0_stat(i, arrays[0])
        return out

    @contextmanager
    def evaluation(self) -> Iterator[None]:
        """Temporarily puts :meth:`shared` in place on every device (collective on dist).

        Training continues with each unit's own statistics afterwards, as Goyal et al. do.
        """
        mx.nd.waitall()
        if not self.indices or (self.mode == "local" and not self.banks):
            yield
            return
        shared = self.shared()
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


def save_device_params(net: mx.gluon.Block, path: str, device: int,
                       stats_only: bool = False) -> None:
    """Like ``save_parameters``, but one device's copies (Gluon's own save averages devices).

    ``stats_only`` keeps just the running statistics (``grad_req == 'null'``).
    """
    mx.nd.waitall()
    arrays = {name: p.list_data()[device]
              for name, p in net._collect_params_with_prefix().items()
              if not stats_only or p.grad_req == "null"}
    mx.nd.save(path, arrays)


def load_device_stats(net: mx.gluon.Block, path: str, device: int) -> None:
    """Loads what ``save_device_params(..., stats_only=True)`` wrote into ``device``'s copies."""
    params = net._collect_params_with_prefix()
    for name, value in mx.nd.load(path).items():
        value.copyto(params[name].list_data()[device])
