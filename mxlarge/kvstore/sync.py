"""The sync layer: the one place that creates the KVStore and pushes or pulls anything.

Servers only aggregate (they sum the k pushes of a key; no optimizer is ever sent to
them), and every worker runs the same updater on the identical pulled sum, so the
replicas stay identical. Every collective is an exact *gather* (rank r writes its vector
into slot r of a zero buffer), summed locally in rank order, so it is the same on every
rank and under 2-bit compression.

MXNet 1.9.1's traps met here (docs/design/sync.md says why and how): unknown store names
(validated first), lazy init racing the first push (every key initialised and pulled
first), a CPU push keeping the pushed array (non-gradients pushed as copies),
compression on every push, a second dist store hanging, and queued pushes skipped at
exit (the worker session leaves together: :mod:`mxlarge.protocol.session`). Gradients
travel fused in buckets whose members are views of the bucket's buffer
(:mod:`mxlarge.kvstore.fusion`), one ``pushpull`` per key. What travels (float32, the
16-bit wire, 2-bit compression) is the job's :class:`~mxlarge.kvstore.wires.Wire`,
chosen once. The store tells its step observers (:mod:`mxlarge.observers`) of each
bucket's push and pull in a marked step, where the two go as separate calls.

Keys: parameter ``i`` uses int key ``i``; its float16 wire key (lone float32 gradients under the
16-bit wire) is ``WIRE_KEY + i``; BN-statistic reductions use ``STAT_KEY + i``; bucket ``b`` uses
``FUSE_KEY + b``; small collective vectors (checksums, scalar sums) use the keys from
``AUX_KEY`` on (MXNet refuses mixed int/str keys). All stay below 215,330 (see ``MAX_KEY``).
"""
from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import mxnet as mx
import numpy as np

from mxlarge import engine
from mxlarge.errors import InputError
from mxlarge.kvstore import FUSION_BYTES, spans_hosts
from mxlarge.kvstore.collectives import AUX_KEY, SCALARS, STAT_KEY, Collectives
from mxlarge.kvstore.fusion import FUSE_KEY, Bucket, Holders, fuse, holders, piece_floats, spread
from mxlarge.kvstore.order import Order, gate, lead_groups
from mxlarge.kvstore.pieces import PieceLinks
from mxlarge.kvstore.roles import ParamRole
from mxlarge.kvstore.views import BucketViews
from mxlarge.kvstore.wires import WIRE_KEY, Wire, wire_for
from mxlarge.observers import Observers, Step
from mxlarge.protocol.session import SESSION

KVSTORE_TYPES = ("local", "device", "dist_sync", "dist_device_sync", "dist")
#: MXNet runs ``'dist'`` as ``'dist_sync'`` (no ``_async`` suffix: synchronous).
SAME_STORE = {"dist": "dist_sync"}
# MXNet 1.9.1 places a small array on server (key * 9973) % num_servers computed in a C
# int: keys from 215,330 on overflow it; odd ones fail `ps_key < krs[server].end()` with
# 2 servers.
MAX_PARAMS = 50_000
MAX_KEY = 2**31 // 9973 - 1
BIGARRAY_BOUND = 1_000_000  # MXNet's default MXNET_KVSTORE_BIGARRAY_BOUND (kvstore_dist.h)


def validate_kvstore(kind: str) -> str:
    if kind not in KVSTORE_TYPES:
        raise ValueError(f"kvstore {kind!r} is not supported: expected one of "
                         f"{', '.join(KVSTORE_TYPES)} (MXNet would silently fall back to a "
                         "local store for anything else)")
    return kind


def live_dist_store() -> mx.kv.KVStore | None:
    """The dist store this process already has, if any: the worker session's, else one a
    script made with ``mx.kv.create`` (MXNet keeps no registry of its stores, so the
    garbage collector's objects are searched: a few ms)."""
    live = SESSION.dist_store()
    if live is not None:
        return live
    for obj in gc.get_objects():
        if type(obj) is mx.kv.KVStore and obj.type.startswith("dist"):
            return obj
    return None


#: How ``mxlarge train`` runs a dist store: the fix :func:`require_launched` names by
#: default.
LAUNCH_FIX = ("run it with `mxlarge launch CONFIG -n K` or `python -m mxlarge.launcher -n K -s S "
              "-- CMD`, or use a local store (dist.kvstore=local)")


def require_launched(kind: str, fix: str = LAUNCH_FIX) -> None:
    """Refuses a dist store outside a launched job (MXNet would abort with a long C++
    traceback when it finds no scheduler to talk to), naming ``fix``.

    Raises:
        InputError: ``kind`` is a dist store and this process is no launched worker.
    """
    if kind.startswith("dist") and os.environ.get("DMLC_ROLE") != "worker":
        raise InputError(f"kvstore {kind!r} needs a launched job (scheduler, servers and "
                         f"workers): {fix}")


def create(kind: str) -> mx.kv.KVStore:
    """``mx.kv.create`` after validating the type; a dist store the process already has
    (a script's own ``mx.kv.create('dist_sync')``) is returned instead: MXNet 1.9.1
    hangs in a second store's start-up barrier. A dist store leaves with the worker
    session (:meth:`~mxlarge.protocol.session.WorkerSession.leave_together`).

    Raises:
        InputError: a dist store outside a launched job (:func:`require_launched`), a dist
            store of another type than the process's, or MXNet's P3 store with several
            servers (it hangs).
    """
    kind = validate_kvstore(kind)
    if not kind.startswith("dist"):
        return mx.kv.create(kind)
    require_launched(kind)
    if os.environ.get("DMLC_PS_VAN_TYPE") == "p3" and os.environ.get("DMLC_NUM_SERVER") != "1":
        raise InputError("DMLC_PS_VAN_TYPE=p3 with several servers: MXNet 1.9.1's P3 store hangs "
                         "in kv.init on a net's keys (docs/mxnet-facts.md); unset it")
    live = live_dist_store()
    if live is None:
        live = mx.kv.create(kind)
    if SAME_STORE.get(live.type, live.type) != SAME_STORE.get(kind, kind):
        raise InputError(f"kvstore {kind!r}: this process already has a {live.type!r} store "
                         "and MXNet hangs creating a second one; pass that store "
                         f"(kvstore=kv) or create it as {kind!r}")
    SESSION.leave_together(live, mx.nd.waitall)  # queued pushes run before MXNet's exit
    return live


@dataclass(frozen=True)
class ExchangePlan:
    """What :meth:`SyncStore.plan` decided: the positions of the parameters whose
    gradients are summed (``pushed``) and of the local statistics (``stats``, BN running
    mean/var)."""

    pushed: tuple[int, ...]
    stats: tuple[int, ...]


class SyncStore:
    """Push/pull of gradients over one KVStore; its :attr:`collectives` (a
    :class:`~mxlarge.kvstore.collectives.Collectives`) for everything else.

    Built in two stages, so that parameters initialised at the first forward (Gluon's
    deferred initialisation) work: the constructor opens the store (rank and world size
    are known from then on); :meth:`init_params` gives parameters rank 0's values as
    they get their shapes; :meth:`plan` (given the roles, once every shape is known)
    plans the exchange and initialises the remaining keys. With ``roles`` the
    constructor does all three at once. Then one :meth:`allreduce_grads` per step.

    Args:
        kvstore: ``local``, ``device``, ``dist_sync`` or ``dist_device_sync``, or a store made
            by :func:`create` (to learn the world size before building the schedule).
        params: every parameter of the net, in the order of ``roles``.
        roles: their roles (pushed / local statistic), or None to call :meth:`ready` later.
        compression: MXNet gradient-compression dict, e.g. ``{'type': '2bit', 'threshold': 0.5}``.
        fusion_bytes: bucket size of gradient fusion (module docstring); 0: one key per tensor.
        wire_dtype: ``float32``, or ``float16`` for the 16-bit wire (module docstring).
        on_grads: called whenever the store makes other arrays the members' gradient arrays
            (:class:`~mxlarge.kvstore.views.BucketViews`): whoever holds gradient arrays gathers
            them again.
        observers: told of each bucket's push and pull in a marked step
            (:mod:`mxlarge.observers`).
    """

    def __init__(self, kvstore: str | mx.kv.KVStore, params: Sequence[mx.gluon.Parameter],
                 roles: Sequence[ParamRole] | None = None, compression: dict | None = None,
                 fusion_bytes: int = FUSION_BYTES, wire_dtype: str = "float32",
                 on_grads: Callable[[], None] | None = None,
                 observers: Observers | None = None):
        kind = kvstore if isinstance(kvstore, str) else kvstore.type
        self.kind = validate_kvstore(kind)
        self.params = list(params)
        if fusion_bytes < 0:
            raise ValueError(f"fusion_bytes {fusion_bytes}: expected ≥ 0 (0: one key per tensor)")
        self.fusion_bytes = fusion_bytes
        self.roles: list[ParamRole] = []
        self.pushed: list[int] = []
        self.stats: list[int] = []
        self.buckets: list[Bucket] = []
        self._holders: Holders | None = None  # planned once (holders())
        self.views = BucketViews(self.params, on_grads)
        self._broadcast: set[int] = set()  # parameters whose keys hold rank 0's values
        num_devices = len(self.params[0].list_ctx()) if self.params else 1
        # an mx.kv.KVStore (untyped: Any), None for one device in one process; typed Any so
        # the exchange needs no None check of its own: allreduce_grads returns first without one
        self.kv: Any = None if isinstance(kvstore, str) else kvstore
        if self.kv is None and (kind.startswith("dist") or num_devices > 1):
            self.kv = create(kind)
        elif self.kv is not None and kind.startswith("dist"):
            # a script's own store (kvstore=kv) has queued pushes at exit like
            # create()'s
            SESSION.leave_together(self.kv, mx.nd.waitall)
        if len(self.params) > MAX_PARAMS:
            raise ValueError(f"{len(self.params)} parameters: at most {MAX_PARAMS} supported")
        self.wire: Wire = wire_for(self.distributed, wire_dtype, compression)
        if compression:
            self.kv.set_gradient_compression(compression)
        self.observers = observers if observers is not None else Observers()
        self._pieces = PieceLinks()
        self._order = Order(self.distributed and spans_hosts()
                            and os.environ.get("MXLARGE_SERVER_HOSTS") != "1")
        sixteen = any(np.dtype(p.dtype) != np.float32 for p in self.params)
        if self.distributed and self.rank == 0 and (self.wire.half or sixteen):
            # kSetMultiPrecision: the servers sum 16-bit pushes in float32 (module docstring)
            self.kv._send_command_to_servers(1, "")
        self.collectives = Collectives(self.kv, self.distributed, self.gather,
                                       self.wire.compressed)
        if roles is not None:
            self.plan(roles)

    @property
    def rank(self) -> int:
        return self.kv.rank if self.kv is not None else 0

    @property
    def lead(self) -> float | None:
        """The share of the pushed bytes sent in backward order
        (:mod:`mxlarge.kvstore.order`): None until measured, or on one host (all of
        them)."""
        return self._order.share

    @property
    def distributed(self) -> bool:
        return self.kv is not None and self.kind.startswith("dist")

    def init_params(self, indices: Sequence[int]) -> None:
        """Rank 0's values of parameters ``indices`` (initialised) on every worker and
        device.

        Collective: every rank calls it with the same indices in the same order (a key's
        ``kv.init`` is a barrier, and the value the store keeps is rank 0's). The values are
        pulled *and waited for* here, so no gradient of these keys can be pushed before.
        """
        todo = [i for i in indices if i not in self._broadcast]
        self._init(todo, [], [])

    def plan(self, roles: Sequence[ParamRole], in_forward: bool = False) -> ExchangePlan:
        """Every shape is known: plans the exchange (buckets, pieces, the members'
        gradient arrays) and initialises every key not yet initialised (parameters not
        broadcast yet, buckets, gather keys) in one collective.

        ``in_forward``: called from inside a forward pass (the deferred initialisation of its
        last parameter; Gluon pauses recording there, so it cannot be seen): the buckets'
        views become gradients in the first step instead (:mod:`mxlarge.kvstore.views`)."""
        self.roles = list(roles)
        self._holders = None
        self.pushed = [i for i, r in enumerate(roles) if r.pushed]
        self.stats = [i for i, r in enumerate(roles) if r.local_stat]
        # A bucket has one dtype; float16 and float32 tensors fill buckets of their own.
        kinds = [np.dtype(p.dtype).name for p in self.params]
        servers = int(os.environ.get("DMLC_NUM_SERVER", "1")) if self.distributed else 1
        self.buckets = fuse([int(np.prod(p.shape)) for p in self.params],
                            list(reversed(self.pushed)), self.fusion_bytes // 4,
                            alone=frozenset(i for i in self.pushed
                                            if kinds[i] not in ("float32", "float16")),
                            kinds=kinds, piece=piece_floats(servers, self.fusion_bytes // 4,
                                                            spans_hosts()))
        if self.kv is None:
            return ExchangePlan(tuple(self.pushed), tuple(self.stats))
        if self.distributed:  # every server the same share of the buckets (fusion.spread)
            wire = self.wire

            def key_of(b: Bucket) -> int:
                if b.alone and wire.carries(b, kinds[b.key]):
                    return WIRE_KEY + b.key
                return b.key
            bound = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", BIGARRAY_BOUND))
            self.buckets = spread(self.buckets, servers, bound, AUX_KEY - FUSE_KEY, key_of)
        keys: list[int] = []
        values: list[mx.nd.NDArray] = []
        contexts = self.params[0].list_ctx() if self.params else []
        for b in self.buckets:
            dtype = kinds[b.members[0]]
            shape = tuple(self.params[b.key].shape) if b.alone else (b.size,)
            self.wire.prepare(b, shape, dtype, contexts)
            if b.fused:  # adopted now, or in the first step when planned inside a forward
                self.views.add(b, contexts, dtype, adopt=not in_forward)
            if not b.alone or self.wire.carries(b, dtype):
                keys.append(self.wire.key(b))
                values.append(self.wire.init_value(b, shape, dtype))
        if self.distributed:  # gather keys (module docstring); one process needs none
            width = self.collectives.gather_width
            for i in self.stats:
                keys.append(STAT_KEY + i)
                values.append(mx.nd.zeros((width(self.params[i].shape),)))
            keys += [AUX_KEY, AUX_KEY + 1]
            values += [mx.nd.zeros((width((max(len(self.pushed), 1),)),)),
                       mx.nd.zeros((width((SCALARS,)),))]
        self._init([i for i in range(len(self.params)) if i not in self._broadcast], keys,
                   values)
        if self.distributed:
            self.kv._barrier()
        return ExchangePlan(tuple(self.pushed), tuple(self.stats))

    def holders(self) -> Holders | None:
        """Which server sums which pushed gradients (:func:`~mxlarge.kvstore.fusion.holders`),
        as positions in :attr:`pushed`; None before :meth:`plan` or without servers."""
        if not self.distributed or not self.buckets:
            return None
        if self._holders is None:
            servers = int(os.environ.get("DMLC_NUM_SERVER", "1"))
            bound = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", BIGARRAY_BOUND))
            found = holders(self.buckets, servers, bound, self.wire.key,
                            lambda b: b.size * self._itemsize(b))
            at = {p: k for k, p in enumerate(self.pushed)}
            self._holders = Holders(tuple(tuple(at[m] for m in ms) for ms in found.alone),
                                    found.share)
        return self._holders

    def _init(self, indices: list[int], keys: list[int], values: list[mx.nd.NDArray]) -> None:
        """One ``kv.init`` of parameters ``indices`` (this rank's values; the store
        keeps rank 0's) and of ``keys``/``values``; then rank 0's values of the
        trainable ones pulled into every device and waited for (what keeps the first
        gradient push from racing the broadcast); local statistics (``grad_req='null'``)
        keep this worker's values."""
        self._broadcast.update(indices)
        if self.kv is None or not (indices or keys):
            return
        # A copy is in MXNet's default layout: after an inference forward pass on CPU a
        # weight may be in MKLDNN's, which the store cannot read ("!IsMKLDNNData()").
        self.kv.init(list(indices) + keys,
                     [self.params[i].list_data()[0].copy() for i in indices] + values)
        # Pulled into fresh default-layout arrays, then copied in (the store cannot
        # write into an MKLDNN-layout weight either).
        for i in indices:
            p = self.params[i]
            if p.grad_req == "null":
                # a local statistic (BN running mean/var) is each worker's own: what a
                # resumed worker loaded before the Trainer was built stays (a fresh one
                # is the same constant on every rank anyway)
                continue
            pulled = [mx.nd.zeros(p.shape, ctx=a.context, dtype=a.dtype) for a in p.list_data()]
            self.kv.pull(i, out=pulled, priority=-i)
            for src, dst in zip(pulled, p.list_data()):
                src.copyto(dst)
        mx.nd.waitall()

    # -- gradients ---------------------------------------------------------------------
    def allreduce_grads(self, prescale: float = 1.0, step: Step | None = None) -> None:
        """Replaces every pushed gradient by its sum over workers and devices;
        ``prescale``: s of the 16-bit wire (:mod:`mxlarge.kvstore.wires`), ignored by
        the others; ``step``: the step in progress, whose observers hear of each bucket
        when it is marked. Buckets (:func:`fuse`) go in backward order with priority
        −(their first parameter), so MXNet's engine starts each bucket's push once its
        last gradient is ready, overlapping the rest of backward; a tensor's pieces go
        together (:mod:`mxlarge.kvstore.pieces`). On several hosts only the lead goes
        so; the rest follows backward in forward order (:mod:`mxlarge.kvstore.order`).
        """
        if self.kv is None:
            return
        s = self.wire.prescale(prescale)
        groups = [list(g) for _, g in groupby(self.buckets, key=lambda b: b.members)]
        if not groups:
            return
        order = self._order
        last = self.params[min(self.pushed)].list_grad()
        after = order.measure(self._grads(groups[0][0])[0], last[0],
                              lambda: [self._grads(g[0])[0] for g in groups]
                              ) if order.probing() else None
        order.agree(self.collectives.median_scalar)
        lead = len(groups) if order.share is None or order.share >= 1 else lead_groups(
            [sum(b.size * self._itemsize(b) for b in g) for g in groups], order.share)
        gates = None
        if lead < len(groups):
            # the gate: a probe of the last-written gradient, taken before any exchange
            # writes it (gating on the gradient itself would wait for its own sum)
            gates = [engine.probe(g) for g in last]
        for group in groups[:lead]:
            self._group(group, s, step)
        for group in reversed(groups[lead:]):
            self._group(group, s, step, gates)
        if after is not None:
            after()

    def _grads(self, b: Bucket) -> list[mx.nd.NDArray]:
        """The gradient arrays per device that hold bucket ``b``'s first member."""
        return self.params[b.members[0]].list_grad()

    def _itemsize(self, b: Bucket) -> int:
        return self.wire.itemsize(b, np.dtype(self.params[b.members[0]].dtype).name)

    def _group(self, group: list[Bucket], s: float, step: Step | None,
               gates: list[mx.nd.NDArray] | None = None) -> None:
        """Exchanges one bucket, or one tensor's pieces, each array first gated on
        ``gates`` (:func:`mxlarge.kvstore.order.gate`) if given."""
        b, *rest = group
        priority = -min(b.members)

        def exchange(bucket: Bucket, arrays: list[mx.nd.NDArray], prio: int) -> None:
            if gates is not None:
                gate(arrays, gates)
            self._exchange(bucket, arrays, prio, s, step)
        if rest:  # the pieces of one tensor, consecutive in the plan (fusion.fuse)
            self._pieces.exchange(group, self._grads(b),
                                  lambda p, a: exchange(p, a, -p.members[0]))
            return
        if not b.fused:  # a whole tensor
            exchange(b, self.params[b.key].list_grad(), priority)
            return
        self.views.exchange(b, lambda flats: exchange(b, flats, priority))

    def _exchange(self, b: Bucket, arrays: list[mx.nd.NDArray], priority: int,
                  prescale: float, step: Step | None) -> None:
        """Sum of ``arrays`` over devices and workers, written back into them, through
        the wire's arrays: one pushpull, or a push and a pull where the wire splits them
        or the step is marked (then the observers hear of each)."""
        sent = self.wire.outbound(b, arrays, prescale)
        key = self.wire.key(b)
        if step is not None and step.marked and self.distributed:
            nbytes = sent[0].size * np.dtype(sent[0].dtype).itemsize
            self.observers.bucket_push(step, key, nbytes, sent)
            self.kv.push(key, sent, priority=priority)
            self.observers.bucket_pushed(step, key, sent)
            self.kv.pull(key, out=sent, priority=priority)
            self.observers.bucket_pulled(step, key, sent)
        elif self.distributed and not self.wire.split:
            self.kv.pushpull(key, sent, out=sent, priority=priority)
        else:
            self.kv.push(key, sent, priority=priority)
            self.kv.pull(key, out=sent, priority=priority)
        self.wire.inbound(b, arrays, sent, prescale)

    def gather(self, key: int, mine: np.ndarray) -> np.ndarray:
        """Every rank's float32 vector ``mine`` as rows of a (k, n) array, exactly
        (collective).

        Slot r of the pushed buffer holds rank r's vector (raw, or under compression its
        bits as 0/t), every other slot zeros, so the pulled sum holds each rank's vector
        unchanged.
        """
        mine = np.ascontiguousarray(mine, np.float32).ravel()
        k = self.kv.num_workers
        n = mine.size
        slot = self.wire.gather_slot(mine)
        buf = np.zeros((k, slot.size), np.float32)
        buf[self.rank] = slot
        out = mx.nd.zeros((buf.size,))
        self.kv.push(key, mx.nd.array(buf.ravel()))
        self.kv.pull(key, out=out)
        rows = out.asnumpy().reshape(k, slot.size)
        return self.wire.gather_rows(rows, n)
