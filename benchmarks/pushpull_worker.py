"""Worker script of benchmark 3: push+pull bandwidth of a ResNet-50-sized parameter set.

Started as every role of a local dist_sync job (scheduler/server exit inside ``import mxnet``).
Each worker makes one Gluon parameter per tensor of the given shapes (ResNet-50 v1b's 161
trainable tensors, 25.6 M float32, in their real shapes) and, per iteration, sums their
gradients with mxlarge's own :meth:`mxlarge.kvstore.sync.SyncStore.allreduce_grads` (buckets of
``--fusion-bytes``, 0: one key per tensor; backward order, priorities), then waits for all of it.

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

from benchmarks.common import emit_progress, emit_result, interleave, worker_main
from benchmarks.tcp_peer import recv_exact


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("shapes", help="JSON file with the list of tensor shapes")
    p.add_argument("--iters", type=int, default=4, help="push+pull iterations per round")
    p.add_argument("--reps", type=int, default=5, help="rounds")
    p.add_argument("--fusion-bytes", type=int, default=None,
                   help="SyncStore bucket size (default: mxlarge's default; 0: per key)")
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


def work(opts: argparse.Namespace) -> None:
    with open(opts.shapes) as f:
        shapes = [tuple(s) for s in json.load(f)]
    nbytes = 4 * sum(int(np.prod(s)) for s in shapes)
    from mxlarge.kvstore import FUSION_BYTES
    from mxlarge.kvstore.roles import param_roles
    from mxlarge.kvstore.sync import SyncStore

    kv = mx.kv.create("dist_sync")
    rank, k = kv.rank, kv.num_workers
    params = {}
    for i, shape in enumerate(shapes):
        p = mx.gluon.Parameter(f"t{i}_weight", shape=shape)
        p.initialize(init=mx.init.Zero(), ctx=mx.cpu())
        params[p.name] = p
    fusion = FUSION_BYTES if opts.fusion_bytes is None else opts.fusion_bytes
    store = SyncStore(kv, list(params.values()), param_roles(params), fusion_bytes=fusion)
    kv._barrier()

    def push_pull() -> None:
        store.allreduce_grads()
        mx.nd.waitall()

    raw = RawTCP(nbytes) if rank == 0 else None

    def timed(fn: Any) -> list[float]:
        """Seconds of each of ``opts.iters`` iterations (each one ends fully completed)."""
        out = []
        for _ in range(opts.iters):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return out

    def timed_pushpull() -> list[float]:
        kv._barrier()
        return timed(push_pull)

    def timed_raw() -> list[float]:
        kv._barrier()
        if raw is None:
            return []  # other ranks idle while rank 0 measures the baseline
        return timed(raw.round_trip)

    push_pull()  # warm-up: server-side buffers, connections
    if raw is not None:
        raw.round_trip()
    t = interleave({"pushpull": timed_pushpull, "raw_tcp": timed_raw}, opts.reps,
                   progress=emit_progress if rank == 0 else None)
    kv._barrier()
    if raw is not None:
        raw.close()
    emit_result({"rank": rank, "workers": k,
                 "servers": int(os.environ.get("DMLC_NUM_SERVER", "0")),
                 "bigarray_bound": os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "default"),
                 "bytes": nbytes, "tensors": len(shapes), "keys": len(store.buckets),
                 "fusion_bytes": fusion, "sec_per_iter": t})


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
