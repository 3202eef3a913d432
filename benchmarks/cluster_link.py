"""Benchmark 10 (``make bench-cluster``, root): push+pull against the link, on the testbed.

Real hosts with real links, emulated: the namespace testbed of ``mxlarge/testbed.py``
with 2·W + 1 hosts. The launcher and the scheduler run on h0 (unshaped: the scheduler carries
only control messages); dmlc's ssh backend puts server i on hostfile line i and worker j on
line S + j, so servers run on h1..hS and workers on h(S+1)..h(S+W), one process per host. Each
of those hosts gets a ``tc tbf`` rate limit of B bit/s in each direction: on its ``eth0``
(what it sends) and on its veth peer at the bridge (what it receives). netem is not available in
this kernel, so no latency is added: the links are fast and thin.

Per configuration one launched job of :mod:`benchmarks.pushpull_worker` with ``--no-raw``:
rank 0 times iterations of mxlarge's own ``SyncStore.allreduce_grads`` over the gradient set
(every worker in lockstep, a barrier before each round), each iteration until every pulled sum
has arrived.

Bound (BytePS's, for a parameter server with enough server bandwidth): a worker sends |g| and
receives |g| per step; with W = S a server receives W·|g|/S = |g| and sends as much. On
full-duplex links of B bit/s per direction nothing can finish sooner than ``8·|g| / B``.
Ratio = measured time of one push+pull ÷ that bound (≥ 1; target ≤ 1.2 for ResNet-50's
gradients, W = S = 2, 1 Gbit/s). TCP/IP headers alone cost ~4 % at MTU 1500: the goodput of
one bounded TCP transfer h1 → h2 through the same shaping (:mod:`benchmarks.link_probe`) is
recorded beside each rate, and the ratio against it is in the markdown.

Not part of ``make bench`` (root, ~5 min, needs the testbed's packages); results go to
``results/cluster/latest.{json,md}``. Every use of the testbed holds ``/var/tmp/
mxlarge-testbed.lock`` (other benchmarks use the same namespaces).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from benchmarks.common import (
    ROOT,
    BenchmarkError,
    BenchResult,
    JobOutput,
    Ratio,
    md_table,
    median,
    mmm,
)

BURST, LATENCY = "256kb", "10ms"  # tbf bucket and queue (cluster-testbed.md's verified values)
PROBE_MB, PROBE_PORT = 100, 47011


@dataclass(frozen=True)
class Config:
    key: str
    net: str  # "resnet50" or "demo"
    workers: int  # = servers
    rate_gbit: float
    fusion: int | None = None  # bucket bytes (None: mxlarge's default, 0: per key)
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the launcher (forwarded)
    target: float | None = None
    worker_args: tuple[str, ...] = ()  # extra arguments of benchmarks.pushpull_worker
    colocated: bool = False  # server i and worker i on host h(i+1) (else hosts of their own)

    @property
    def label(self) -> str:
        return ", ".join(["per key" if self.fusion == 0 else "fused",
                          *(f"{k}={v}" for k, v in self.env)])


MXNET_BOUND = (("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"),)  # MXNet's own default
CONFIGS: tuple[Config, ...] = (
    Config("link_resnet50_w2_1g", "resnet50", 2, 1.0, target=1.2),
    Config("link_resnet50_w2_1g_perkey", "resnet50", 2, 1.0, fusion=0),
    Config("link_resnet50_w2_1g_bound1e6", "resnet50", 2, 1.0, env=MXNET_BOUND),
    Config("link_resnet50_w3_1g", "resnet50", 3, 1.0),
    Config("link_resnet50_w3_1g_bound1e6", "resnet50", 3, 1.0, env=MXNET_BOUND),
    Config("link_resnet50_w2_5g", "resnet50", 2, 5.0),
    Config("link_demo_w2_1g", "demo", 2, 1.0),
    Config("link_demo_w2_1g_perkey", "demo", 2, 1.0, fusion=0),
    # co-located, against the engine's floor (bare equal keys sliced over every server)
    Config("floor_resnet50_w3_200m_colocated", "resnet50", 3, 0.2, target=1.02,
           worker_args=("--even",), colocated=True),
    Config("floor_resnet50_w3_1g_colocated", "resnet50", 3, 1.0, target=1.02,
           worker_args=("--even",), colocated=True),
    # the same job with the 3 servers on hosts of their own (placement: |g| per worker host)
    Config("floor_resnet50_w3_200m", "resnet50", 3, 0.2, target=1.02, worker_args=("--even",)),
)
#: server hosts ÷ co-located, the same floats at the same rate: (own hosts, co-located) keys
PLACEMENT = {"placement_resnet50_w3_200m": ("floor_resnet50_w3_200m",
                                            "floor_resnet50_w3_200m_colocated")}


def demo_shapes() -> list[list[int]]:
    """The demo net's trainable tensors (small_resnet width 16 on 1×8×8 digits)."""
    import mxnet as mx

    from mxlarge.config import ModelConfig
    from mxlarge.nets import build_net, initialize

    cfg = ModelConfig(name="small_resnet", width=16)
    net = build_net(cfg, 10)
    initialize(net, cfg, seed=0, ctx=[mx.cpu()], input_shape=(1, 8, 8))
    return [list(p.shape) for p in net.collect_params().values() if p.grad_req != "null"]


def _run(*cmd: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchmarkError(f"{' '.join(cmd)}: {r.stderr.strip()[-300:]}")


def shape_links(tb: Any, hosts: list[str], rate_gbit: float | None) -> None:
    """``tc tbf`` of ``rate_gbit`` on both directions of each host (None: remove)."""
    from mxlarge.testbed import BRIDGE_NS

    for h in hosts:
        i = int(h[1:])
        for ns, dev in ((tb.netns(h), "eth0"), (BRIDGE_NS, f"v{i}")):
            if rate_gbit is None:
                subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                               capture_output=True)
            else:
                _run("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                     f"{int(rate_gbit * 1000)}mbit", "burst", BURST, "latency", LATENCY)


def probe(tb: Any, src: str, dst: str) -> float:
    """Goodput in Gbit/s of one bounded TCP transfer ``src`` → ``dst``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(tb.on(dst, sys.executable, "-m", "benchmarks.link_probe", "serve",
                                    tb.addr(dst), str(PROBE_PORT)),
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        if server.stdout is None or server.stdout.readline().strip() != "ready":
            raise BenchmarkError("link probe receiver did not start")
        r = subprocess.run(tb.on(src, sys.executable, "-m", "benchmarks.link_probe", "send",
                                 tb.addr(dst), str(PROBE_PORT), str(PROBE_MB)),
                           capture_output=True, text=True, env=env, timeout=120)
        if r.returncode != 0:
            raise BenchmarkError(f"link probe failed: {r.stderr.strip()[-300:]}")
        return PROBE_MB * (1 << 20) * 8 / float(r.stdout.strip()) / 1e9
    finally:
        server.wait(timeout=30)


def _job(tb: Any, work: Path, shapes: Path, c: Config, reps: int, iters: int,
         log: IO[str] | None, bar: Any) -> dict[str, Any]:
    hosts = [f"h{i}" for i in range(1, (1 if c.colocated else 2) * c.workers + 1)]
    hostfile = work / f"hosts-{c.key}"
    hostfile.write_text("".join(f"{tb.addr(h)}\n" for h in hosts))
    fusion = [] if c.fusion is None else ["--fusion", str(c.fusion)]
    argv = tb.on("h0", sys.executable, "-m", "mxlarge.launcher", "-n", str(c.workers), "-s",
                 str(c.workers), "--launcher", "ssh", "-H", str(hostfile), "--no-mlflow", "--",
                 sys.executable, "-m", "benchmarks.pushpull_worker", str(shapes), "--no-raw",
                 "--reps", str(reps), "--iters", str(iters), *fusion, *c.worker_args)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DMLC_", "MLFLOW_", "MXLARGE_", "SLURM_"))}
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore", **dict(c.env))
    out = JobOutput(log, bar)
    if log is not None:
        log.write(f"=== {c.key}: {' '.join(argv)}\n")
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    out.write(r.stdout + r.stderr)
    out.flush()
    if r.returncode != 0 or len(out.results) != c.workers:
        tail = "\n".join(out.tail[-15:])
        raise BenchmarkError(f"{c.key}: exit {r.returncode}, {len(out.results)} result(s)\n"
                             f"{tail}")
    return sorted(out.results, key=lambda x: x.get("rank", 0))[0]


def run(reps: int = 5, iters: int = 3, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    from benchmarks.bandwidth import resnet50_shapes
    from mxlarge.testbed import Testbed, exclusive

    n_hosts = 2 * max(c.workers for c in CONFIGS) + 1
    ratios, rows, details = [], [], []
    exchange: dict[str, list[float]] = {}  # floor_* key -> mxlarge's push+pull per round
    shapes = {"resnet50": resnet50_shapes(), "demo": demo_shapes()}
    with exclusive():
        tb = Testbed(n=n_hosts)
        work = tb.root / "work" / "bench"  # shared by every host (/tmp is per host)
        tb.up()
        try:
            work.mkdir(parents=True, exist_ok=True)
            shape_files = {}
            for name, value in shapes.items():
                shape_files[name] = work / f"{name}.json"
                shape_files[name].write_text(json.dumps(value))
            shaped = [f"h{i}" for i in range(1, n_hosts)]
            goodput: dict[float, float] = {}
            for c in CONFIGS:
                shape_links(tb, shaped, c.rate_gbit)
                if c.rate_gbit not in goodput:
                    goodput[c.rate_gbit] = probe(tb, "h1", "h2")
                res = _job(tb, work, shape_files[c.net], c, reps, iters, log, bar)
                nbytes = res["bytes"]
                bound = 8 * nbytes / (c.rate_gbit * 1e9)
                mode = next(m for m in res["sec_per_iter"] if m.startswith("pushpull_"))
                keys = res["keys"][mode]
                best = [min(x) for x in res["sec_per_iter"][mode]]  # per round
                if "bare_even" in res["sec_per_iter"]:  # ÷ the engine's floor, round by round
                    floor = [min(x) for x in res["sec_per_iter"]["bare_even"]]
                    ratios.append(Ratio(
                        c.key, f"mxlarge push+pull ÷ bare equal keys sliced over every server, "
                               f"W = S = {c.workers} "
                               f"{'co-located' if c.colocated else 'on hosts of their own'}, "
                               f"{c.rate_gbit:g} Gbit/s per host, {c.net}",
                        [t / f for t, f in zip(best, floor)],
                        target=c.target, higher_is_better=False,
                        note=f"{keys} keys; floor {1e3 * median(floor):.0f} ms"))
                    rows.append([c.key, c.net, c.workers, f"{c.rate_gbit:g}", "", keys, "",
                                 mmm([1e3 * t for t in best], "{:.1f}"),
                                 f"÷ floor {median([t / f for t, f in zip(best, floor)]):.3f}",
                                 ""])
                    details.append({**c.__dict__, "bytes": nbytes,
                                    "sec_per_iter": res["sec_per_iter"]})
                    exchange[c.key] = best
                    continue
                ratio = [t / bound for t in best]
                ratios.append(Ratio(
                    c.key, f"push+pull time ÷ |g|/B, W = S = {c.workers}, {c.rate_gbit:g} "
                           f"Gbit/s per host, {c.net}, {c.label}",
                    ratio, target=c.target, higher_is_better=False,
                    note=f"{res['tensors']} tensors in {keys} keys, "
                         f"{nbytes / 1e6:.2f} MB; bound {1e3 * bound:.1f} ms; link goodput "
                         f"{goodput[c.rate_gbit]:.3f} Gbit/s"))
                vs_goodput = [t / (8 * nbytes / (goodput[c.rate_gbit] * 1e9)) for t in best]
                rows.append([c.key, c.net, c.workers, f"{c.rate_gbit:g}",
                             f"{goodput[c.rate_gbit]:.3f}", keys,
                             f"{1e3 * bound:.1f}", mmm([1e3 * t for t in best], "{:.1f}"),
                             f"{median(ratio):.3f}", f"{median(vs_goodput):.3f}"])
                details.append({**c.__dict__, "bytes": nbytes, "bound_s": bound,
                                "goodput_gbit": goodput[c.rate_gbit], "keys": keys,
                                "sec_per_iter": res["sec_per_iter"]})
        finally:
            shape_links(tb, [f"h{i}" for i in range(1, n_hosts)], None)
            tb.down()
    for key, (own, co) in PLACEMENT.items():
        if own in exchange and co in exchange:  # BytePS's placement: 1 ÷ (2(n-1)/n) = 0.75
            ratios.append(Ratio(
                key, "mxlarge push+pull with 3 server hosts ÷ co-located (3 worker hosts), "
                     "0.2 Gbit/s per host, resnet50", [a / b for a, b in
                                                      zip(exchange[own], exchange[co])],
                higher_is_better=False,
                note="bytes per worker host each way |g| against 2(n-1)/n·|g| = 4/3·|g|"))
    md = md_table(["config", "net", "W = S", "tbf Gbit/s", "measured goodput Gbit/s", "keys",
                   "bound |g|/B ms", "push+pull ms (min / med / max)", "÷ bound (median)",
                   "÷ goodput bound (median)"], rows)
    md += ("\n\nServers on h1..hS, workers on h(S+1)..h(2S) (`floor_*`: server i and worker i "
           "on h(i+1), against bare equal keys sliced over every server in the same rounds), "
           "launcher and scheduler on h0; every host but h0 shaped in both directions. Time "
           f"per round = its best of {iters} iterations.")
    return BenchResult("cluster_link", ratios, {"configs": details,
                                                "started": time.time()}, md)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.cluster_link --prefix floor_``: only the configs whose key starts
    with the prefix (root; the testbed), results to ``--out``.json/.md with the commit."""
    import argparse

    from benchmarks.common import git_commit

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--prefix", default="floor_")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cluster/floor")
    a = p.parse_args(argv)
    global CONFIGS
    CONFIGS = tuple(c for c in CONFIGS if c.key.startswith(a.prefix))
    if not CONFIGS:
        raise SystemExit(f"--prefix {a.prefix!r}: no config of cluster_link starts with it")
    commit = git_commit()
    with open(a.out.with_suffix(".log"), "w") as log:
        res = run(a.reps, a.iters, log=log)
    a.out.with_suffix(".json").write_text(json.dumps(
        {"commit": commit, "ratios": [r.as_dict() for r in res.ratios],
         "details": res.details}, indent=1, default=str) + "\n")
    lines = [f"# cluster_link --prefix {a.prefix} (commit {commit}, {a.reps} rounds of "
             f"{a.iters} iterations)", "", res.markdown, ""]
    lines += [f"- `{r.key}`: median {r.median:.3f} (rounds "
              f"{', '.join(f'{v:.3f}' for v in r.values)}), target "
              f"{'—' if r.target is None else r.target} {r.status}: {r.title}"
              for r in res.ratios]
    a.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
