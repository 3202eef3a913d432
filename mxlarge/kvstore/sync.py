"""The sync layer: the one place that creates the KVStore and pushes or pulls anything.

Servers only aggregate (they sum the k pushes of a key; no optimizer is ever sent to them), and
every worker runs the same updater on the identical pulled sum, so the replicas stay identical.
This sidesteps what breaks when MXNet runs the optimizer on the servers (lost ``wd_mult``, LR
changes that never arrive, silent unpickling failures; see README's "MXNet 1.9.1 facts").

Two MXNet 1.9.1 traps handled here:

* MXNet silently gives a *local* store (rank 0 of 1) for an unknown type name such as
  ``horovod`` or a typo, so the type is validated before ``mx.kv.create``.
* Gluon initialises the store lazily inside the first ``step()``; the initial weight pull and
  the first gradient push of a key then race, and a weight can come back as a gradient sum.
  Here every key is initialised, and the initial weights pulled *and waited for*, in the
  constructor, before any gradient can exist.

A third: on CPU a dist push of one array keeps *that array* as the key's receive buffer
("avoid memory copy" in kvstore_dist.h), so the next pull of the key overwrites the pushed
array with the sum as well as ``out``. Harmless for gradients (they are replaced by the sum
anyway); anything else is pushed as a copy.

Keys: parameter ``i`` uses int key ``i``; BN-statistic reductions use ``STAT_KEY + i``; small
collective vectors (checksums, scalar sums) use the keys from ``AUX_KEY`` on (MXNet refuses
mixed int/str keys). All stay below 215,331 (see ``MAX_KEY``).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import mxnet as mx
import numpy as np

from mxlarge.errors import InputError, ReplicaMismatch
from mxlarge.kvstore.roles import ParamRole

KVSTORE_TYPES = ("local", "device", "dist_sync", "dist_device_sync")
# MXNet 1.9.1 places a small array on server (key * 9973) % num_servers computed in a C int:
# keys above 215,330 overflow it and fail `ps_key < krs[server].end()` with 2+ servers.
STAT_KEY = 100_000
AUX_KEY = 200_000
MAX_KEY = 2**31 // 9973 - 1
SCALARS = 8  # length of the scalar-sum vector


def validate_kvstore(kind: str) -> str:
    if kind not in KVSTORE_TYPES:
        raise ValueError(f"kvstore {kind!r} is not supported: expected one of "
                         f"{', '.join(KVSTORE_TYPES)} (MXNet would silently fall back to a "
                         "local store for anything else)")
    return kind


def create(kind: str) -> mx.kv.KVStore:
    """``mx.kv.create`` after validating the type (the rank and world size come from it).

    Raises:
        InputError: a dist store outside a launched job (MXNet would abort with a long C++
            traceback when it finds no scheduler to talk to).
    """
    kind = validate_kvstore(kind)
    if kind.startswith("dist") and os.environ.get("DMLC_ROLE") != "worker":
        raise InputError(f"kvstore {kind!r} needs a launched job (scheduler, servers and "
                         "workers): run it with `mxlarge launch CONFIG -n K` or "
                         "`python -m mxlarge.launcher -n K -s S -- CMD`, or use a local store "
                         "(dist.kvstore=local)")
    return mx.kv.create(kind)


class SyncStore:
    """Push/pull of gradients and collectives over one KVStore.

    Args:
        kvstore: ``local``, ``device``, ``dist_sync`` or ``dist_device_sync``, or a store made
            by :func:`create` (to learn the world size before building the schedule).
        params: every parameter of the net, in the order of ``roles``; initialised.
        roles: their roles (pushed / local statistic).
        compression: MXNet gradient-compression dict, e.g. ``{'type': '2bit', 'threshold': 0.5}``.
    """

    def __init__(self, kvstore: str | mx.kv.KVStore, params: Sequence[mx.gluon.Parameter],
                 roles: Sequence[ParamRole], compression: dict | None = None):
        kind = kvstore if isinstance(kvstore, str) else kvstore.type
        self.kind = validate_kvstore(kind)
        self.params = list(params)
        self.roles = list(roles)
        self.pushed = [i for i, r in enumerate(roles) if r.pushed]
        self.stats = [i for i, r in enumerate(roles) if r.local_stat]
        num_devices = len(self.params[0].list_ctx()) if self.params else 1
        # One process with one device has nothing to aggregate: skip the store entirely.
        self.kv = None if isinstance(kvstore, str) else kvstore
        if self.kv is None and (kind.startswith("dist") or num_devices > 1):
            self.kv = create(kind)
        if self.kv is not None:
            if compression:
                if not kind.startswith("dist"):
                    raise ValueError("gradient compression needs a dist kvstore")
                self.kv.set_gradient_compression(compression)
            self._init_keys()

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

    @property
    def distributed(self) -> bool:
        return self.kv is not None and self.kind.startswith("dist")

    def _init_keys(self) -> None:
        kv = self.kv
        if len(self.params) >= STAT_KEY:
            raise ValueError(f"{len(self.params)} parameters: at most {STAT_KEY - 1} supported")
        keys, values = [], []
        for i, p in enumerate(self.params):
            keys.append(i)
            values.append(p.list_data()[0])
        for i in self.stats:
            keys.append(STAT_KEY + i)
            values.append(self.params[i].list_data()[0])
        keys += [AUX_KEY, AUX_KEY + 1]
        values += [mx.nd.zeros((max(len(self.pushed), 1),)), mx.nd.zeros((SCALARS,))]
        kv.init(keys, values)
        # Rank 0's initial weights (and BN statistics) reach every worker and device; waiting
        # here is what keeps the first gradient push from racing the broadcast.
        for i, p in enumerate(self.params):
            kv.pull(i, out=p.list_data(), priority=-i)
        mx.nd.waitall()
        if self.distributed:
            self.kv._barrier()

    # -- gradients ------------------------------------------------------------------------------
    def allreduce_grads(self) -> None:
        """Replaces every pushed gradient by its sum over workers and devices.

        Pushes go in reverse parameter order with priority −i: the last layers' gradients exist
        first during backward, and MXNet's engine starts each push as soon as its gradient is
        ready, so communication overlaps the rest of backward.
        """
        if self.kv is None:
            return
        for i in reversed(self.pushed):
            grads = self.params[i].list_grad()
            self.kv.push(i, grads, priority=-i)
            self.kv.pull(i, out=grads, priority=-i)

    # -- collectives ----------------------------------------------------------------------------
    def sum_scalars(self, values: Sequence[float]) -> list[float]:
        """Σ over workers of a few floats (≤ 8), e.g. per-worker gradient norms."""
        if len(values) > SCALARS:
            raise ValueError(f"at most {SCALARS} scalars per call")
        if self.kv is None or not self.distributed:
            return [float(v) for v in values]
        buf = np.zeros(SCALARS, np.float32)
        buf[:len(values)] = values
        out = mx.nd.zeros((SCALARS,))
        self.kv.push(AUX_KEY + 1, mx.nd.array(buf))
        self.kv.pull(AUX_KEY + 1, out=out)
        return [float(x) for x in out.asnumpy()[:len(values)]]

    def check_replicas(self, step: int) -> None:
        """Compares per-tensor weight sums with rank 0's, bitwise.

        Rank 0 pushes its checksum vector and the others push zeros, so the pulled sum is rank 0's
        vector exactly (x + 0 = x in floating point), whatever the number of workers.

        Raises:
            ReplicaMismatch: naming the step and the first differing parameter.
        """
        if not self.distributed or not self.pushed:
            return
        mine = mx.nd.concat(*[self.params[i].list_data()[0].sum().reshape((1,))
                              for i in self.pushed], dim=0)
        contrib = mine.copy() if self.rank == 0 else mx.nd.zeros_like(mine)
        ref = mx.nd.zeros_like(mine)
        self.kv.push(AUX_KEY, contrib)
        self.kv.pull(AUX_KEY, out=ref)
        a, b = mine.asnumpy(), ref.asnumpy()
        if not np.array_equal(a, b):
            j = int(np.flatnonzero(a != b)[0])
            name = self.roles[self.pushed[j]].name
            raise ReplicaMismatch(
                f"replica check failed at step {step}: rank {self.rank}'s '{name}' sums to "
                f"{a[j]!r}, rank 0's to {b[j]!r}; the workers' weights have diverged")

    def sum_stat(self, i: int, arrays: Sequence[mx.nd.NDArray]) -> mx.nd.NDArray:
        """Σ over workers and devices of statistic ``i``'s per-device ``arrays`` (collective)."""
        total = mx.nd.zeros_like(arrays[0])
        self.kv.push(STAT_KEY + i, [a.copy() for a in arrays], priority=-i)
        self.kv.pull(STAT_KEY + i, out=total, priority=-i)
        return total

    def rank0_stat(self, i: int, array: mx.nd.NDArray) -> mx.nd.NDArray:
        """Rank 0's ``array`` of statistic ``i`` on every rank (collective): rank 0 pushes it,
        the others push zeros, so the pulled sum is rank 0's exactly."""
        total = mx.nd.zeros_like(array)
        contrib = array.copy() if self.rank == 0 else mx.nd.zeros_like(array)
        # one array per call, so that local device summing cannot double it
        self.kv.push(STAT_KEY + i, contrib, priority=-i)
        self.kv.pull(STAT_KEY + i, out=total, priority=-i)
        return total

    def barrier(self) -> None:
        if self.distributed:
            self.kv._barrier()
