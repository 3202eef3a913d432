"""Whether a tensor's pieces travel concurrently (:mod:`mxlarge.kvstore.pieces`).

    python -m benchmarks.pieces_probe [--workers 1] [--servers 1] [--pieces 64] [--floats 65536]

Launches a dist_sync job on 127.0.0.1 and, in its workers, exchanges one tensor of
``pieces × floats`` float32 in alternating rounds four ways: ``whole`` (one key), ``slices``
(one ``pushpull`` per piece on slices of the tensor, which share its engine variable),
``aliases`` (:class:`~mxlarge.kvstore.pieces.PieceLinks`, what the store does) and
``separate`` (one ``pushpull`` per piece on arrays of their own: the concurrent floor). Checks
that ``aliases`` gives the exact sum. Prints one JSON object: median ms per exchange, per
worker. Ad hoc: not part of ``make bench``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

MODES = ("whole", "slices", "aliases", "separate")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--pieces", type=int, default=64)
    p.add_argument("--floats", type=int, default=65536, help="floats per piece")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    import mxnet as mx
    import numpy as np

    from benchmarks.common import emit_result
    from mxlarge.kvstore.fusion import Bucket
    from mxlarge.kvstore.pieces import PieceLinks

    kv = mx.kv.create("dist_sync")
    k, p = opts.pieces, opts.floats
    whole = mx.nd.ones((k * p,))
    separate = [mx.nd.ones((p,)) for _ in range(k)]
    slices = [whole[j * p:(j + 1) * p] for j in range(k)]
    pieces = [Bucket(1000 + j, (0,), (j * p,), p) for j in range(k)]
    links = PieceLinks()
    kv.init([0] + [b.key for b in pieces], [mx.nd.zeros((k * p,))] + [mx.nd.zeros((p,))] * k)

    def exchange(mode: str) -> None:
        if mode == "whole":
            kv.pushpull(0, whole, out=whole)
        elif mode == "aliases":
            links.exchange(pieces, [whole], lambda b, a: kv.pushpull(b.key, a, out=a,
                                                                      priority=1000 - b.key))
        else:
            for j, a in enumerate(slices if mode == "slices" else separate):
                kv.pushpull(1000 + j, a, out=a, priority=-j)

    def timed(mode: str) -> float:
        mx.nd.waitall()
        t0 = time.perf_counter()
        exchange(mode)
        mx.nd.waitall()
        return time.perf_counter() - t0

    for mode in MODES:
        timed(mode)
    t: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(opts.reps):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            t[mode].append(timed(mode))
    x = np.arange(k * p, dtype=np.float32) * np.float32(1e-3)
    whole[:] = mx.nd.array(x + kv.rank)
    exchange("aliases")
    exact = sum(x + np.float32(r) for r in range(kv.num_workers))
    emit_result({"rank": kv.rank, "ms": {m: 1e3 * statistics.median(v) for m, v in t.items()},
                 "aliases_exact": bool(np.array_equal(whole.asnumpy(), exact))})


def main(argv: list[str] | None = None) -> int:
    opts = _parse(argv)
    if opts.worker:  # every role of the job: a scheduler or server serves inside this import
        import mxnet  # noqa: F401

        from benchmarks.common import worker_main
        return worker_main(_parse, work, argv)
    from benchmarks.common import launch
    res = launch("benchmarks.pieces_probe",
                 ["--worker", "--pieces", str(opts.pieces), "--floats", str(opts.floats),
                  "--reps", str(opts.reps)], workers=opts.workers, servers=opts.servers)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
