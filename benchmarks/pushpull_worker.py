"""Worker script of benchmark 3: push+pull bandwidth of a ResNet-50-sized parameter set.

Started as every role of a local dist_sync job (scheduler/server exit inside ``import mxnet``).
Each worker makes one Gluon parameter per tensor of the given shapes (ResNet-50 v1b's 161
trainable tensors, 25.6 M float32, in their real shapes) and, per iteration, sums their
gradients with mxlarge's own :meth:`mxlarge.kvstore.sync.SyncStore.allreduce_grads` (buckets of
each size in ``--fusion``, 0: one key per tensor; backward order, priorities), then waits for all
of it. Each bucket size is its own mode of the same rounds, on its own copy of the tensors under
its own range of keys of the one store, so that sizes are compared in the same processes.

With ``--even``, one more: the same floats as up to 64 equal keys sliced evenly over every server
(:func:`even_sizes`), the fastest bare layout of the peers benchmark's
exchange floor.

With ``--bare``, one more mode of the same rounds is MXNet's store with no mxlarge code at all:
the same tensors, one ``kv.pushpull`` per tensor (in place, backward order, priority −i, as
mxlarge issues them), then ``mx.nd.waitall()``; mxlarge's modes ÷ this one is the share of the
engine's own ceiling that mxlarge reaches.

Rank 0 alternates those push/pull rounds with rounds of a raw loopback TCP baseline in the same
process (:mod:`benchmarks.tcp_peer`: send the same number of bytes to an echo peer process and
receive them back), so each round yields one (ps-lite, raw) pair. Other workers wait in a
barrier during the raw rounds. Bandwidth = bytes moved ÷ time; a worker's push+pull of S bytes
moves 2·S. Every iteration is timed on its own (each ends with all its transfers complete), and
the per-iteration times of every round are reported.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import mxnet as mx
import numpy as np

from benchmarks.common import (
    KEY_STRIDE,
    OffsetKV,
    emit_progress,
    emit_result,
    interleave,
    worker_main,
)
from benchmarks.tcp_peer import recv_exact


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shapes", help="JSON file with the list of tensor shapes")
    p.add_argument("--iters", type=int, default=4, help="push+pull iterations per round")
    p.add_argument("--reps", type=int, default=5, help="rounds")
    p.add_argument("--no-raw", action="store_true",
                   help="no raw loopback TCP rounds (cluster runs compare with the link rate)")
    p.add_argument("--fusion", default="default",
                   help="comma-separated SyncStore bucket sizes in bytes, each measured as its "
                        "own mode in the same rounds ('default': mxlarge's; 0: per key)")
    p.add_argument("--wire", default="float32",
                   help="comma-separated wire types (float32, float16), each bucket size × "
                        "type its own mode of the same rounds (float16: mode name + '_float16')")
    p.add_argument("--bare", action="store_true",
                   help="also a mode of bare mx.kv pushpull of the same tensors, one key each")
    p.add_argument("--even", action="store_true",
                   help="also a mode of bare mx.kv pushpull of the same floats as up to 64 "
                        "equal keys, each sliced evenly over every server (the engine's "
                        "floor: even_sizes)")
    return p.parse_args(argv)


class RawTCP:
    """A connection to a :mod:`benchmarks.tcp_peer` process echoing ``nbytes`` per round trip."""

    def __init__(self, nbytes: int):
        self.peer = subprocess.Popen([sys.executable, "-m", "benchmarks.tcp_peer", str(nbytes)],
                                     stdout=subprocess.PIPE, text=True)
        port = int(self.peer.stdout.readline())
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.buf = memoryview(bytearray(nbytes))

    def round_trip(self) -> None:
        self.sock.sendall(self.buf)
        if not recv_exact(self.sock, self.buf):
            raise RuntimeError("tcp peer closed the connection")

    def close(self) -> None:
        self.sock.close()
        self.peer.wait(timeout=30)


#: MXNet slices a key over every server from this many elements (mxlarge.launcher.tuning sets
#: ``MXNET_KVSTORE_BIGARRAY_BOUND``; MXNet's own default is 1,000,000).
BIGARRAY_BOUND = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))


def even_sizes(total: int, most: int = 64) -> list[tuple[int]]:
    """``total`` floats as K ≤ ``most`` keys of equal size (the last takes the remainder), K as
    large as keeps every key at :data:`BIGARRAY_BOUND` elements or more (at least 1)."""
    k = max(1, min(most, total // BIGARRAY_BOUND))
    return [(total // k + (total % k if j == k - 1 else 0),) for j in range(k)]


class BareKV:
    """MXNet's store alone: one key per tensor under ``offset + i``, no mxlarge code."""

    def __init__(self, kv: Any, shapes: list[tuple[int, ...]], offset: int,
                 dtype: str = "float32"):
        self.kv = kv
        self.keys = [offset + i for i in range(len(shapes))]
        self.arrays = [mx.nd.zeros(s, dtype=dtype) for s in shapes]
        kv.init(self.keys, [a.copy() for a in self.arrays])

    def push_pull(self) -> None:
        """Every tensor's sum over workers, in place: backward order, priority −i."""
        for i in reversed(range(len(self.arrays))):
            self.kv.pushpull(self.keys[i], self.arrays[i], out=self.arrays[i], priority=-i)
        mx.nd.waitall()


def work(opts: argparse.Namespace) -> None:
    with open(opts.shapes) as f:
        shapes = [tuple(s) for s in json.load(f)]
    nbytes = 4 * sum(int(np.prod(s)) for s in shapes)
    from mxlarge.kvstore import FUSION_BYTES
    from mxlarge.kvstore.roles import param_roles
    from mxlarge.kvstore.sync import SyncStore

    kv = mx.kv.create("dist_sync")
    rank, k = kv.rank, kv.num_workers
    fusions = [FUSION_BYTES if f == "default" else int(f) for f in opts.fusion.split(",")]
    stores = {}
    variants = [(f, w) for f in fusions for w in opts.wire.split(",")]
    for v, (fusion, wire) in enumerate(variants):
        params = {}
        for i, shape in enumerate(shapes):
            p = mx.gluon.Parameter(f"v{v}_t{i}_weight", shape=shape)
            p.initialize(init=mx.init.Zero(), ctx=mx.cpu())
            params[p.name] = p
        # Each variant's keys in their own range of the one store (see OffsetKV).
        name = f"pushpull_{fusion}" + ("" if wire == "float32" else f"_{wire}")
        stores[name] = SyncStore(OffsetKV(kv, KEY_STRIDE * v), list(params.values()),
                                 param_roles(params), fusion_bytes=fusion, wire_dtype=wire)
    bare = BareKV(kv, shapes, KEY_STRIDE * len(variants)) if opts.bare else None
    even = None
    if opts.even:
        even = BareKV(kv, even_sizes(nbytes // 4), KEY_STRIDE * (len(variants) + 1))
    kv._barrier()
    raw = RawTCP(nbytes) if rank == 0 and not opts.no_raw else None

    def timed(fn: Any) -> list[float]:
        """Seconds of each of ``opts.iters`` iterations (each one ends fully completed)."""
        out = []
        for _ in range(opts.iters):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    def push_pull(store: Any) -> None:
        store.allreduce_grads()
        mx.nd.waitall()

    def timed_pushpull(store: Any) -> list[float]:
        kv._barrier()
        return timed(lambda: push_pull(store))

    def timed_raw() -> list[float]:
        kv._barrier()
        if raw is None:
            return []  # other ranks idle while rank 0 measures the baseline
        return timed(raw.round_trip)

    for store in stores.values():  # warm-up: server-side buffers, connections
        push_pull(store)
    for b in (bare, even):
        if b is not None:
            b.push_pull()
    if raw is not None:
        raw.round_trip()
    modes = {name: (lambda s=store: timed_pushpull(s)) for name, store in stores.items()}
    if bare is not None:
        modes["bare_kv"] = lambda: (kv._barrier(), timed(bare.push_pull))[1]
    if even is not None:
        modes["bare_even"] = lambda: (kv._barrier(), timed(even.push_pull))[1]
    if not opts.no_raw:
        modes["raw_tcp"] = timed_raw
    t = interleave(modes, opts.reps, progress=emit_progress if rank == 0 else None)
    kv._barrier()
    if raw is not None:
        raw.close()
    emit_result({"rank": rank, "workers": k,
                 "servers": int(os.environ.get("DMLC_NUM_SERVER", "0")),
                 "bigarray_bound": os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "default"),
                 "bytes": nbytes, "tensors": len(shapes),
                 "keys": {name: len(store.buckets) for name, store in stores.items()},
                 "fusion_bytes": fusions, "sec_per_iter": t})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
