"""mxlarge side by side with the trainers a user would use instead, same net, same run.

Usage::

    make bench-peers                                   # loopback + accuracy twin
    .venv/bin/python -m benchmarks.peers --quick       # fewer rounds: a smoke run
    .venv/bin/python -m benchmarks.peers --part accuracy
    make bench-peers-cluster                           # = --part testbed (root)

Peers (:data:`PEER_LINES`), each on the same net, synthetic data, per-worker
batch n and number of workers k:

* ``mxlarge``: ``mxlarge.Trainer(params, 'sgd', ...)`` on ``dist_sync`` (k workers, k servers);
* ``gluon_kv``: MXNet's ``gluon.Trainer(..., kvstore=dist_sync)``, ``update_on_kvstore`` at
  MXNet's default (True: the servers run the optimizer), as MXNet's 128-GPU benchmark ran;
* ``gluon``: the same with ``update_on_kvstore=False`` (servers sum, workers update);
* ``horovod``: Horovod-MXNet's ``hvd.DistributedTrainer`` (ring allreduce over gloo), started
  by ``horovodrun`` through :mod:`benchmarks.horovodrun_bound` (everything on 127.0.0.1).

**Same math first.** Per net, a check-only mxlarge launch first writes mxlarge's weights after
S steps from identical weights on identical data; every timed launch (mxlarge's too) then
starts with the same S steps and compares: NumPy ``allclose`` with rtol 1e-5, atol 1e-6. A
peer that drifts ends its job before timing anything, and this program exits 1 naming the
peer, the net and max |Δw|. Gluon's documented
``step(n)`` on dist_sync is also run once per net with the check reporting instead of failing
(``--findings``): servers sum, so it applies k× the update (``update_ratio``).

**Ratios in one run.** Each peer needs its own launch (a second dist store in one process hangs,
horovodrun is another launcher), so every launch measures ``--blocks`` blocks of steps after a
warm-up, and the launches are repeated in rounds, the peer order reversed every other round
(A B C D, D C B A, ...). A peer's step time in a round is the median of its blocks (rank 0);
the ratio of a round is that ÷ mxlarge's of the same round; figures are min / median / max over
rounds. images/s = k·n ÷ step time.

Results: ``benchmarks/results/peers.json`` and ``peers.md`` (one section per part, each with the
commit it measured); the launched jobs' output goes to ``peers.log`` next to them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.common import (
    ROOT,
    BenchmarkError,
    JobOutput,
    Ratio,
    git_commit,
    machine_info,
    md_table,
    median,
    mmm,
    ratios_of,
)

RESULTS = Path(__file__).resolve().parent / "results"
PEER_ORDER = ("mxlarge", "gluon_kv", "gluon", "horovod")
DRIFT_MARK = "PEERS_DRIFT "  # benchmarks.peer_worker.DRIFT_MARK (that module imports mxnet)
#: The issue's targets as a bound on every peer's step time ÷ mxlarge's (median): on loopback
#: mxlarge no slower than any peer; on the testbed at most 1.05× the best peer.
TARGETS = {"loopback": 1.0, "testbed": 1 / 1.05}
#: How each peer of benchmarks.peer_worker.make_trainer is built, for the report.
PEER_LINES = {
    "mxlarge": "`mxlarge.Trainer(params, 'sgd', opt, kvstore=kv, decay_bn_bias=True)`, `step(n)`",
    "gluon_kv": "`gluon.Trainer(params, 'sgd', opt, kvstore=kv)` (update_on_kvstore=True, "
                "MXNet's default on dist_sync), `step(k·n)`",
    "gluon": "`gluon.Trainer(..., update_on_kvstore=False)`, `step(k·n)`",
    "horovod": "`hvd.DistributedTrainer(params, 'sgd', opt)` after `hvd.broadcast_parameters`, "
               "`step(n)`",
}
WORKER = "benchmarks.peer_worker"
JOB_ENV = {"OMP_NUM_THREADS": "1"}


@dataclass(frozen=True)
class NetSpec:
    """A net of the benchmark and the worker arguments that build it."""

    key: str
    title: str
    args: tuple[str, ...]
    batch: int
    steps: int  # steps per timed block

    def worker_args(self) -> list[str]:
        return [*self.args, "--batch", str(self.batch)]


NETS = {
    "demo": NetSpec("demo", "demo net: small_resnet width 16, digits shape 1×8×8",
                    ("--net", "small_resnet", "--channels", "1", "--size", "8"), 128, 10),
    "resnet20": NetSpec("resnet20", "cifar_resnet20_v1, 3×32×32",
                        ("--net", "cifar_resnet20_v1",), 32, 6),
    "resnet50": NetSpec("resnet50", "resnet50_v1b at 3×32×32, 1000 classes: ResNet-50's 161 "
                        "tensors, 25.6 M floats", ("--net", "resnet50_v1b", "--classes", "1000"),
                        8, 3),
}


class PeerDrift(BenchmarkError):
    """A peer's weights after the check steps differ from mxlarge's beyond float rounding."""


class PeerOutput(JobOutput):
    """:class:`JobOutput` that also collects the workers' ``PEERS_DRIFT`` lines."""

    def __init__(self, log: IO[str] | None):
        super().__init__(log)
        self.drifts: list[dict[str, Any]] = []

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if DRIFT_MARK in line:
                self.drifts.append(json.loads(line.split(DRIFT_MARK, 1)[1]))
        return super().write(text)


def drift_message(d: Mapping[str, Any]) -> str:
    return (f"{d['peer']} on {d['net']} drifts from mxlarge after {d['steps']} steps: "
            f"max |Δw| = {d['max_abs']:.3g} (tensor {d['tensor']}; tolerance "
            f"atol {d['atol']:g} + rtol {d['rtol']:g}·|w|), first update "
            f"{d['update_ratio']:.4g}× mxlarge's")


def job_env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONWARNINGS": "ignore", **JOB_ENV}


# ------------------------------------------------------------------------------------- launching
Launcher = Callable[[str, list[str], PeerOutput], None]  # (peer, worker args, sink) -> runs job


def loopback_launcher(workers: int, module: str = WORKER) -> Launcher:
    """Runs a peer's job of worker script ``module`` on 127.0.0.1: dist_sync peers through
    ``run_local`` (k workers, k servers), Horovod through ``horovodrun``
    (:mod:`benchmarks.horovodrun_bound`)."""

    def run(peer: str, args: list[str], out: PeerOutput) -> None:
        argv = [sys.executable, "-m", module, "--peer", peer, *args]
        if peer == "horovod":
            cmd = [sys.executable, "-m", "benchmarks.horovodrun_bound", "-np", str(workers),
                   "-H", f"localhost:{workers}", "--gloo", "--network-interface", "lo", "--",
                   *argv]
            code = stream(cmd, {**os.environ, **job_env()}, out)
            message = f"horovodrun exited {code}"
        else:
            from mxlarge.launcher import run_local

            outcome = run_local(argv, workers=workers, servers=workers, env=job_env(),
                                output=out)
            code, message = outcome.exit_code, outcome.message
        out.flush()
        check_job(peer, workers, code, message, out)

    return run


def stream(cmd: Sequence[str], env: Mapping[str, str], out: IO[str] | JobOutput,
           cwd: str | None = None) -> int:
    """Runs ``cmd`` with its stdout and stderr written line by line to ``out``; its exit code."""
    with subprocess.Popen(list(cmd), env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=cwd) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
        return proc.wait()


def check_job(peer: str, workers: int, code: int, message: str, out: PeerOutput) -> None:
    if out.drifts:
        raise PeerDrift(drift_message(out.drifts[0]))
    if code != 0 or len(out.results) != workers:
        tail = "\n".join(out.tail[-15:])
        raise BenchmarkError(f"{peer} job with {workers} workers: {message}; "
                             f"{len(out.results)} result(s)\n{tail}")


# ------------------------------------------------------------------------------------- measuring
@dataclass
class NetRun:
    """Everything measured for one net: per peer, one entry per round (rank 0's)."""

    spec: NetSpec
    sec: dict[str, list[float]] = field(default_factory=dict)    # median block, per round
    blocks: dict[str, list[list[float]]] = field(default_factory=dict)
    cores: dict[str, list[float]] = field(default_factory=dict)
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    hosts: dict[str, list[str]] = field(default_factory=dict)  # of ranks 0.., first round
    fwd_bwd: dict[str, list[float]] = field(default_factory=dict)      # split steps, rank 0
    comm_update: dict[str, list[float]] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)


def measure(nets: Sequence[NetSpec], peers: Sequence[str], launcher: Launcher, *,
            rounds: int, blocks: int, steps_scale: float, check_steps: int,
            lr_scale: Mapping[str, float], findings: bool, workdir: Path,
            log: IO[str] | None) -> list[NetRun]:
    """Runs the reference launches, then the rounds (module docstring); what each net measured.

    Per net, first a check-only mxlarge launch writes the reference weights (it also takes the
    slow first launch of a run, which would otherwise penalise whichever peer comes first),
    then the step(n) findings; then every timed launch checks against the reference.

    Raises:
        PeerDrift: a peer failed the same-math check (its job ended before timing).
        BenchmarkError: a job failed.
    """
    runs = [NetRun(spec) for spec in nets]
    check = ["--check-steps", str(check_steps)]
    for run in runs:
        spec = run.spec
        ref = workdir / f"{spec.key}-mxlarge.npz"
        _note(log, f"reference {spec.key} mxlarge")
        launcher("mxlarge", [*spec.worker_args(), *check, "--blocks", "0", "--save", str(ref)],
                 PeerOutput(log))
        if findings:
            run.findings = naive_findings(spec, peers, launcher, check, ref, log)
    for r in range(rounds):
        for run in runs:
            spec = run.spec
            ref = workdir / f"{spec.key}-mxlarge.npz"
            for peer in (peers if r % 2 == 0 else peers[::-1]):
                steps = max(1, round(spec.steps * steps_scale))
                out = PeerOutput(log)
                _note(log, f"round {r + 1}/{rounds} {spec.key} {peer}")
                launcher(peer, [*spec.worker_args(), *check, "--blocks", str(blocks),
                                "--steps", str(steps), "--split-steps", str(steps),
                                "--reference", str(ref),
                                "--lr-scale", str(lr_scale.get(peer, 1.0))], out)
                res = out.results[0]
                run.hosts.setdefault(peer, [x["host"] for x in out.results])
                run.sec.setdefault(peer, []).append(median(res["sec_per_step"]))
                run.blocks.setdefault(peer, []).append(res["sec_per_step"])
                run.cores.setdefault(peer, []).append(median(res["cores_busy"]))
                run.checks.setdefault(peer, []).append(res["check"])
                run.fwd_bwd.setdefault(peer, []).extend(res["fwd_bwd"])
                run.comm_update.setdefault(peer, []).extend(res["comm_update"])
                print(f"  {spec.key:9s} {peer:9s} round {r + 1}: "
                      f"{1e3 * run.sec[peer][-1]:8.1f} ms/step", flush=True)
    return runs


def naive_findings(spec: NetSpec, peers: Sequence[str], launcher: Launcher, check: list[str],
                   ref: Path, log: IO[str] | None) -> list[dict[str, Any]]:
    """Gluon's documented ``step(n)`` on dist_sync, checked against mxlarge (reported)."""
    found = []
    for peer in (p for p in ("gluon_kv", "gluon") if p in peers):
        out = PeerOutput(log)
        _note(log, f"finding {spec.key} {peer} step(n)")
        launcher(peer, [*spec.worker_args(), *check, "--naive", "--expect-drift",
                        "--reference", str(ref)], out)
        found.append(out.results[0]["check"])
    return found


def _note(log: IO[str] | None, text: str) -> None:
    if log is not None:
        log.write(f"=== {text}\n")
        log.flush()


def summarise(runs: Sequence[NetRun], peers: Sequence[str], workers: int,
              target: float) -> dict[str, Any]:
    """Per net: each peer's step time ÷ mxlarge's per round (a :class:`Ratio` whose median
    should be ≥ ``target``), images/s."""
    out: dict[str, Any] = {}
    for run in runs:
        spec, base = run.spec, run.sec["mxlarge"]
        rows = {}
        for peer in peers:
            ratio = Ratio(f"peers_{spec.key}_{peer}", f"{peer} step time ÷ mxlarge's, "
                          f"{spec.key}", ratios_of(run.sec[peer], base), target=target)
            rows[peer] = {"sec_per_step": run.sec[peer], "blocks": run.blocks[peer],
                          "images_per_s": [workers * spec.batch / s for s in run.sec[peer]],
                          "cores_busy": run.cores[peer], "ratio": ratio.as_dict(),
                          "hosts": run.hosts[peer], "fwd_bwd": run.fwd_bwd[peer],
                          "comm_update": run.comm_update[peer],
                          "checks": run.checks.get(peer, [])}
        out[spec.key] = {"title": spec.title, "batch": spec.batch, "peers": rows,
                         "findings": run.findings}
    return out


# ------------------------------------------------------------------------------------- results
def versions() -> dict[str, Any]:
    from importlib import metadata

    info = machine_info()
    try:
        info["horovod"] = metadata.version("horovod")
    except metadata.PackageNotFoundError:
        info["horovod"] = None
    return info


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


def render_timing(part: Mapping[str, Any], target: float) -> str:
    """One table per net; a peer's ratio PASSes when its median is ≥ ``target``."""
    lines = []
    hosts = {peer: ",".join(row["hosts"]) for net in part["nets"].values()
             for peer, row in net["peers"].items()}
    lines += ["Hosts of ranks 0..k−1: " + "; ".join(f"`{p}` {h}" for p, h in hosts.items()), ""]
    for net in part["nets"].values():
        rows = []
        for peer, row in net["peers"].items():
            checks = row["checks"]
            worst = max((c["max_abs"] for c in checks), default=None)
            same = ("—" if worst is None else "NO" if not all(c["agree"] for c in checks) else
                    "yes, bitwise" if worst == 0 else f"yes, max abs(Δw) {worst:.1g}")
            r = row["ratio"]
            status = "" if peer == "mxlarge" else \
                " PASS" if r["median"] >= target else " **MISS**"
            rows.append([f"`{peer}`", mmm([1e3 * s for s in row["sec_per_step"]], "{:.1f}"),
                         f"{median(row['images_per_s']):.0f}",
                         "1" if peer == "mxlarge" else _ratio_cell(r) + status, same])
        lines += [f"**{net['title']}**, n = {net['batch']} per worker", "",
                  md_table(["peer", "ms per step (min / median / max)", "images/s (median)",
                            f"step time ÷ mxlarge (median, min–max; target ≥ {target:.3g})",
                            "same weights as mxlarge"], rows), ""]
        split = [[f"`{peer}`", f"{1e3 * median(row['fwd_bwd']):.1f}",
                  f"{1e3 * median(row['comm_update']):.1f}"]
                 for peer, row in net["peers"].items() if row.get("fwd_bwd")]
        if split:
            lines += ["Where a step goes, serialised (`waitall` after backward; medians over "
                      "every launch's split steps):", "",
                      md_table(["peer", "forward+backward ms", "communication+update ms"],
                               split), ""]
        for f in net["findings"]:
            lines.append(f"- `{f['peer']}` with Gluon's `step(n)`: the first update is "
                         f"{f['update_ratio']:.3f}× mxlarge's, max abs(Δw) after {f['steps']} "
                         f"steps {f['max_abs']:.3g} (agrees: {f['agree']}).")
        if net["findings"]:
            lines.append("")
    return "\n".join(lines)


#: What the same-math check established about configuring each peer (rendered in peers.md).
FINDINGS = """\
- **Gluon's `step(n)` on dist_sync applies k× the update**, with `update_on_kvstore` True or
  False: servers sum the k workers' gradients and Gluon rescales by 1/n. Measured below as the
  first update's size ÷ mxlarge's (2.000 with k = 2). The timed configuration is `step(k·n)`
  (rescale 1/(k·n)), which agrees with mxlarge bit for bit.
- **`gluon.Trainer(..., update_on_kvstore=False)` needs its store initialised before the first
  forward**: Gluon initialises it lazily inside the first `step()`, where the initial weight
  pull races the first gradient push of the same key (a weight can come back as a gradient
  sum; README, MXNet facts). The benchmark calls `trainer._init_kvstore()`,
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
    for key, title in (("loopback", "Loopback, 2 workers"),
                       ("testbed", "Testbed: 3 hosts, tc tbf per host"),
                       ("accuracy", "Accuracy twin")):
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
                   render_timing(part, TARGETS[key]))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


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
    for name in ("rounds", "blocks", "check_steps"):
        value = getattr(a, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} {value}: expected an integer >= 1")
    a.part = a.part or ["loopback", "accuracy"]
    return a


def horovod_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


def run_timing(a: argparse.Namespace, launcher: Launcher, workers: int, log: IO[str],
               setup: str, target: float, tmpdir: Path | None = None) -> dict[str, Any]:
    """The timing rounds of ``a``'s nets and peers; the part of peers.json.

    ``tmpdir`` holds mxlarge's reference weights (every worker must see it: on the testbed a
    directory on the shared file system); a temporary directory by default.
    """
    commit, load = git_commit(), [os.getloadavg()[0]]
    rounds = a.rounds or (2 if a.quick else 3)
    blocks = a.blocks or (2 if a.quick else 3)
    with contextlib.ExitStack() as stack:
        workdir = tmpdir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="mxlarge-peers-")))
        runs = measure([NETS[n] for n in a.nets], a.peers, launcher, rounds=rounds,
                       blocks=blocks, steps_scale=0.5 if a.quick else 1.0,
                       check_steps=a.check_steps, lr_scale=a.lr_scale, findings=a.findings,
                       workdir=workdir, log=log)
    method = (f"per net a check-only mxlarge launch (the reference weights), then {rounds} "
              f"rounds of one launch per peer (order reversed every other round); per launch "
              f"{a.check_steps} same-math steps, 2 warm-up steps, {blocks} timed blocks; a "
              f"round's figure is the median block of rank 0")
    load.append(os.getloadavg()[0])
    return {"commit": commit, "versions": versions(), "workers": workers, "load_1min": load,
            "setup": f"{setup} Method: {method}.",
            "nets": summarise(runs, a.peers, workers, target)}


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.render:
        if not a.out.exists():
            print(f"peers: error: {a.out} does not exist: nothing to render", file=sys.stderr)
            return 2
        save(a.out, load(a.out))
        return 0
    if "horovod" in a.peers and set(a.part) & {"loopback", "testbed"} \
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
                print("peers: loopback, 2 workers", flush=True)
                data["loopback"] = run_timing(
                    a, loopback_launcher(2), 2, log,
                    "2 workers on 127.0.0.1 (dist_sync peers: 2 servers and a scheduler "
                    "too; horovod: 2 ranks), OMP_NUM_THREADS=1 per process; SGD η 0.1, "
                    "m 0.9, λ 1e-4 on every tensor, constant η.", TARGETS["loopback"])
                save(a.out, data)
            if "testbed" in a.part:
                from benchmarks.peers_testbed import run_testbed

                data["testbed"] = run_testbed(a, log)
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
