"""A real mxlarge worker for tests that need to watch what crosses the KVStore.

Usage (as the command of every role of a launched job): ``python dist_worker.py CONFIG OUTDIR``.
The KVStore is the real one; the worker records the keys it pushes and pulls (through a thin
forwarding wrapper given to ``build`` before the store is initialised), separately for the
initialisation and for training, and writes them to ``OUTDIR/keys-<rank>.json``.
"""
import json
import os
import sys

if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
    import mxnet  # noqa: F401  (runs the ps-lite role and exits)

import mxnet as mx  # noqa: E402

from mxlarge import loop as L  # noqa: E402
from mxlarge.config import load_config  # noqa: E402
from mxlarge.run import build  # noqa: E402


class Recording:
    """Forwards everything to the real KVStore, noting each pushed and pulled key per phase."""

    def __init__(self, kv):
        self._kv = kv
        self.phase = "init"
        self.keys = {f"{op}_{phase}": [] for op in ("pushed", "pulled")
                     for phase in ("init", "train")}

    def push(self, key, value, priority=0):
        self.keys[f"pushed_{self.phase}"].append(int(key))
        return self._kv.push(key, value, priority=priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        self.keys[f"pulled_{self.phase}"].append(int(key))
        return self._kv.pull(key, out=out, priority=priority, ignore_sparse=ignore_sparse)

    def pushpull(self, key, value, out=None, priority=0):
        self.keys[f"pushed_{self.phase}"].append(int(key))
        self.keys[f"pulled_{self.phase}"].append(int(key))
        return self._kv.pushpull(key, value, out=out, priority=priority)

    def __getattr__(self, name):
        return getattr(self._kv, name)


def main():
    cfg = load_config(sys.argv[1])
    outdir = sys.argv[2]
    rec = Recording(mx.kv.create(cfg.dist.kvstore))
    b = build(cfg, kv=rec)
    trainer = b.trainer
    assert trainer.store.kv is rec
    rec.phase = "train"
    hooks = [L.EvalHook(b.data.val, batch_size=64, every=1)]
    loop = L.TrainLoop(net=b.net, trainer=trainer, train_source=b.data.train,
                       loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=cfg.train.epochs,
                       ctx=b.ctx, hooks=hooks, max_steps=cfg.train.max_steps)
    loop.run()
    roles = [{"name": r.name, "pushed": r.pushed, "local_stat": r.local_stat}
             for r in trainer.roles]
    buckets = [{"key": b.key, "members": list(b.members)} for b in trainer.store.buckets]
    with open(os.path.join(outdir, f"keys-{trainer.rank}.json"), "w") as fh:
        json.dump({**rec.keys, "roles": roles, "buckets": buckets}, fh)


if __name__ == "__main__":
    main()
