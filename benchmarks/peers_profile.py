"""Which part of mxlarge's communication term loses to Gluon's (a diagnostic, not in any make).

    python -m benchmarks.peers_profile [--testbed] [--reps 4] [--steps 2]

One dist_sync job (2 workers + 2 servers on 127.0.0.1, or with ``--testbed`` 3 hosts of the
namespace testbed with 1 Gbit/s links, under the testbed lock), ``resnet50_v1b`` at 32 px
(ResNet-50's 161 tensors), one ``mxlarge.Trainer``. Per step, ``waitall`` after backward, then
``trainer.step`` timed to its end (communication + update). What the store does per key is
swapped between interleaved rounds, everything else fixed:

* ``mxlarge``: the Trainer as it is: one ``kv.pushpull`` per bucket (a push and a pull
  on a sampled step or a wire that splits them), buckets issued last layer first;
* ``pushpull_rev``: one ``kv.pushpull(i)`` per key instead (ps-lite answers the push with the
  sum), same order;
* ``pushpull_fwd``: ``kv.pushpull(i)`` in parameter order: exactly what
  ``gluon.Trainer(update_on_kvstore=False)`` issues;
* ``push_pull_fwd``: push then pull, parameter order.

The per-key implementation is swapped by replacing the store's bound ``allreduce_grads``: this
reaches into ``SyncStore``, which is why it is a diagnostic and not a benchmark.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

WORKER_MODES = ("mxlarge", "pushpull_rev", "pushpull_fwd", "push_pull_fwd")


def _parse_worker(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    return p.parse_args(argv)


def work(opts: argparse.Namespace) -> None:
    """The worker: see the module docstring (imports MXNet; run as a job's command)."""
    import time
    import types

    import mxnet as mx
    from mxnet import autograd

    import mxlarge
    from benchmarks.common import emit_result, interleave
    from benchmarks.models import build_net, synthetic_batches

    kv = mx.kv.create("dist_sync")
    net = build_net("resnet50_v1b", 1000, 32, seed=0)
    trainer = mxlarge.Trainer(net.collect_params(), "sgd",
                              {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}, kvstore=kv,
                              decay_bn_bias=True)
    batches = synthetic_batches(2, 8, 32, 1000, seed=kv.rank)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    store = trainer.store

    def per_key(pushpull: bool, order: str) -> Any:
        def allreduce(self: Any) -> None:
            for i in (reversed(self.pushed) if order == "rev" else self.pushed):
                g = self.params[i].list_grad()
                if pushpull:
                    self.kv.pushpull(i, g, out=g, priority=-i)
                else:
                    self.kv.push(i, g, priority=-i)
                    self.kv.pull(i, out=g, priority=-i)
        return types.MethodType(allreduce, store)

    impl = {"mxlarge": store.allreduce_grads, "pushpull_rev": per_key(True, "rev"),
            "pushpull_fwd": per_key(True, "fwd"), "push_pull_fwd": per_key(False, "fwd")}

    def run(mode: str) -> float:
        store.allreduce_grads = impl[mode]
        comm = []
        for s in range(opts.steps):
            x, y = batches[s % len(batches)]
            mx.nd.waitall()
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            mx.nd.waitall()
            t0 = time.perf_counter()
            trainer.step(8)
            mx.nd.waitall()
            comm.append(time.perf_counter() - t0)
        return statistics.median(comm)

    for mode in WORKER_MODES:  # warm-up
        run(mode)
    emit_result({"rank": kv.rank,
                 "sec": interleave({m: (lambda m=m: run(m)) for m in WORKER_MODES}, opts.reps)})


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("DMLC_ROLE"):  # started as a job's process
        import mxnet  # noqa: F401  (a scheduler or server serves its role inside this import)

        from benchmarks.common import worker_main
        return worker_main(_parse_worker, work, argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers_profile",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--testbed", action="store_true")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    a = p.parse_args(argv)
    if a.testbed and os.geteuid() != 0:
        print("peers_profile: error: --testbed needs root", file=sys.stderr)
        return 2
    args = ["--reps", str(a.reps), "--steps", str(a.steps)]
    results = _on_testbed(args) if a.testbed else _on_loopback(args)
    r = min(results, key=lambda x: x["rank"])
    for mode, values in r["sec"].items():
        print(f"{mode:14s} communication+update median {1e3 * statistics.median(values):7.1f} "
              f"ms (rounds: {', '.join(f'{1e3 * v:.0f}' for v in values)})")
    return 0


def _on_loopback(args: list[str]) -> list[dict[str, Any]]:
    from benchmarks.common import launch

    return launch("benchmarks.peers_profile", args, workers=2, servers=2,
                  env={"OMP_NUM_THREADS": "1"})


def _on_testbed(args: list[str]) -> list[dict[str, Any]]:
    from benchmarks.common import BenchmarkError
    from benchmarks.peers_jobs import PeerOutput, job_env, stream
    from benchmarks.peers_testbed import RATE, shape, unshape
    from mxlarge.testbed import Testbed, exclusive, our_namespaces

    root = str(Path(__file__).resolve().parents[1])
    with exclusive():
        if our_namespaces():
            raise BenchmarkError("a testbed is up without the lock's holder; not touching it")
        tb = Testbed(n=3)
        tb.up()
        work_dir = tb.root / "work" / f"profile-{uuid.uuid4().hex[:8]}"
        try:
            work_dir.mkdir(parents=True)
            shape(tb, RATE)
            hosts = work_dir / "hosts"
            hosts.write_text("".join(f"{tb.addr(h)}\n" for h in tb.hosts))
            out = PeerOutput(None)
            cmd = [sys.executable, "-m", "mxlarge.launcher", "-n", "3", "-s", "3", "--launcher",
                   "ssh", "-H", str(hosts), "--host-ip", tb.addr("h0"), "--no-mlflow", "--",
                   sys.executable, "-m", "benchmarks.peers_profile", *args]
            if stream(tb.on("h0", *cmd), {**os.environ, **job_env()}, out, cwd=root) != 0:
                raise BenchmarkError("profile job failed:\n" + "\n".join(out.tail[-15:]))
            return out.results
        finally:
            unshape(tb)
            shutil.rmtree(work_dir, ignore_errors=True)
            tb.down()


if __name__ == "__main__":
    sys.exit(main())
