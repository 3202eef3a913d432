"""mxlarge side by side with the trainers a user would use instead, same net, same run.

Usage::

    make bench-peers                                   # loopback + accuracy twin
    .venv/bin/python -m benchmarks.peers --quick       # fewer rounds: a smoke run
    .venv/bin/python -m benchmarks.peers --part accuracy
    make bench-peers-cluster                           # every --part testbed run (root)

Peers (:data:`PEER_LINES`), each on the same net, synthetic data, per-worker
batch n and number of workers k:

* ``mxlarge``: ``mxlarge.Trainer(params, 'sgd', ...)`` on ``dist_sync`` (k workers, k servers);
* ``gluon_kv``: MXNet's ``gluon.Trainer(..., kvstore=dist_sync)``, ``update_on_kvstore`` at
  MXNet's default (True: the servers run the optimizer), as MXNet's 128-GPU benchmark ran;
* ``gluon``: the same with ``update_on_kvstore=False`` (servers sum, workers update);
* ``horovod``: Horovod-MXNet's ``hvd.DistributedTrainer`` (ring allreduce over gloo), started
  by ``horovodrun`` through :mod:`benchmarks.horovodrun_bound` (everything on 127.0.0.1);
* ``mxlarge_fp16``: ``mxlarge.Trainer(..., wire_dtype='float16')`` (the 16-bit wire: float16
  pushes, summed in float32 by the servers);
* ``horovod_fp16``: ``hvd.DistributedTrainer(..., compression=hvd.Compression.fp16)`` (float16
  allreduce: summed in float16 around the ring).

**Same math first.** Per net, a check-only mxlarge launch first writes mxlarge's weights after
S steps from identical weights on identical data; every timed launch (mxlarge's too) then
starts with the same S steps and compares: NumPy ``allclose`` with rtol 1e-5, atol 1e-6. A
peer that drifts ends its job before timing anything, and this program exits 1 naming the
peer, the net and max |Δw|. The 16-bit peers are checked against the closed form with the
float16 wire's error in the bound instead (benchmarks.peer_worker.wire16_error). Gluon's
documented
``step(n)`` on dist_sync is also run once per net with the check reporting instead of failing
(``--findings``): servers sum, so it applies k× the update (``update_ratio``).

**Ratios in one run.** Each peer needs its own launch (a second dist store in one process hangs,
horovodrun is another launcher), so every launch measures ``--blocks`` blocks of steps after a
warm-up, and the launches are repeated in rounds, the peer order reversed every other round
(A B C D, D C B A, ...). A peer's step time in a round is the median of its blocks (rank 0);
the ratio of a round is that ÷ mxlarge's of the same round; figures are min / median / max over
rounds. images/s = k·n ÷ step time. The targets (:data:`benchmarks.peers_jobs.TARGETS`) are
such ratios, peer ÷ base (mxlarge, or mxlarge_fp16 for the 16-bit wire's), median ≥ a bound.

Results: ``benchmarks/results/peers.json`` and ``peers.md`` (one section per part, each with the
commit it measured); the launched jobs' output goes to ``peers.log`` next to them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import BenchmarkError, md_table, median, mmm
from benchmarks.peers_jobs import (
    HOROVOD_PEERS,
    NETS,
    PEER_ORDER,
    TARGETS,
    PeerDrift,
    Target,
    horovod_available,
    loopback_launcher,
    run_timing,
    target_vs,
)

RESULTS = Path(__file__).resolve().parent / "results"
#: How each peer of benchmarks.peer_worker.make_trainer is built, for the report.
PEER_LINES = {
    "mxlarge": "`mxlarge.Trainer(params, 'sgd', opt, kvstore=kv, decay_bn_bias=True)`, `step(n)`",
    "gluon_kv": "`gluon.Trainer(params, 'sgd', opt, kvstore=kv)` (update_on_kvstore=True, "
                "MXNet's default on dist_sync), `step(k·n)`",
    "gluon": "`gluon.Trainer(..., update_on_kvstore=False)`, `step(k·n)`",
    "horovod": "`hvd.DistributedTrainer(params, 'sgd', opt)` after `hvd.broadcast_parameters`, "
               "`step(n)`",
    "mxlarge_fp16": "`mxlarge` with `wire_dtype='float16'` (float16 pushes summed in float32 "
                    "by the servers)",
    "horovod_fp16": "`horovod` with `compression=hvd.Compression.fp16` (float16 allreduce, "
                    "summed in float16 around the ring)",
}
def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def save(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)
    (path.with_suffix(".md")).write_text(render(data))


def _ratio_cell(r: Mapping[str, Any]) -> str:
    return f"{r['median']:.3f} ({r['min']:.2f}–{r['max']:.2f})"


def _same_cell(checks: Sequence[Mapping[str, Any]]) -> str:
    """The same-math column: how the peer's weights compare (module docstring)."""
    worst = max((c["max_abs"] for c in checks), default=None)
    if worst is None:
        return "—"
    if not all(c["agree"] for c in checks):
        return "NO"
    if any(c.get("wire16") for c in checks):
        ratio = max(f["worst_ratio"] for c in checks for f in c.get("formula", []))
        return (f"closed form within the float16-wire bound (worst {ratio:.2f} of it); "
                f"max abs(Δw) vs float32 mxlarge {worst:.1g}")
    return "yes, bitwise" if worst == 0 else f"yes, max abs(Δw) {worst:.1g}"


def render_targets(net: Mapping[str, Any]) -> list[str]:
    """The targets between two peers other than (peer, mxlarge), one row each."""
    def bound(t: Mapping[str, Any]) -> str:
        if t["target"] is None:
            return "—"
        return f"{'≥' if t['higher_is_better'] else '≤'} {t['target']:.3g}"

    rows = [[t["text"], f"`{t['peer']}` ÷ `{t['base']}`", bound(t),
             _ratio_cell(t), ", ".join(f"{v:.3f}" for v in t["values"]), t["status"]]
            for t in net.get("targets", []) if t["base"] != "mxlarge"]
    if not rows:
        return []
    return ["Targets between other peers, and mxlarge against its bound (step time ÷ step "
            "time, per round, the same rounds; the bound: the perfect-overlap bound with its "
            "update, below):",
            "", md_table(["target", "ratio", "bound", "median (min–max)", "per round",
                          "verdict"], rows), ""]


def render_timing(part: Mapping[str, Any], targets: Sequence[Target]) -> str:
    """One table per net; a peer's ratio PASSes when its median is ≥ its bound in
    ``targets`` (peers without one vs mxlarge are reported only)."""
    lines = []
    hosts = {peer: ",".join(row["hosts"]) for net in part["nets"].values()
             for peer, row in net["peers"].items()}
    lines += ["Hosts of ranks 0..k−1: " + "; ".join(f"`{p}` {h}" for p, h in hosts.items()), ""]
    bounds = {t.bound for t in targets if t.base == "mxlarge"}
    header = "step time ÷ mxlarge (median, min–max; target ≥ " + (
        f"{bounds.pop():.3g}" if len(bounds) == 1 else "its bound") + ")"
    for net in part["nets"].values():
        rows = []
        for peer, row in net["peers"].items():
            r, bound = row["ratio"], target_vs(targets, peer)
            status = "" if bound is None else \
                " PASS" if r["median"] >= bound else " **MISS**"
            rows.append([f"`{peer}`", mmm([1e3 * s for s in row["sec_per_step"]], "{:.1f}"),
                         f"{median(row['images_per_s']):.0f}",
                         "1" if peer == "mxlarge" else _ratio_cell(r) + status,
                         _same_cell(row["checks"])])
        measured = net.get("measured")
        lines += [f"**{net['title']}**, n = {net['batch']} per worker"
                  + (f" (measured at commit {measured['commit']}, {measured['date']}, load "
                     f"{measured['load_1min'][0]:.1f} / {measured['load_1min'][1]:.1f}; not "
                     "re-run with this part's commit)" if measured else ""), "",
                  md_table(["peer", "ms per step (min / median / max)", "images/s (median)",
                            header, "same weights as mxlarge"], rows), ""]
        lines += render_targets(net)
        split = [[f"`{peer}`", f"{1e3 * median(row['fwd_bwd']):.1f}",
                  f"{1e3 * median(row['comm_update']):.1f}"]
                 for peer, row in net["peers"].items() if row.get("fwd_bwd")]
        if split:
            lines += ["Where a step goes, serialised (`waitall` after backward; medians over "
                      "every launch's split steps):", "",
                      md_table(["peer", "forward+backward ms", "communication+update ms"],
                               split), ""]
        lines += floor_lines(net, targets)
        busy = [f"`{peer}` " + ", ".join(
                    f"{h} {median([r[h] for r in row['host_cores']]):.2f}"
                    for h in sorted(row["host_cores"][0]))
                + f"; machine {median(row['machine_busy']):.2f}"
                for peer, row in net["peers"].items() if row.get("machine_busy")]
        if busy:
            lines += ["Cores busy during the timed blocks (medians over rounds): each rank's "
                      "worker process (its host), then the whole machine (every process of the "
                      f"job, all hosts, of {part['versions']['cores_usable']} cores): "
                      + "; ".join(busy) + ".", ""]
        for f in net["findings"]:
            lines.append(f"- `{f['peer']}` with Gluon's `step(n)`: the first update is "
                         f"{f['update_ratio']:.3f}× mxlarge's, max abs(Δw) after {f['steps']} "
                         f"steps {f['max_abs']:.3g} (agrees: {f['agree']}).")
        if net["findings"]:
            lines.append("")
    return "\n".join(lines)


def floor_lines(net: Mapping[str, Any], targets: Sequence[Target]) -> list[str]:
    """The engine's exchange alone (peer_worker phase 3) next to the target it bounds: a step
    contains its exchange, so mxlarge's step time cannot go below the faster layout's median,
    and the target step time is the tightest of (peer's median ÷ bound) over ``targets`` on
    that mxlarge (``floor``: float32 wire, ``floor16``: the 16-bit wire's launches)."""
    out = []
    for key, base, what in (("floor", "mxlarge", "mxlarge's launches"),
                            ("floor16", "mxlarge_fp16", "mxlarge_fp16's launches, float16 "
                             "arrays summed in float32 by the servers")):
        floor = net.get(key) or {}
        goals = [(median(net["peers"][t.peer]["sec_per_step"]) / t.bound, t)
                 for t in targets if t.base == base and t.peer in net["peers"]]
        if not floor or not goals:
            continue
        goal, t = min(goals, key=lambda g: g[0])
        fastest = min(median(v) for v in floor.values())
        verdict = ("below the engine's exchange floor: no step that exchanges these floats "
                   "through these servers reaches it" if goal < fastest
                   else "above the engine's exchange floor")
        cells = ", ".join(f"{LAYOUTS[k]} {1e3 * median(v):.1f} ms" for k, v in floor.items())
        n = len(next(iter(floor.values())))
        out += [f"The engine's exchange alone, in {what} (bare `kv.pushpull` of the same "
                f"tensors on the same servers, nothing else; medians of {n} exchanges per "
                f"layout): {cells}. Target step time of `{base}` (`{t.peer}` ÷ {t.bound:.3g}): "
                f"{1e3 * goal:.1f} ms, {verdict}.", ""]
        if key == "floor" and net.get("overlap"):
            bound = median(net["overlap"])
            out += [f"The equal keys' exchange issued together with a forward+backward of the "
                    f"net (no array shared, each to `waitall`; median of "
                    f"{len(net['overlap'])}): {1e3 * bound:.1f} ms, a step that computes "
                    f"these gradients and exchanges them on these cores with nothing waiting "
                    f"for anything (perfect overlap, no update); target {1e3 * goal:.1f} ms "
                    + ("below it" if goal < bound else "above it") + ".", ""]
        if key == "floor" and net.get("overlap_update"):
            out += [f"The same with the trainer's update after the forward+backward (MXNet runs "
                    f"a CPU device's operations on one engine thread: the update overlaps the "
                    f"exchange, never the forward and backward; median of "
                    f"{len(net['overlap_update'])}): "
                    f"{1e3 * median(net['overlap_update']):.1f} ms, the perfect-overlap bound "
                    f"with its update.", ""]
    return out


#: Phase 3's layouts (benchmarks.peer_worker.exchange_floor), for the report.
LAYOUTS = {"per_tensor": "one key per tensor", "buckets": "one key per mxlarge bucket",
           "even": "equal keys sliced over every server"}


#: What the same-math check established about configuring each peer (rendered in peers.md).
FINDINGS = """\
- **Gluon's `step(n)` on dist_sync applies k× the update**, with `update_on_kvstore` True or
  False: servers sum the k workers' gradients and Gluon rescales by 1/n. Measured below as the
  first update's size ÷ mxlarge's (2.000 with k = 2). The timed configuration is `step(k·n)`
  (rescale 1/(k·n)), which agrees with mxlarge bit for bit.
- **`gluon.Trainer(..., update_on_kvstore=False)` needs its store initialised before the first
  forward**: Gluon initialises it lazily inside the first `step()`, where the initial weight
  pull races the first gradient push of the same key (a weight can come back as a gradient
  sum; docs/mxnet-facts.md). The benchmark calls `trainer._init_kvstore()`,
  `trainer._init_params()` and `mx.nd.waitall()` first; there is no public way.
  With `update_on_kvstore=True` the pull after the server's update makes the race harmless.
- **Horovod's `step(n)` is the global mean** (its allreduce averages over ranks): bitwise equal
  to mxlarge, as are both Gluon configurations with `step(k·n)`.
- **What cannot agree in general, and is kept out of the check**: the peers decay every tensor
  (mxlarge runs with `decay_bn_bias=True` here; with `update_on_kvstore=True` a `wd_mult = 0`
  would be lost on the servers anyway) and follow eq. (10) when the LR changes (no momentum
  correction): with the constant LR used here both forms are the same update. The accuracy twin
  runs the real recipe, where they differ.
"""


def render(data: Mapping[str, Any]) -> str:
    """peers.md from peers.json (every part that has been run)."""
    out = ["# mxlarge against its peers", "",
           "Made by `make bench-peers` (`python -m benchmarks.peers`; the testbed part by "
           "`make bench-peers-cluster`). Method, peers and the same-math check: "
           "`benchmarks/peers.py` and benchmarks/README.md. Peers: "
           + "; ".join(f"`{p}` = {PEER_LINES[p]}" for p in PEER_ORDER) + ".", "",
           "## Same math: findings", "", FINDINGS]
    testbeds = [(key, "Testbed: 3 hosts"
                 + (f" + {len(data[key]['server_hosts'])} server hosts "
                    f"({', '.join(data[key]['server_hosts'])})"
                    if data[key].get("server_hosts") else "")
                 + f", tc tbf {data[key].get('rate', '')} per host")
                for key in sorted(data, key=_rate_order) if key.startswith("testbed")]
    for key, title in (("loopback", "Loopback"), *testbeds, ("accuracy", "Accuracy twin")):
        part = data.get(key)
        if not part:
            continue
        v = part["versions"]
        out += [f"## {title}", "",
                f"Commit {part['commit']}, {v['date']}; mxnet {v['mxnet']}, horovod "
                f"{v['horovod']}, gluoncv {v['gluoncv']}, numpy {v['numpy']}, python "
                f"{v['python']}; {v['cores_usable']} cores ({v['cpu']})"
                + ("; 1-min load average at start / end {:.1f} / {:.1f} (the machine is shared "
                   "with other work)".format(*part["load_1min"]) if "load_1min" in part else "")
                + ".", "",
                part["setup"], ""]
        out.append(render_accuracy(part) if key == "accuracy" else
                   render_timing(part, TARGETS[key.split("-")[0]]))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def merge_part(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a timing part), followed by the nets of ``old`` it did not measure, each
    stamped with the commit, date and load it was measured at (``measured``): a run of some
    nets (``--nets``) replaces those nets only."""
    if not old:
        return new
    kept = {}
    for key, net in old.get("nets", {}).items():
        if key in new["nets"]:
            continue
        kept[key] = {**net, "measured": net.get("measured") or {
            "commit": old["commit"], "date": old["versions"]["date"],
            "load_1min": old.get("load_1min", [float("nan")] * 2)}}
    return {**new, "nets": {**new["nets"], **kept}}


def _rate_order(key: str) -> tuple[int, str]:
    """Testbed parts fastest link first (1gbit before 200mbit), co-located before server
    hosts (``testbed-RATE-servers``)."""
    rate = key.removesuffix("-servers")
    return (0 if rate.endswith("gbit") else 1, key)


def render_accuracy(part: Mapping[str, Any]) -> str:
    from benchmarks.peers_accuracy import render_table

    return render_table(part)


# ------------------------------------------------------------------------------------- main
def _peer_factors(items: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in items:
        peer, sep, value = item.partition("=")
        if not sep or peer not in PEER_ORDER:
            raise argparse.ArgumentTypeError(f"--lr-scale {item!r}: expected PEER=FACTOR with "
                                             f"PEER one of {', '.join(PEER_ORDER)}")
        out[peer] = float(value)
    return out


def _names(text: str, valid: Sequence[str], what: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{what} {text!r}: expected a comma-separated subset "
                                         f"of {', '.join(valid)}")
    return names


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--part", action="append", choices=("loopback", "accuracy", "testbed"),
                   help="what to run (repeatable; default: loopback and accuracy)")
    p.add_argument("--nets", type=lambda t: _names(t, list(NETS), "--nets"),
                   default=list(NETS))
    p.add_argument("--peers", type=lambda t: _names(t, PEER_ORDER, "--peers"),
                   default=list(PEER_ORDER))
    p.add_argument("--workers", type=int, default=2,
                   help="loopback part: workers (3 or more: the summation order differs "
                        "between peers, and the closed-form check decides)")
    p.add_argument("--rate", action="append", default=None,
                   help="testbed part: tc tbf rate per host link (repeatable; default "
                        "1gbit and 200mbit)")
    p.add_argument("--server-hosts", type=int, default=0, metavar="N",
                   help="testbed part: the dist_sync peers' 3 servers on N hosts of their own "
                        "(h3...), Horovod on the same 3 worker hosts (part testbed-RATE-servers)")
    p.add_argument("--rounds", type=int, default=None, help="launch rounds (default 3)")
    p.add_argument("--blocks", type=int, default=None, help="timed blocks per launch (3)")
    p.add_argument("--check-steps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 rounds, 2 short blocks, 1 seed")
    p.add_argument("--findings", action=argparse.BooleanOptionalAction, default=True,
                   help="also check Gluon's step(n) once per net (reported, not failed)")
    p.add_argument("--lr-scale", action="append", default=[], metavar="PEER=FACTOR",
                   help="multiply one peer's LR: makes its same-math check fail on purpose")
    p.add_argument("--out", type=Path, default=RESULTS / "peers.json")
    p.add_argument("--render", action="store_true",
                   help="only rewrite peers.md from peers.json (no measurement)")
    a = p.parse_args(argv)
    try:
        a.lr_scale = _peer_factors(a.lr_scale)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    if "mxlarge" not in a.peers:
        p.error("--peers must include mxlarge: its weights are the same-math reference and "
                "its step time the denominator")
    if a.workers < 2:
        p.error(f"--workers {a.workers}: expected an integer >= 2")
    if not 0 <= a.server_hosts <= 3:
        p.error(f"--server-hosts {a.server_hosts}: expected 0..3 (3 servers, each server host "
                "runs at least one)")
    for name in ("rounds", "blocks", "check_steps"):
        value = getattr(a, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value}: expected an integer >= 1")
    a.part = a.part or ["loopback", "accuracy"]
    from benchmarks.peers_testbed import RATES

    a.rate = a.rate or list(RATES)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.render:
        if not a.out.exists():
            print(f"peers: error: {a.out} does not exist: nothing to render", file=sys.stderr)
            return 2
        save(a.out, load(a.out))
        return 0
    if set(a.peers) & set(HOROVOD_PEERS) and set(a.part) & {"loopback", "testbed"} \
            and not horovod_available():
        print("peers: error: horovod is not installed in this venv: `make bench-peers` builds "
              "it (setup.cfg extra `peers`), or pass --peers without horovod", file=sys.stderr)
        return 2
    if "testbed" in a.part and os.geteuid() != 0:
        print("peers: error: the testbed part needs root (network namespaces, tc); run "
              "`make bench-peers-cluster` as root", file=sys.stderr)
        return 2
    data = load(a.out)
    t0 = time.monotonic()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out.with_suffix(".log"), "w") as log:
        try:
            if "loopback" in a.part:
                k = a.workers
                print(f"peers: loopback, {k} workers", flush=True)
                data["loopback"] = merge_part(data.get("loopback"), run_timing(
                    a, loopback_launcher(k), k, log,
                    f"{k} workers on 127.0.0.1 (dist_sync peers: {k} servers and a scheduler "
                    f"too; horovod: {k} ranks), OMP_NUM_THREADS=1 per process; SGD η 0.1, "
                    "m 0.9, λ 1e-4 on every tensor, constant η.", TARGETS["loopback"]))
                save(a.out, data)
            if "testbed" in a.part:
                from benchmarks.peers_testbed import run_testbed

                data.pop("testbed", None)  # one part per rate since the 200 Mbit/s rows
                for rate, part in run_testbed(a, log).items():
                    key = f"testbed-{rate}" + ("-servers" if a.server_hosts else "")
                    data[key] = merge_part(data.get(key), part)
                    save(a.out, data)
            if "accuracy" in a.part:
                from benchmarks.peers_accuracy import run_accuracy

                data["accuracy"] = run_accuracy(a, log)
                save(a.out, data)
        except PeerDrift as e:
            print(f"peers: same-math check failed: {e}", file=sys.stderr)
            return 1
        except BenchmarkError as e:
            print(f"peers: error: {e}", file=sys.stderr)
            return 1
    print(f"peers: wrote {a.out.with_suffix('.md')} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
