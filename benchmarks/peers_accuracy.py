"""The peers' accuracy twin (``python -m benchmarks.peers --part accuracy``).

The digits recipe at 16× (:mod:`benchmarks.peer_accuracy_worker`) through each peer's trainer,
one 2-worker launch per (peer, seed), the peer order reversed for every other seed. Final error
= median of the last 5 epochs' validation error; per peer mean ± sample standard deviation over
the seeds, and each peer's mean minus mxlarge's.
"""
from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Mapping
from typing import IO, Any

from benchmarks.common import git_commit, md_table

WORKER = "benchmarks.peer_accuracy_worker"
SEEDS = (0, 1, 2)

#: What each peer's run lacks of the recipe (the configuration is in the worker's docstring).
LACKS = {
    "mxlarge": "— (the recipe: momentum correction, no decay on BN/biases, averaged BN "
               "statistics for evaluation)",
    "gluon_kv": "momentum correction; decay on every tensor (wd_mult would be lost on the "
                "servers anyway); rank 0's BN statistics",
    "gluon": "momentum correction; decay on every tensor; rank 0's BN statistics",
    "horovod": "momentum correction; decay on every tensor; rank 0's BN statistics",
}


def run_accuracy(a: argparse.Namespace, log: IO[str]) -> dict[str, Any]:
    """Runs every (peer, seed) job and returns the part of peers.json."""
    from benchmarks.peers_jobs import PeerOutput, loopback_launcher, versions

    commit, load = git_commit(), [os.getloadavg()[0]]
    seeds = SEEDS[:1] if a.quick else SEEDS
    launcher = loopback_launcher(2, WORKER)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in a.peers}
    print("peers: accuracy twin, digits recipe at 16×, 2 workers", flush=True)
    for i, seed in enumerate(seeds):
        for peer in (a.peers if i % 2 == 0 else a.peers[::-1]):
            out = PeerOutput(log)
            launcher(peer, ["--seed", str(seed)] + (["--epochs", "6"] if a.quick else []), out)
            res = out.results[0]
            runs[peer].append(res)
            print(f"  seed {seed} {peer:9s} final error {100 * res['final_error']:.2f}% "
                  f"({res['seconds']:.0f} s)", flush=True)
    load.append(os.getloadavg()[0])
    return {"commit": commit, "versions": versions(), "seeds": list(seeds), "runs": runs,
            "load_1min": load,
            "setup": "experiments/proxy/digits-largebatch.yaml (global batch 256 = 2 workers "
                     "× 128, 16× the reference 16) through each trainer, 2 workers on "
                     "127.0.0.1, one launch per peer and seed; final error = median of the "
                     "last 5 epochs' validation error (397 images). The peers get the recipe "
                     "as a user writes it with MXNet's tools (LR 0.8, MultiFactorScheduler "
                     "with linear warmup and the two ÷10 drops): see "
                     "`benchmarks/peer_accuracy_worker.py`."}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def render_table(part: Mapping[str, Any]) -> str:
    runs = part["runs"]
    base = _mean_std([r["final_error"] for r in runs["mxlarge"]])[0] if "mxlarge" in runs \
        else None
    rows = []
    for peer, rs in runs.items():
        errs = [r["final_error"] for r in rs]
        m, s = _mean_std(errs)
        rows.append([f"`{peer}`", " / ".join(f"{100 * e:.2f}" for e in errs),
                     f"{100 * m:.2f} ± {100 * s:.2f}",
                     "—" if base is None or peer == "mxlarge" else f"{100 * (m - base):+.2f}",
                     LACKS[peer]])
    return md_table(["trainer", "final error % per seed " + "/".join(map(str, part["seeds"])),
                     "mean ± std", "− mxlarge (points)", "lacks of the recipe"], rows)
