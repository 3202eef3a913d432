"""The launching and measuring half of the peers benchmark; :mod:`benchmarks.peers` is the command
line and the report (method: that module's docstring).

A :data:`Launcher` runs one peer's job of :mod:`benchmarks.peer_worker` (or another worker
module) and collects its ``BENCH_RESULT`` and ``PEERS_DRIFT`` lines; :func:`measure` runs the
reference launches and the rounds; :func:`run_timing` is one part of peers.json. The testbed
(:mod:`benchmarks.peers_testbed`), the accuracy twin (:mod:`benchmarks.peers_accuracy`) and the
profile (:mod:`benchmarks.peers_profile`) build on these, and nothing here imports them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
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
    median,
    ratios_of,
)

PEER_ORDER = ("mxlarge", "gluon_kv", "gluon", "horovod", "mxlarge_fp16", "horovod_fp16")
#: The peers whose gradients travel in float32 (each is timed against mxlarge's float32 wire).
FLOAT32_PEERS = ("gluon_kv", "gluon", "horovod")
#: The peers started by horovodrun (benchmarks.peer_worker.make_trainer).
HOROVOD_PEERS = ("horovod", "horovod_fp16")
DRIFT_MARK = "PEERS_DRIFT "  # benchmarks.peer_worker.DRIFT_MARK (that module imports mxnet)


@dataclass(frozen=True)
class Target:
    """One of the issues' targets: ``peer``'s step time ÷ ``base``'s (per round, as every row
    of the report), whose median over rounds must be ≥ ``bound``."""

    peer: str
    base: str
    bound: float
    text: str


#: On loopback mxlarge no slower than any peer; on the testbed at most 0.95× every float32
#: peer's step time, and with the 16-bit wire at most 1.00× Horovod's
#: ``Compression.fp16`` (the same bytes) and at most 0.6× Horovod in float32.
TARGETS = {
    "loopback": tuple(Target(p, "mxlarge", 1.0, "mxlarge no slower") for p in FLOAT32_PEERS),
    "testbed": (*(Target(p, "mxlarge", 1 / 0.95, "mxlarge ≤ 0.95×") for p in FLOAT32_PEERS),
                Target("horovod_fp16", "mxlarge_fp16", 1.0,
                       "mxlarge 16-bit wire ≤ 1.00× Horovod Compression.fp16 (same bytes)"),
                Target("horovod", "mxlarge_fp16", 1 / 0.6,
                       "mxlarge 16-bit wire ≤ 0.6× Horovod float32")),
}


def target_vs(targets: Sequence[Target], peer: str, base: str = "mxlarge") -> float | None:
    """The bound on ``peer`` ÷ ``base`` among ``targets``, or None (reported only)."""
    return next((t.bound for t in targets if t.peer == peer and t.base == base), None)
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
    """One line: the elementwise drift from mxlarge's weights (2 ranks), then the closed-form
    check's verdict when it failed (the criterion with 3+ ranks)."""
    parts = []
    if d.get("ranks", 2) < 3 and not d.get("wire16") and d.get("elementwise") is False:
        parts.append(f"drifts from mxlarge after {d['steps']} steps: max |Δw| = "
                     f"{d['max_abs']:.3g} (tensor {d['tensor']}; tolerance atol {d['atol']:g} "
                     f"+ rtol {d['rtol']:g}·|w|), first update {d['update_ratio']:.4g}× "
                     "mxlarge's")
    if d.get("formula_ok") is False:
        bad = next(f for f in d["formula"] if not f["ok"])
        kind = f"float16-wire ({d['wire16']})" if d.get("wire16") else "float32"
        parts.append(f"breaks eq. (10) at step {bad['step']}: an element of tensor "
                     f"{bad['tensor']} is {bad['worst_ratio']:.3g}× its {kind} bound away from "
                     "the closed form (benchmarks.peer_worker.update_bound)")
    return f"{d['peer']} on {d['net']} " + "; and ".join(parts)


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
        if peer in HOROVOD_PEERS:
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
    host_cores: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # per round
    machine: dict[str, list[float]] = field(default_factory=dict)  # cores busy, whole machine
    checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    hosts: dict[str, list[str]] = field(default_factory=dict)  # of ranks 0.., first round
    fwd_bwd: dict[str, list[float]] = field(default_factory=dict)      # split steps, rank 0
    comm_update: dict[str, list[float]] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    floor: dict[str, list[float]] = field(default_factory=dict)  # layout → exchanges, rank 0
    floor16: dict[str, list[float]] = field(default_factory=dict)  # the same, float16 wire
    overlap: list[float] = field(default_factory=list)  # float32 floor with fwd+bwd alongside
    # the same with the update after fwd+bwd: every exchange, and each round's median
    overlap_update: list[float] = field(default_factory=list)
    bound: list[float] = field(default_factory=list)
    lead: list[float | None] = field(default_factory=list)  # mxlarge.kvstore.order, per round


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
                floor = ["--floor-steps", str(steps)] if peer in FLOORS else []
                launcher(peer, [*spec.worker_args(), *check, "--blocks", str(blocks),
                                "--steps", str(steps), "--split-steps", str(steps),
                                "--reference", str(ref), *floor,
                                "--lr-scale", str(lr_scale.get(peer, 1.0))], out)
                res = rank0(out.results)
                run.hosts.setdefault(peer, [x["host"] for x in sorted(
                    out.results, key=lambda x: x["rank"])])
                run.sec.setdefault(peer, []).append(median(res["sec_per_step"]))
                run.blocks.setdefault(peer, []).append(res["sec_per_step"])
                run.cores.setdefault(peer, []).append(median(res["cores_busy"]))
                run.host_cores.setdefault(peer, []).append(
                    {f"rank {x['rank']} on {x['host']}": median(x["cores_busy"])
                     for x in out.results})
                run.machine.setdefault(peer, []).append(median(res["machine_busy"]))
                run.checks.setdefault(peer, []).append(res["check"])
                run.fwd_bwd.setdefault(peer, []).extend(res["fwd_bwd"])
                run.comm_update.setdefault(peer, []).extend(res["comm_update"])
                for layout, secs in res.get("floor", {}).items():
                    getattr(run, FLOORS[peer]).setdefault(layout, []).extend(secs)
                if peer == "mxlarge":
                    run.overlap.extend(res.get("overlap", []))
                    if res.get("overlap_update"):
                        run.overlap_update.extend(res["overlap_update"])
                        run.bound.append(median(res["overlap_update"]))
                    run.lead.append(res.get("lead"))
                print(f"  {spec.key:9s} {peer:9s} round {r + 1}: "
                      f"{1e3 * run.sec[peer][-1]:8.1f} ms/step", flush=True)
    return runs


#: mxlarge's step ÷ the perfect-overlap bound with its update, at most, per net;
#: the other nets' are reported.
BOUND = {"resnet50": 1.05}


#: The peers whose launches also time the engine's exchange alone (peer_worker phase 3, in the
#: wire's type), and the NetRun field it goes to.
FLOORS = {"mxlarge": "floor", "mxlarge_fp16": "floor16"}


def rank0(results: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """Rank 0's result line (the lines arrive in any order)."""
    return next(r for r in results if r["rank"] == 0)


def naive_findings(spec: NetSpec, peers: Sequence[str], launcher: Launcher, check: list[str],
                   ref: Path, log: IO[str] | None) -> list[dict[str, Any]]:
    """Gluon's documented ``step(n)`` on dist_sync, checked against mxlarge (reported)."""
    found = []
    for peer in (p for p in ("gluon_kv", "gluon") if p in peers):
        out = PeerOutput(log)
        _note(log, f"finding {spec.key} {peer} step(n)")
        launcher(peer, [*spec.worker_args(), *check, "--naive", "--expect-drift",
                        "--reference", str(ref)], out)
        found.append(rank0(out.results)["check"])
    return found


def _note(log: IO[str] | None, text: str) -> None:
    if log is not None:
        log.write(f"=== {text}\n")
        log.flush()


def summarise(runs: Sequence[NetRun], peers: Sequence[str], workers: int,
              targets: Sequence[Target]) -> dict[str, Any]:
    """Per net: each peer's step time ÷ mxlarge's per round (a :class:`Ratio`, with the bound
    of ``targets`` on it if there is one), images/s; and every target of ``targets`` whose two
    peers ran (``targets``: its ratio per round)."""
    out: dict[str, Any] = {}
    for run in runs:
        spec, base = run.spec, run.sec["mxlarge"]
        rows = {}
        for peer in peers:
            ratio = Ratio(f"peers_{spec.key}_{peer}", f"{peer} step time ÷ mxlarge's, "
                          f"{spec.key}", ratios_of(run.sec[peer], base),
                          target=target_vs(targets, peer))
            rows[peer] = {"sec_per_step": run.sec[peer], "blocks": run.blocks[peer],
                          "images_per_s": [workers * spec.batch / s for s in run.sec[peer]],
                          "cores_busy": run.cores[peer], "host_cores": run.host_cores[peer],
                          "machine_busy": run.machine[peer], "ratio": ratio.as_dict(),
                          "hosts": run.hosts[peer], "fwd_bwd": run.fwd_bwd[peer],
                          "comm_update": run.comm_update[peer],
                          "checks": run.checks.get(peer, [])}
        met = [{"peer": t.peer, "base": t.base, "text": t.text,
                **Ratio(f"peers_{spec.key}_{t.peer}_vs_{t.base}", f"{t.peer} step time ÷ "
                        f"{t.base}'s, {spec.key}", ratios_of(run.sec[t.peer], run.sec[t.base]),
                        target=t.bound).as_dict()}
               for t in targets if t.peer in run.sec and t.base in run.sec]
        if len(run.bound) == len(base):
            met.append({"peer": "mxlarge", "base": "bound", "text": "mxlarge ≤ 1.05× bound",
                        **Ratio(f"peers_{spec.key}_bound", f"mxlarge step time ÷ the "
                                f"perfect-overlap bound with its update, {spec.key}",
                                ratios_of(base, run.bound),
                                target=BOUND.get(spec.key), higher_is_better=False).as_dict()})
        out[spec.key] = {"title": spec.title, "batch": spec.batch, "peers": rows,
                         "findings": run.findings, "floor": run.floor, "floor16": run.floor16,
                         "overlap": run.overlap, "overlap_update": run.overlap_update,
                         "bound": run.bound,
                         "lead": run.lead,
                         "targets": met}
    return out


def versions() -> dict[str, Any]:
    from importlib import metadata

    info = machine_info()
    try:
        info["horovod"] = metadata.version("horovod")
    except metadata.PackageNotFoundError:
        info["horovod"] = None
    return info


def horovod_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


def run_timing(a: argparse.Namespace, launcher: Launcher, workers: int, log: IO[str],
               setup: str, targets: Sequence[Target],
               tmpdir: Path | None = None) -> dict[str, Any]:
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
            "nets": summarise(runs, a.peers, workers, targets)}
