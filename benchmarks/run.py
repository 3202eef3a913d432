"""Runs every benchmark and writes ``benchmarks/results/latest.json`` and ``latest.md``.

Usage::

    make bench                                    # = .venv/bin/python -m benchmarks.run
    make bench-cluster                            # as root: --only cluster_link,wire16 (testbed)
    .venv/bin/python -m benchmarks.run --only trainer_overhead,scale_model
    .venv/bin/python -m benchmarks.run --quick    # fewer rounds (a smoke run, noisier)

Every figure is a ratio of two measurements taken back to back in the same run
(:mod:`benchmarks.common`), quoted as min / median / max over the rounds; a target is met when
the median is on the right side of it. Every ratio is printed with PASS, MISS or info (no
target). A missed target does not change the exit status; a benchmark that crashes does
(exit 1, after the others have run and the results have been written).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import BenchResult, git_commit, machine_info, md_table

RESULTS = Path(__file__).resolve().parent / "results"

TITLES = {
    "trainer_overhead": "1. Trainer overhead (mxlarge.Trainer vs bare gluon.Trainer)",
    "dist_step": "2 and 4. dist_sync cost per step, and overlap of pushes with backward",
    "bandwidth": "3. Push/pull bandwidth vs raw loopback TCP",
    "input_pipeline": "5. Input pipeline: RecordIO decode vs training speed",
    "scale_model": "6. Scale model vs MXNet's published 128-GPU table",
    "gns_cost": "7. Cost of the gradient-noise-scale estimator",
    "compression": "8. Bytes on the wire per step with 2-bit compression and the 16-bit wire",
    "heartbeat_cost": "9. Cost of the stall watchdog's heartbeat",
    "cluster_link": "10. Push/pull against a shaped link on the namespace testbed",
    "update_kernels": "11. The optimizer update alone (mxlarge vs Gluon's SGD)",
    "amp_cost": "12. A bfloat16 AMP step vs a float32 step on this CPU",
    "wire16": "13. The 16-bit wire's exchange vs float32's on a shaped testbed link",
    "fwd_bwd": "14. Forward+backward of the same graph: mxlarge.Trainer vs gluon.Trainer",
    "breakdown_cost": "15. Cost of the per-rank step breakdown",
    "timeline_cost": "16. Cost of the steps the timeline records",
    "own_script_cost": "17. Cost of tracking a script of one's own",
}
#: Run only when named in ``--only`` (``make bench-cluster``): needs root and the testbed.
ON_REQUEST = frozenset({"cluster_link", "wire16"})


def _plan(quick: bool) -> dict[str, tuple[int, Callable[..., BenchResult]]]:
    """name → (progress-bar length, callable(log, bar) → BenchResult)."""
    from benchmarks import (
        amp_cost,
        bandwidth,
        breakdown_cost,
        cluster_link,
        compression,
        dist_step,
        fwd_bwd,
        gns_cost,
        heartbeat_cost,
        input_pipeline,
        own_script_cost,
        scale_model,
        timeline_cost,
        trainer_overhead,
        update_kernels,
        wire16,
    )

    # Rounds: short rounds, many of them, so that each A/B pair sits close in time.
    r1, r2, r2w, rb, rt = (3, 3, 3, 3, 3) if quick else (21, 21, 7, 9, 5)
    rd = 3 if quick else 60  # the heartbeat's demo-net rounds (short: 10 steps of ~16 ms)
    rc = 1 if quick else 2  # the byte ratio is deterministic up to headers: few rounds suffice
    return {
        "trainer_overhead": (2 * r1, lambda log, bar: trainer_overhead.run(
            reps=r1, steps=3, bar=bar)),
        "dist_step": (dist_step.rounds_needed(r2, r2w), lambda log, bar: dist_step.run(
            reps_1w=r2, reps_2w=r2w, log=log, bar=bar)),
        "bandwidth": (bandwidth.rounds(rb),
                      lambda log, bar: bandwidth.run(reps=rb, log=log, bar=bar)),
        "input_pipeline": (2 * rt, lambda log, bar: input_pipeline.run(reps=rt, bar=bar)),
        "scale_model": (1, lambda log, bar: scale_model.run()),
        "gns_cost": (3 * rt, lambda log, bar: gns_cost.run(reps=rt, bar=bar)),
        "compression": (3 * rc, lambda log, bar: compression.run(reps=rc, log=log, bar=bar)),
        "heartbeat_cost": (2 * r1 + 2 * rd, lambda log, bar: heartbeat_cost.run(
            reps=r1, demo_reps=rd, log=log, bar=bar)),
        "update_kernels": (3 * rt, lambda log, bar: update_kernels.run(reps=rt, bar=bar)),
        "amp_cost": (2 * len(amp_cost.CASES) * rt, lambda log, bar: amp_cost.run(
            reps=rt, bar=bar)),
        "cluster_link": (len(cluster_link.CONFIGS) * rb, lambda log, bar: cluster_link.run(
            reps=rb, log=log, bar=bar)),
        "wire16": (2 * len(wire16.CONFIGS) * rt, lambda log, bar: wire16.run(
            reps=rt, log=log, bar=bar)),
        "fwd_bwd": (len(fwd_bwd.NETS) * r1, lambda log, bar: fwd_bwd.run(
            reps=r1, log=log, bar=bar)),
        "breakdown_cost": (2 * r1, lambda log, bar: breakdown_cost.run(
            reps=r1, log=log, bar=bar)),
        "timeline_cost": (2 * r1, lambda log, bar: timeline_cost.run(
            reps=r1, log=log, bar=bar)),
        "own_script_cost": (2 * r1, lambda log, bar: own_script_cost.run(
            reps=r1, log=log, bar=bar)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated benchmark names")
    p.add_argument("--quick", action="store_true", help="fewer rounds (smoke run)")
    p.add_argument("--out", default=str(RESULTS), help="directory for latest.json/.md/.log")
    opts = p.parse_args(argv)
    # MXNet 1.9.1 and GluonCV warn about NumPy aliases and distutils at import time.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="gluoncv")
    from tqdm.auto import tqdm

    plan = _plan(opts.quick)
    names = [n for n in plan if n in opts.only.split(",")] if opts.only else \
        [n for n in plan if n not in ON_REQUEST]
    unknown = set(filter(None, opts.only.split(","))) - set(plan)
    if unknown:
        p.error(f"unknown benchmark(s) {sorted(unknown)}; expected some of {list(plan)}")
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)

    info = machine_info()
    info["loadavg_start"] = os.getloadavg()
    t_start = time.perf_counter()
    results: dict[str, BenchResult] = {}
    crashes: dict[str, str] = {}
    with open(out / "run.log", "w") as log:
        for name in names:
            total, fn = plan[name]
            bar = tqdm(total=total, desc=f"{name:17s}", unit="round", dynamic_ncols=True)
            t0 = time.perf_counter()
            commit = git_commit()
            try:
                res = fn(log, bar)
                res.seconds = time.perf_counter() - t0
                res.commit = commit
                results[name] = res
            except Exception:  # noqa: BLE001 - report, keep going, fail the exit status
                crashes[name] = traceback.format_exc()
                log.write(f"=== {name} crashed\n{crashes[name]}\n")
            finally:
                bar.close()
    info["loadavg_end"] = os.getloadavg()
    info["wall_seconds"] = time.perf_counter() - t_start
    info["quick"] = opts.quick

    write_json(out / "latest.json", info, results, crashes)
    (out / "latest.md").write_text(render_md(info, results, crashes))
    print_summary(results, crashes, out)
    return 1 if crashes else 0


def write_json(path: Path, info: dict[str, Any], results: dict[str, BenchResult],
               crashes: dict[str, str]) -> None:
    payload = {
        "machine": info,
        "benchmarks": {n: {"commit": r.commit, "seconds": r.seconds,
                           "ratios": [x.as_dict() for x in r.ratios], "details": r.details}
                       for n, r in results.items()},
        "crashed": crashes,
    }
    path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def render_md(info: dict[str, Any], results: dict[str, BenchResult],
              crashes: dict[str, str]) -> str:
    load0 = ", ".join(f"{v:.1f}" for v in info["loadavg_start"])
    load1 = ", ".join(f"{v:.1f}" for v in info["loadavg_end"])
    lines = [
        "# Benchmark results",
        "",
        f"- date: {info['date']}; wall time {info['wall_seconds'] / 60:.1f} min"
        + (" (`--quick`)" if info["quick"] else ""),
        f"- machine: {info['cores']} cores ({info['cores_usable']} usable), {info['cpu']}; "
        f"{info['platform']}",
        f"- load average (1, 5, 15 min) at start: {load0}; at end: {load1} (the machine is "
        "shared: other jobs ran during the benchmarks)",
        f"- python {info['python']}, mxnet {info['mxnet']}, numpy {info['numpy']}, "
        f"gluoncv {info['gluoncv']}",
        "",
        "Every figure except the scale model's (computed from benchmarks/scale_model.yaml, "
        "no measurement) is a ratio of two things measured back to back in the same run, once "
        "per round, with the order reversed every other round (A B, B A, ...); min / median / max "
        "are over the rounds. A target is met (PASS) when the median meets it; MISS otherwise; "
        "`info` has no target. Absolute numbers in the sections below are context only: they "
        "move with the load of this shared 2-core machine, the ratios much less. Each section "
        "names the commit it measured. Everything in this file was measured or computed by "
        "this run; static context (a perf profile, the scale model's sources) is in "
        "benchmarks/README.md.",
        "",
        "## Summary",
        "",
    ]
    rows = []
    for res in results.values():
        for r in res.ratios:
            rows.append([f"`{r.key}`", r.title, r.fmt(min(r.values)), r.fmt(r.median),
                         r.fmt(max(r.values)), len(r.values), r.target_text(),
                         f"**{r.status}**" if r.status != "info" else "info",
                         _short(res.commit)])
    lines.append(md_table(["key", "ratio", "min", "median", "max", "rounds", "target",
                           "status", "commit"], rows))
    if crashes:
        lines += ["", "**Crashed:** " + ", ".join(crashes) + " (tracebacks in latest.json)."]
    for name, res in results.items():
        lines += ["", f"## {TITLES.get(name, name)}", "",
                  f"({res.seconds:.0f} s, commit {res.commit or 'unknown'})", ""]
        for r in res.ratios:
            if r.note:
                lines.append(f"- `{r.key}`: {r.note}")
        lines += ["", res.markdown]
    return "\n".join(lines) + "\n"


def _short(commit: str | None) -> str:
    """``abc1234`` (``abc1234+dirty``) of a full commit id, ``unknown`` without one."""
    if commit is None:
        return "unknown"
    head, _, dirty = commit.partition("+")
    return head[:7] + (f"+{dirty}" if dirty else "")


def print_summary(results: dict[str, BenchResult], crashes: dict[str, str], out: Path) -> None:
    print()
    for res in results.values():
        for r in res.ratios:
            print(f"{r.status:4s}  {r.key:30s} median {r.fmt(r.median):>7s}  "
                  f"(min {r.fmt(min(r.values))}, max {r.fmt(max(r.values))}, "
                  f"{len(r.values)} rounds)  target {r.target_text()}")
    for name in crashes:
        print(f"CRASH {name}: see {out / 'run.log'}")
    print(f"\nwrote {out / 'latest.json'} and {out / 'latest.md'}")


if __name__ == "__main__":
    sys.exit(main())
