"""Benchmark 13 (``make bench-cluster``, root): the 16-bit wire's exchange ÷ float32's, on the
testbed's shaped links.

The layout of :mod:`benchmarks.cluster_link` (servers on h1..hS, workers on h(S+1)..h(2S), the
scheduler on h0; every host's link shaped with ``tc tbf`` both ways), at 200 Mbit/s per host:
one launched job of :mod:`benchmarks.pushpull_worker` whose rounds alternate mxlarge's
``SyncStore.allreduce_grads`` over ResNet-50's gradients with ``wire_dtype='float32'`` and with
``'float16'`` (cast to float16, pushpull, cast back; the servers sum in float32), each round the
best of its iterations. Ratio = float16 time ÷ float32 time per round; target ≤ 0.55 (half the
bytes, plus the casts).
"""
from __future__ import annotations

import json
import time
from typing import IO, Any

from benchmarks.cluster_link import Config, _job, shape_links
from benchmarks.common import BenchResult, Ratio, md_table, mmm, ratios_of

CONFIGS = (Config("wire16_resnet50_w2_200m", "resnet50", 2, 0.2, target=0.55,
                  worker_args=("--wire", "float32,float16")),)


def run(reps: int = 5, iters: int = 2, log: IO[str] | None = None,
        bar: Any = None) -> BenchResult:
    from benchmarks.bandwidth import resnet50_shapes
    from mxlarge.testbed import Testbed, exclusive

    n_hosts = 2 * max(c.workers for c in CONFIGS) + 1
    ratios, rows, details = [], [], []
    with exclusive():
        tb = Testbed(n=n_hosts)
        work = tb.root / "work" / "bench-wire16"
        tb.up()
        shaped = [f"h{i}" for i in range(1, n_hosts)]
        try:
            work.mkdir(parents=True, exist_ok=True)
            shapes = work / "resnet50.json"
            shapes.write_text(json.dumps(resnet50_shapes()))
            for c in CONFIGS:
                shape_links(tb, shaped, c.rate_gbit)
                res = _job(tb, work, shapes, c, reps, iters, log, bar)
                modes = res["sec_per_iter"]
                f32 = next(m for m in modes if m.startswith("pushpull_") and "float16" not in m)
                f16 = f"{f32}_float16"
                best = {m: [min(x) for x in modes[m]] for m in (f32, f16)}
                ratios.append(Ratio(
                    c.key, f"16-bit wire exchange ÷ float32, W = S = {c.workers}, "
                           f"{1000 * c.rate_gbit:g} Mbit/s per host, {c.net}",
                    ratios_of(best[f16], best[f32]), target=c.target, higher_is_better=False,
                    note=f"{res['tensors']} tensors, {res['bytes'] / 1e6:.1f} MB in float32; "
                         f"keys {res['keys']}"))
                rows += [[c.key, m, mmm([1e3 * t for t in best[m]], "{:.0f}")] for m in best]
                details.append({**c.__dict__, "bytes": res["bytes"], "sec_per_iter": modes})
        finally:
            shape_links(tb, shaped, None)
            tb.down()
    md = md_table(["config", "mode", "exchange ms (min / med / max)"], rows)
    return BenchResult("wire16", ratios, {"configs": details, "started": time.time()}, md)
