"""Worker for ``tests/e2e/test_mxnet_facts_dist.py``: MXNet 1.9.1 dist_sync facts observed
directly on MXNet (Gluon and the KVStore), no mxlarge code in the way.

Every role runs ``python facts_worker.py MODE``; a scheduler or server serves its role inside
``import mxnet`` and exits there. Each worker prints one ``FACT {json}`` line with what it saw.

Modes:

``on_kvstore``
    ``gluon.Trainer`` with its dist_sync default (``update_on_kvstore=True``: the optimizer is
    pickled to the servers). Parameter ``w`` (wd_mult 1) gets gradient Σ_i x_i with
    x_i = (rank + 1)·1 over n = 4 samples; ``e`` (wd_mult 0) gets a zero gradient. SGD lr 0.1,
    wd 0.5, ``step(n)``; then ``set_learning_rate(0)`` and a second ``step(n)``.
``lazy_init``
    ``gluon.Trainer(..., update_on_kvstore=False)``: the first ``step`` initialises the store,
    pulls the initial weight and pushes the first gradient, with nothing ordering the two on
    the wire. Then, on the same store (servers only sum here), a raw push of a non-gradient
    array and a pull of the same key.
``key_limit``
    ``init`` of key 215,329 (the largest whose ``key * 9973`` fits in a C int) and of 215,331,
    first thing after creating the store (run with 2 servers).
"""
from __future__ import annotations

import json
import os
import sys

if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
    import mxnet  # noqa: F401  (serves the ps-lite role and exits)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

from mxlarge.protocol.failfast import fail_fast  # noqa: E402

N, D = 4, 3
KEY_LIMIT = (2**31 - 1) // 9973  # 215,329: the largest key whose key * 9973 fits in an int32


def _loss(w: gluon.Parameter, x: mx.nd.NDArray, extra: gluon.Parameter | None = None):
    loss = mx.nd.dot(x, w.data()).sum()
    if extra is not None:
        loss = loss + (extra.data() * 0).sum()
    return loss


def on_kvstore(kv: mx.kv.KVStore) -> dict:
    rank = kv.rank
    w = gluon.Parameter("w", shape=(D,), init=mx.init.Constant(1.0))
    e = gluon.Parameter("e", shape=(D,), init=mx.init.Constant(2.0), wd_mult=0.0)
    for p in (w, e):
        p.initialize(ctx=mx.cpu())
    trainer = gluon.Trainer([w, e], "sgd", {"learning_rate": 0.1, "wd": 0.5}, kvstore=kv)
    x = mx.nd.ones((N, D)) * (rank + 1)
    seen = {}
    for step, lr in enumerate((None, 0.0)):
        if lr is not None:
            trainer.set_learning_rate(lr)
        with autograd.record():
            loss = _loss(w, x, e)
        loss.backward()
        trainer.step(N)
        seen[f"w{step + 1}"] = w.data().asnumpy().tolist()
        seen[f"e{step + 1}"] = e.data().asnumpy().tolist()
    seen["update_on_kvstore"] = bool(trainer._update_on_kvstore)
    return seen


def key_limit(kv: mx.kv.KVStore) -> dict:
    seen = {}
    for key in (KEY_LIMIT, KEY_LIMIT + 2):  # + 2: odd, so the wrapped product's index is -1
        try:
            kv.init(key, mx.nd.zeros((D,)))
            mx.nd.waitall()
            seen[str(key)] = "ok"
        except mx.base.MXNetError as exc:
            seen[str(key)] = " ".join(line for line in str(exc).splitlines()
                                      if "Check failed" in line)[:300]
    return seen


def lazy_init(kv: mx.kv.KVStore) -> dict:
    rank = kv.rank
    w = gluon.Parameter("w", shape=(D,), init=mx.init.Constant(1.0))
    w.initialize(ctx=mx.cpu())
    trainer = gluon.Trainer([w], "sgd", {"learning_rate": 0.1}, kvstore=kv,
                            update_on_kvstore=False)
    x = mx.nd.ones((N, D)) * (rank + 1)
    with autograd.record():
        loss = _loss(w, x)
    loss.backward()
    mx.nd.waitall()
    trainer.step(N)
    mx.nd.waitall()
    seen = {"w1": w.data().asnumpy().tolist()}

    pushed = mx.nd.ones((D,)) * (rank + 1)
    kv.init(1000, mx.nd.zeros((D,)))
    kv.push(1000, pushed)
    out = mx.nd.zeros((D,))
    kv.pull(1000, out=out)
    mx.nd.waitall()
    seen["pushed_after_pull"] = pushed.asnumpy().tolist()
    seen["pulled"] = out.asnumpy().tolist()
    return seen


def main() -> None:
    mode = sys.argv[1]
    with fail_fast():
        kv = mx.kv.create("dist_sync")
        seen = {"on_kvstore": on_kvstore, "lazy_init": lazy_init, "key_limit": key_limit}[mode](kv)
        seen.update(rank=kv.rank, workers=kv.num_workers)
        print("FACT " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
