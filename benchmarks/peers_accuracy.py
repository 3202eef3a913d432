"""The peers' accuracy twin (``python -m benchmarks.peers --part accuracy``).

The MNIST-1D recipe at 16× (:mod:`benchmarks.peer_accuracy_worker`) through each peer's
trainer, one 2-worker launch per (peer, seed), the peer order reversed for every other seed.
Final error = median of the last 5 epochs' validation error; per peer mean ± sample standard
deviation over the seeds, each peer's mean minus mxlarge's, and Welch's two-sided t-test of
the two means (:func:`mxlarge.stats.welch`).
"""
from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Mapping
from typing import IO, Any

from benchmarks.common import git_commit, md_table

WORKER = "benchmarks.peer_accuracy_worker"
SEEDS = (0, 1, 2, 3, 4)

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
    from benchmarks.peers_jobs import PeerOutput, loopback_launcher, rank0, versions

    commit, load = git_commit(), [os.getloadavg()[0]]
    seeds = SEEDS[:1] if a.quick else SEEDS
    launcher = loopback_launcher(2, WORKER)
    # the 16-bit wire's accuracy twin is not built yet: the float32 peers only
    peers = [p for p in a.peers if p in LACKS]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
    print("peers: accuracy twin, MNIST-1D recipe at 16×, 2 workers", flush=True)
    for i, seed in enumerate(seeds):
        for peer in (peers if i % 2 == 0 else peers[::-1]):
            out = PeerOutput(log)
            launcher(peer, ["--seed", str(seed)] + (["--epochs", "6"] if a.quick else []), out)
            res = rank0(out.results)
            runs[peer].append(res)
            print(f"  seed {seed} {peer:9s} final error {100 * res['final_error']:.2f}% "
                  f"({res['seconds']:.0f} s)", flush=True)
    load.append(os.getloadavg()[0])
    return {"commit": commit, "versions": versions(), "seeds": list(seeds), "runs": runs,
            "load_1min": load,
            "setup": "experiments/proxy/mnist1d-recipe.yaml with data.batch_size=256 "
                     "dist.kvstore=dist_sync dist.workers=2 (global batch 512 = 2 workers × "
                     "256, 16× the reference 32; 16 epochs over 20,000 signals) through each "
                     "trainer, 2 workers on 127.0.0.1, one launch per peer and seed; final "
                     "error = median of the last 5 epochs' validation error (2,000 signals). "
                     "The peers get the recipe as a user writes it with MXNet's tools (LR 0.8,"
                     " MultiFactorScheduler with linear warmup and the two ÷10 drops): see "
                     "`benchmarks/peer_accuracy_worker.py`. p: Welch's two-sided t-test of the"
                     " peer's mean against mxlarge's."}


def _mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def render_table(part: Mapping[str, Any]) -> str:
    from mxlarge.stats import welch

    runs = part["runs"]
    base = [r["final_error"] for r in runs.get("mxlarge", [])]
    rows = []
    for peer, rs in runs.items():
        errs = [r["final_error"] for r in rs]
        m, s = _mean_std(errs)
        test = welch(errs, base) if base and peer != "mxlarge" else None
        rows.append([f"`{peer}`", " / ".join(f"{100 * e:.2f}" for e in errs),
                     f"{100 * m:.2f} ± {100 * s:.2f}",
                     "—" if not base or peer == "mxlarge" else
                     f"{100 * (m - statistics.fmean(base)):+.2f}",
                     "—" if test is None else f"{test.p:.3g}", LACKS[peer]])
    return md_table(["trainer", "final error % per seed " + "/".join(map(str, part["seeds"])),
                     "mean ± std", "− mxlarge (points)", "Welch p", "lacks of the recipe"],
                    rows)
