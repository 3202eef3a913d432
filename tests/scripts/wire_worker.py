"""The 16-bit wire against the exact sum, as a launched dist_sync worker.

Every rank's gradients are drawn from a generator seeded by the rank, so each worker knows all
ranks' values and their exact (float64) sum. Tensors: one large enough to travel alone (and be
sliced over the servers), several small ones fused into a bucket, values over six decades
(subnormal float16 range included) and signs mixed. Argv: OUT_DIR WIRE PRESCALE. Each rank
writes ``OUT_DIR/<wire>-<rank>.npz``: the pulled sums, the exact sums and Σ|x|.
"""
from __future__ import annotations

import sys

SHAPES = [(1000, 1100), (64, 3), (17,), (5, 5, 3), (40,), (2_000,)]


def values(rank: int, step: int):
    import numpy as np
    rng = np.random.RandomState(1000 * step + rank)
    out = []
    for shape in SHAPES:
        mag = 10.0 ** rng.uniform(-7, 0, size=shape)
        out.append((mag * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32))
    return out


def main() -> int:
    out_dir, wire, prescale = sys.argv[1], sys.argv[2], float(sys.argv[3])
    import mxnet as mx  # a scheduler/server serves its role inside this import, then exits
    import numpy as np

    from mxlarge.kvstore.roles import param_roles
    from mxlarge.kvstore.sync import SyncStore
    from mxlarge.protocol.failfast import fail_fast

    with fail_fast():
        params = {}
        for j, shape in enumerate(SHAPES):
            p = mx.gluon.Parameter(f"p{j}", shape=shape)
            p.initialize(mx.init.Zero())
            params[p.name] = p
        store = SyncStore("dist_sync", list(params.values()), param_roles(params),
                          wire_dtype=wire, fusion_bytes=64 << 10)
        k, rank = store.collectives.num_workers, store.rank
        got, exact, absum = [], [], []
        for step in range(2):
            mine = values(rank, step)
            for p, v in zip(params.values(), mine):
                # the trainer's prescale s multiplies the gradient on the wire: push g/s
                p.grad()[:] = mx.nd.array(v / prescale)
            store.allreduce_grads(prescale=prescale)
            ranks = [values(r, step) for r in range(k)]
            for j, p in enumerate(params.values()):
                got.append(p.grad().asnumpy() * prescale)
                exact.append(sum(r[j].astype(np.float64) for r in ranks))
                absum.append(sum(np.abs(r[j].astype(np.float64)) for r in ranks))
        np.savez(f"{out_dir}/{wire}-{rank}.npz", *got, *exact, *absum)
        print(f"wire_worker rank={rank} buckets={len(store.buckets)} "
              f"fused={sum(b.fused for b in store.buckets)} "
              f"pieces={sum(not (b.fused or b.alone) for b in store.buckets)}", flush=True)
        mx.nd.waitall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
