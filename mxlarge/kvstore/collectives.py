"""The store's collectives (a component of :class:`mxlarge.kvstore.sync.SyncStore`):
exact gathers of small float32 vectors, where slot r of the pushed buffer holds rank r's
vector and every other slot zeros, so the pulled sum holds each rank's vector unchanged,
the same on every rank and under 2-bit compression (each float then travels as its 32
bits, as 0 or t)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge.errors import ReplicaMismatch

STAT_KEY = 100_000
AUX_KEY = 200_000
SCALARS = 8  # length of the scalar-sum vector


class Collectives:
    """Exact collectives of small float32 vectors over ``kv`` (module docstring).

    Args:
        kv: the store, or None (one process: every collective is the identity).
        distributed: whether ``kv`` is a dist store (others sum devices only).
        gather: ``gather(key, mine)``, every rank's vector as rows of a (k, n) array, exactly
            (:meth:`mxlarge.kvstore.sync.SyncStore.gather`: the push and pull stay there).
        compressed: whether gathered floats travel as 32 values each (2-bit compression).
    """

    def __init__(self, kv: Any, distributed: bool,
                 gather: Callable[[int, np.ndarray], np.ndarray], compressed: bool) -> None:
        self.kv = kv
        self.distributed = distributed
        self.gather = gather
        self._compressed = compressed

    @property
    def rank(self) -> int:
        return self.kv.rank if self.kv is not None else 0

    @property
    def num_workers(self) -> int:
        return self.kv.num_workers if self.kv is not None else 1

    @property
    def aggregates(self) -> bool:
        """Whether a store sums anything (several devices, or a dist job)."""
        return self.kv is not None

    def gather_width(self, shape: Sequence[int]) -> int:
        """Pushed floats of one gather of an array of ``shape``: k · size (· 32 compressed)."""
        size = int(np.prod(shape))
        return self.num_workers * size * (32 if self._compressed else 1)

    def same_on_every_rank(self, values: Sequence[float]) -> bool:
        """Whether every rank's few floats (≤ 8, as float32) are bitwise rank 0's
        (collective: one exact gather)."""
        if len(values) > SCALARS:
            raise ValueError(f"at most {SCALARS} scalars per call")
        if not self.distributed:
            return True
        buf = np.zeros(SCALARS, np.float32)
        buf[:len(values)] = values
        rows = self.gather(AUX_KEY + 1, buf)
        return bool((rows.view(np.uint32) == rows[0].view(np.uint32)).all())

    def sum_scalars(self, values: Sequence[float]) -> list[float]:
        """Σ over workers of a few floats (≤ 8), e.g. per-worker gradient norms; summed
        in rank order in float64, exactly the same on every rank."""
        if len(values) > SCALARS:
            raise ValueError(f"at most {SCALARS} scalars per call")
        if not self.distributed:
            return [float(v) for v in values]
        buf = np.zeros(SCALARS, np.float32)
        buf[:len(values)] = values
        rows = self.gather(AUX_KEY + 1, buf).astype(np.float64)
        return [float(x) for x in rows.sum(axis=0)[:len(values)]]

    def each_rank(self, values: Sequence[float]) -> list[list[float]]:
        """Every worker's few floats (≤ 8, as float32), by rank, the same on every rank."""
        if len(values) > SCALARS:
            raise ValueError(f"at most {SCALARS} scalars per call")
        if not self.distributed:
            return [[float(np.float32(v)) for v in values]]
        buf = np.zeros(SCALARS, np.float32)
        buf[:len(values)] = values
        return [[float(x) for x in row[:len(values)]] for row in self.gather(AUX_KEY + 1, buf)]

    def median_scalar(self, value: float) -> float:
        """The median over workers of one float each (as float32), the same on every rank."""
        if not self.distributed:
            return float(np.float32(value))
        buf = np.zeros(SCALARS, np.float32)
        buf[0] = value
        return float(np.median(self.gather(AUX_KEY + 1, buf)[:, 0].astype(np.float64)))

    def check_replicas(self, step: int, weights: Sequence[mx.nd.NDArray],
                       names: Sequence[str]) -> None:
        """Compares each of ``weights``' sums with rank 0's, bitwise (rank 0's vector is
        row 0 of an exact gather).

        Raises:
            ReplicaMismatch: naming the step and the first differing parameter.
        """
        if not self.distributed or not weights:
            return
        mine = mx.nd.concat(*[w.sum().reshape((1,)) for w in weights], dim=0).asnumpy()
        ref = self.gather(AUX_KEY, mine)[0]
        if not np.array_equal(mine, ref):
            j = int(np.flatnonzero(mine != ref)[0])
            raise ReplicaMismatch(
                f"replica check failed at step {step}: rank {self.rank}'s '{names[j]}' sums to "
                f"{mine[j]!r}, rank 0's to {ref[j]!r}; the workers' weights have diverged")

    def sum_stat(self, i: int, arrays: Sequence[mx.nd.NDArray]) -> mx.nd.NDArray:
        """Σ over workers and devices of statistic ``i``'s per-device ``arrays``
        (collective): devices summed in this process, then ranks in rank order."""
        local = mx.nd.add_n(*[a.as_in_context(arrays[0].context) for a in arrays])
        if not self.distributed:
            return local
        rows = self.gather(STAT_KEY + i, local.asnumpy())
        total = rows[0].copy()
        for row in rows[1:]:
            total += row
        return mx.nd.array(total.reshape(arrays[0].shape), ctx=arrays[0].context)

    def rank0_stat(self, i: int, array: mx.nd.NDArray) -> mx.nd.NDArray:
        """Rank 0's ``array`` of statistic ``i`` on every rank (collective), exactly."""
        if not self.distributed:
            return array.copy()
        return mx.nd.array(self.gather(STAT_KEY + i, array.asnumpy())[0].reshape(array.shape),
                           ctx=array.context)

    def barrier(self) -> None:
        if self.distributed:
            self.kv._barrier()
