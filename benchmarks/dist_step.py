"""Benchmarks 2 and 4: what dist_sync costs per training step, and what overlap buys.

Each configuration is one local dist_sync job (:func:`benchmarks.common.launch` of
:mod:`benchmarks.step_worker`); inside it every worker times, in interleaved rounds, the same
mxlarge training step on the job's dist_sync store and on a local store (see the worker's
docstring), so each round gives one ratio measured in the same processes under the same load.

* **dist_sync cost** = step time on dist_sync ÷ step time on the local store, per worker
  (rank 0's rounds). 1 worker + 1 server: target ≤ 1.10; the demo net ≤ 1.05, next to the
  **bound** of its dist cost on this machine: the local step with MXNet's own exchange of as
  many floats (one key) beside it, overlapping the whole step (``step_worker``'s ``bound``),
  and its **floor**: the same with the one round trip no exact trainer can hide on the
  critical path (the first layer's gradient, written last by backward and needed first by
  the next forward; ``step_worker``'s ``floor``).
  2 workers + 1 server and 2 workers + 2 servers are reported: on a 2-core machine the two
  workers' computations compete for the CPU in both modes, so the ratio isolates what the
  store adds on top of that competition.
* **overlap** (1 worker + 1 server) = step time with mxlarge's pushes issued right after
  backward() returns (each starts when its gradient is ready, priority −i) ÷ step time with
  every push issued after ``mx.nd.waitall()``. Below 1 means overlap helps. Also reported: the
  share of the exposed communication (waitall step − its forward/backward part) that overlap
  hid. Measured on the compute-bound ``cifar_resnet20_v1`` (1.1 MB of gradients) and on a
  communication-heavy ``resnet18_v1b`` at 32×32 input (46.8 MB of gradients, little compute).
"""
from __future__ import annotations

from typing import IO, Any

from benchmarks.common import BenchResult, Ratio, launch, md_table, median, mmm, ratios_of

SMALL = ["--net", "cifar_resnet20_v1", "--size", "32", "--classes", "10", "--batch", "32"]
HEAVY = ["--net", "resnet18_v1b", "--size", "32", "--classes", "1000", "--batch", "32"]
#: The demo's net (experiments/proxy/digits-largebatch.yaml: small_resnet of width 16 on 1×8×8
#: digits, 128 per worker): 20 small tensors, so per-key round trips dominate its dist cost.
DEMO = ["--net", "small_resnet", "--width", "16", "--size", "8", "--channels", "1",
        "--classes", "10", "--batch", "128", "--steps", "10"]


def _job(args: list[str], workers: int, servers: int, reps: int, modes: str,
         log: IO[str] | None, bar: Any) -> dict[str, Any]:
    res = launch("benchmarks.step_worker", [*args, "--reps", str(reps), "--modes", modes],
                 workers=workers, servers=servers, log=log, bar=bar)
    return res[0]  # rank 0: in a synchronous job every worker's step takes the same time


def _visible(job: dict[str, Any]) -> bool:
    """Whether the exposed communication is large enough (≥ 10 % of the step) to be split."""
    return median(job["exposed_comm"]) >= 0.1 * median(job["sec_per_step"]["dist_waitall"])


def rounds_needed(reps_1w: int, reps_2w: int) -> int:
    """Progress-bar length: rounds × modes of every job below."""
    return reps_1w * 3 * 2 + reps_2w * 2 * 2 + reps_1w * 5


def run(reps_1w: int = 9, reps_2w: int = 5, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    jobs = {
        "1w1s": _job(SMALL, 1, 1, reps_1w, "local,dist,dist_waitall", log, bar),
        "2w1s": _job(SMALL, 2, 1, reps_2w, "local,dist", log, bar),
        "2w2s": _job(SMALL, 2, 2, reps_2w, "local,dist", log, bar),
        "heavy_1w1s": _job(HEAVY, 1, 1, reps_1w, "local,dist,dist_waitall", log, bar),
        "demo_1w1s": _job(DEMO, 1, 1, reps_1w, "local,dist,dist_perkey,bound,floor", log,
                          bar),
    }
    ratios = []
    for key, w, s, target in (("1w1s", 1, 1, 1.10), ("2w1s", 2, 1, None), ("2w2s", 2, 2, None)):
        t = jobs[key]["sec_per_step"]
        ratios.append(Ratio(
            f"dist_cost_{key}", f"step time, dist_sync {w} worker(s) + {s} server(s) ÷ local "
                                "store", ratios_of(t["dist"], t["local"]), target=target,
            higher_is_better=False,
            note=f"cifar_resnet20_v1, batch 32 per worker, {jobs[key]['steps_per_round']} steps "
                 "per round" + ("" if w == 1 else "; both workers share 2 cores in both modes")))
    demo = jobs["demo_1w1s"]
    for mode, key, label, target in (
            ("dist", "demo_1w1s", "fused (mxlarge's default)", 1.05),
            ("dist_perkey", "demo_1w1s_perkey", "one key per tensor", None)):
        t = demo["sec_per_step"]
        ratios.append(Ratio(
            f"dist_cost_{key}", f"step time, dist_sync 1 worker + 1 server ÷ local store, demo "
                                f"net, {label}", ratios_of(t[mode], t["local"]),
            target=target, higher_is_better=False,
            note=f"small_resnet width 16, 1×8×8, batch 128; {demo['tensors']} tensors in "
                 f"{demo['keys']} key(s) fused; modes local, dist, dist_perkey, bound, floor "
                 "in the same rounds"))
    t = demo["sec_per_step"]
    ratios += [
        Ratio("dist_bound_demo_1w1s", "step time, the local step with MXNet's own pushpull of "
              "as many floats as one key beside it (hidden completely) ÷ the local step, demo "
              "net", ratios_of(t["bound"], t["local"]), higher_is_better=False,
              note="kv.pushpull issued before the forward on an array nothing else touches; "
                   "the exchange's own CPU work still competes with the computation"),
        Ratio("dist_floor_demo_1w1s", "step time, bound's step plus MXNet's pushpull of the "
              "first layer's gradient between backward and the update ÷ the local step, demo "
              "net: the least an exact dist_sync step takes here",
              ratios_of(t["floor"], t["local"]), higher_is_better=False,
              note="backward writes that gradient last and the next forward needs its weight "
                   "first: one round trip no exact trainer can hide"),
    ]
    hidden: dict[str, list[float]] = {}
    for key, label in (("1w1s", "cifar_resnet20_v1, 1.1 MB"),
                       ("heavy_1w1s", "resnet18_v1b at 32 px, 46.8 MB")):
        t = jobs[key]["sec_per_step"]
        fb = jobs[key]["dist_waitall_fwd_bwd"]
        ratios.append(Ratio(
            f"overlap_{key}", f"step time, pushes as gradients become ready ÷ pushes after "
                              f"waitall ({label}, 1 worker + 1 server)",
            ratios_of(t["dist"], t["dist_waitall"]), higher_is_better=False,
            note="below 1: overlap helps"))
        # exposed communication (+ update) of the waitall step, and how much of it overlap hid
        exposed = [w - f for w, f in zip(t["dist_waitall"], fb, strict=True)]
        hidden[key] = [(w - d) / e if e > 0 else float("nan")
                       for w, d, e in zip(t["dist_waitall"], t["dist"], exposed, strict=True)]
        jobs[key]["exposed_comm"] = exposed

    rows = []
    for key, job in jobs.items():
        t = job["sec_per_step"]
        imgs = job["batch"] * job["workers"]
        for mode, vals in t.items():
            rows.append([key, job["net"], mode, mmm([1e3 * v for v in vals], "{:.0f}"),
                         f"{imgs / median(vals):.1f}",
                         f"{median(job['worker_cores_busy'][mode]):.2f}"])
    md = "\n".join([
        md_table(["job", "net", "mode", "ms/step min / median / max", "images/s (all workers, "
                  "median)", "rank-0 worker: cores busy (median)"], rows),
        "",
        md_table(["overlap job", "waitall step: fwd+bwd ms (median)", "exposed comm+update ms "
                  "(median)", "share of it hidden by overlap (min / median / max)"],
                 [[k, f"{1e3 * median(jobs[k]['dist_waitall_fwd_bwd']):.0f}",
                   f"{1e3 * median(jobs[k]['exposed_comm']):.0f}",
                   mmm(hidden[k], "{:.2f}") if _visible(jobs[k]) else "— (within noise)"]
                  for k in hidden]),
        "",
        "Exposed comm+update = waitall step − its forward+backward part; the hidden share = "
        "(waitall step − overlapped step) ÷ exposed part. It is shown only where the exposed "
        "part is at least 10 % of the step: below that, it divides noise by a few ms.",
    ])
    return BenchResult("dist_step", ratios, {"jobs": jobs, "overlap_hidden_share": hidden}, md)
