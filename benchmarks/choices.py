"""The accuracy behind docs/performance.md's "What to choose": gradient compression and LARS.

Usage::

    .venv/bin/python -m benchmarks.choices               # both parts, about 6 minutes
    .venv/bin/python -m benchmarks.choices --only lars   # one part; the other keeps its results

Each run is the command the page lists, and the table quotes its final validation accuracy:

- compression: ``mxlarge launch experiments/proxy/digits-largebatch.yaml -n 2 -s 1
  tracking.enabled=false train.seed=S dist.compression=C dist.compression_threshold=T``, no
  compression and t = 0.5 (the default) with seeds 0 and 1, the other t with seed 0;
- LARS: ``mxlarge train experiments/proxy/digits-baseline.yaml tracking.enabled=false
  train.epochs=4 optim.decay=none optim.lars=true optim.lars_lr=G``, and the same without LARS
  at the config's LR of 0.05.

A launch is the job ``mxlarge launch`` builds (:func:`mxlarge.launch_cli.job_spec`); a train
runs in a process of its own. Either way the workers run this module's ``--worker``, which is
``mxlarge train`` returning :func:`mxlarge.run.train`'s result as a line of JSON instead of
printing its summary. Accuracy, not timing: the shared cores do not bias it, and a seed gives
the same figure again. Writes ``results/choices.json`` (each run with its command, each part
with the commit it was measured at, ``+dirty`` with uncommitted changes) and ``choices.md``;
the jobs' output goes to ``choices.log``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
LARGEBATCH = "experiments/proxy/digits-largebatch.yaml"
BASELINE = "experiments/proxy/digits-baseline.yaml"
#: 2-bit compression's default threshold (``dist.compression_threshold``).
DEFAULT_T = 0.5
#: (compression, threshold, seeds) of the compression part, in the table's order.
COMPRESSION: tuple[tuple[str, float, tuple[int, ...]], ...] = (
    ("none", DEFAULT_T, (0, 1)), ("2bit", DEFAULT_T, (0, 1)), ("2bit", 0.01, (0,)),
    ("2bit", 0.05, (0,)), ("2bit", 2.0, (0,)), ("2bit", 8.0, (0,)), ("2bit", 32.0, (0,)))
#: LARS's global LRs γ; ``None`` is the run without LARS.
LARS_LRS: tuple[float | None, ...] = (0.05, 1.0, 5.0, 50.0, None)
PARTS = ("compression", "lars")
TITLES = {"compression": "Gradient compression", "lars": "LARS"}


def _num(x: float) -> str:
    return f"{x:g}"


def compression_runs() -> list[dict[str, Any]]:
    """Each launch of the compression part: its settings and ``mxlarge launch`` argv."""
    return [{"compression": c, "threshold": t, "seed": s,
             "argv": ["launch", LARGEBATCH, "-n", "2", "-s", "1", "tracking.enabled=false",
                      f"train.seed={s}", f"dist.compression={c}",
                      f"dist.compression_threshold={_num(t)}"]}
            for c, t, seeds in COMPRESSION for s in seeds]


def lars_runs() -> list[dict[str, Any]]:
    """Each run of the LARS part: γ (None: no LARS) and its ``mxlarge train`` argv."""
    base = ["train", BASELINE, "tracking.enabled=false", "train.epochs=4", "optim.decay=none"]
    return [{"lars_lr": g,
             "argv": base + ([] if g is None else ["optim.lars=true", f"optim.lars_lr={_num(g)}"])}
            for g in LARS_LRS]


def _job_env() -> dict[str, str]:
    from benchmarks.common import ROOT
    return {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PYTHONWARNINGS": "ignore"}


def _launch(argv: Sequence[str], log: Any) -> dict[str, Any]:
    """``mxlarge launch ARGV``'s job, its workers running :func:`worker`; rank 0's result."""
    from benchmarks.common import BenchmarkError, JobOutput
    from mxlarge.cli import _parser
    from mxlarge.launch_cli import job_spec
    from mxlarge.launcher.job import run_job

    # as `mxlarge launch` reads argv: overrides may follow the options
    args, extra = _parser().parse_known_args(list(argv))
    args.overrides = [*args.overrides, *extra]
    spec, _ = job_spec(args)
    # the spec's command is `python -m mxlarge.cli train CONFIG OVERRIDES...`
    assert list(spec.command[1:4]) == ["-m", "mxlarge.cli", "train"], spec.command
    command = [sys.executable, "-m", "benchmarks.choices", "--worker", *spec.command[4:]]
    spec = dataclasses.replace(spec, command=command, env={**spec.env, **_job_env()})
    out = JobOutput(log)
    outcome = run_job(spec, out)
    out.flush()
    ranks = {r["rank"]: r for r in out.results}
    if outcome.exit_code != 0 or 0 not in ranks:
        raise BenchmarkError(f"mxlarge {' '.join(argv)}: {outcome.message}\n"
                             + "\n".join(out.tail[-15:]))
    return ranks[0]


def _train(argv: Sequence[str], log: Any) -> dict[str, Any]:
    """``mxlarge train ARGV`` as :func:`worker` in a process of its own; its result."""
    from benchmarks.common import BenchmarkError, JobOutput

    proc = subprocess.run([sys.executable, "-m", "benchmarks.choices", "--worker", *argv[1:]],
                          env={**os.environ, **_job_env()}, capture_output=True, text=True)
    out = JobOutput(log)
    out.write(proc.stdout + proc.stderr)
    out.flush()
    if proc.returncode != 0 or not out.results:
        raise BenchmarkError(f"mxlarge {' '.join(argv)}: exit {proc.returncode}\n"
                             + "\n".join(out.tail[-15:]))
    return out.results[-1]


def _measure(runs: list[dict[str, Any]], log: Any) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        argv = run.pop("argv")
        t0 = time.perf_counter()
        res = (_launch if argv[0] == "launch" else _train)(argv, log)
        row = {**run, "accuracy": res["accuracy"], "steps": res["steps"],
               "seconds": round(time.perf_counter() - t0, 1),
               "command": "mxlarge " + " ".join(argv)}
        print(f"  {row['command']}: final validation accuracy {row['accuracy']:.4f}",
              flush=True)
        out.append(row)
    return out


def worker(argv: list[str]) -> int:
    """``mxlarge train CONFIG OVERRIDES [--world W]`` that prints its result as JSON."""
    from benchmarks.common import emit_result
    from mxlarge.config import load_config
    from mxlarge.plan import World
    from mxlarge.protocol.heartbeat import launched_dir
    from mxlarge.protocol.reports import launched_reports
    from mxlarge.run import train

    p = argparse.ArgumentParser()
    p.add_argument("config")
    p.add_argument("--world", default=None)
    a, overrides = p.parse_known_args(argv)
    cfg = load_config(a.config, overrides)
    result = train(cfg, a.config, world=World.parse(a.world) if a.world else None,
                   heartbeat_dir=launched_dir(), reports_dir=launched_reports())
    emit_result({"rank": result.rank, "steps": result.steps,
                 "accuracy": result.final.get("val/accuracy")})
    return 0


def write_md(data: dict[str, Any], path: Path) -> None:
    from benchmarks.common import md_table
    from benchmarks.tables import short

    lines = ["# What to choose: the accuracy runs", "",
             "Made by `python -m benchmarks.choices`. Each row is one "
             "run of the command it names; the accuracy is the final epoch's on the digits "
             "proxy's 397 validation images.", ""]
    for part in PARTS:
        if part not in data:
            continue
        d = data[part]
        lines += [f"## {TITLES[part]}", "",
                  f"Measured at commit {short(d['commit'])}, {d['date']}.", "",
                  md_table(["command", "steps", "final validation accuracy", "seconds"],
                           [[f"`{r['command']}`", r["steps"], f"{r['accuracy']:.4f}",
                             f"{r['seconds']:.0f}"] for r in d["runs"]]), ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        if os.environ.get("DMLC_ROLE") in ("scheduler", "server"):
            import mxnet  # noqa: F401  (ps-lite runs the role inside the import, then exits)
            return 0
        if os.environ.get("DMLC_ROLE") != "worker":
            return worker(argv[1:])
        from mxlarge.protocol.failfast import fail_fast
        with fail_fast():  # as `mxlarge train` in a job: a failing worker leaves at once
            return worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=",".join(PARTS), help="comma-separated parts")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    only = [s for s in a.only.split(",") if s]
    if unknown := set(only) - set(PARTS):
        p.error(f"unknown part(s): {', '.join(sorted(unknown))}; choose from {PARTS}")
    from benchmarks.common import git_commit, machine_info

    path = a.out / "choices.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    a.out.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".log"), "w") as log:
        for part in only:
            commit = git_commit()
            print(f"choices: {part} at {commit}", flush=True)
            runs = _measure(compression_runs() if part == "compression" else lars_runs(), log)
            info = machine_info()
            data[part] = {"commit": commit, "date": info.get("date"), "versions": info,
                          "runs": runs}
    path.write_text(json.dumps(data, indent=1) + "\n")
    write_md(data, a.out / "choices.md")
    print(f"wrote {path} and choices.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
