"""What a step costs besides the graph, mxlarge.Trainer vs gluon.Trainer (a diagnostic, not in
any make).

    python -m benchmarks.fwd_bwd_profile [--nets demo,resnet20] [--steps 30]

One process, the same hybridized net built twice from seed 0, each with its trainer on a
``local`` store object (so mxlarge plans its fusion buckets and the gradients become views of
their buffers, as on dist_sync), stepped alternately. Counted, not timed against the clock, so
that a loaded machine does not move the figures:

* the engine operators of forward+backward and of ``trainer.step`` per step (MXNet's profiler,
  aggregate counts; a bulked segment of the static graph is one entry);
* the Python main thread's CPU time per step (``time.thread_time``): issuing forward+backward,
  and ``trainer.step``;
* garbage-collector runs per 100 steps, per generation.

Prints one JSON object: net → trainer → those figures.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import tempfile
import time
import warnings
from typing import Any

NETS = {"demo": ("small_resnet", 8, 1, 128), "resnet20": ("cifar_resnet20_v1", 32, 3, 32)}
TRAINERS = ("gluon", "mxlarge")


def _operators(profile: str, steps: int) -> dict[str, float]:
    """Operator name → calls per step, from ``mx.profiler.dumps()``'s ``operator`` table."""
    out, section = {}, None
    lines = profile.splitlines()
    for line, below in zip(lines, [*lines[1:], ""]):
        if below.startswith("====="):  # a table's title
            section = line.strip()
            continue
        parts = line.split()
        if section == "operator" and len(parts) >= 6 and parts[-5].isdigit():
            out[" ".join(parts[:-5])] = int(parts[-5]) / steps
    return out


def profile_net(key: str, steps: int, profiled: int = 10) -> dict[str, Any]:
    """``steps`` timed steps per pass (2 passes per trainer), then ``profiled`` steps per part
    under MXNet's profiler (module docstring)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    import mxlarge
    from benchmarks.models import build_net, synthetic_batches

    name, size, channels, n = NETS[key]
    batches = synthetic_batches(4, n, size, 10, channels=channels)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    opt = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
    setups = {}
    for which in TRAINERS:
        net = build_net(name, 10, size, seed=0, channels=channels)
        params, kv = net.collect_params(), mx.kv.create("local")
        setups[which] = (net, gluon.Trainer(params, "sgd", opt, kvstore=kv,
                                            update_on_kvstore=False)
                         if which == "gluon" else
                         mxlarge.Trainer(params, "sgd", opt, kvstore=kv, decay_bn_bias=True))

    def step(which: str, s: int) -> tuple[float, float]:
        net, trainer = setups[which]
        x, y = batches[s % len(batches)]
        mx.nd.waitall()
        t0 = time.thread_time()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        t1 = time.thread_time()
        mx.nd.waitall()
        t2 = time.thread_time()
        trainer.step(n)
        t3 = time.thread_time()
        mx.nd.waitall()
        return t1 - t0, t3 - t2

    out: dict[str, Any] = {w: {"python_fwd_bwd_ms": 0.0, "python_step_ms": 0.0,
                               "gc_per_100_steps": [0.0, 0.0, 0.0]} for w in TRAINERS}
    for which in TRAINERS:  # warm-up: graph, static allocation, optimizer states
        for s in range(3):
            step(which, s)
    for which in (*TRAINERS, *TRAINERS):  # two passes each, alternated
        before = [st["collections"] for st in gc.get_stats()]
        for s in range(steps):
            fb, st = step(which, s)
            out[which]["python_fwd_bwd_ms"] += 1e3 * fb / (2 * steps)
            out[which]["python_step_ms"] += 1e3 * st / (2 * steps)
        after = [st["collections"] for st in gc.get_stats()]
        out[which]["gc_per_100_steps"] = [g + 100 * (a - b) / (2 * steps) for g, a, b in
                                          zip(out[which]["gc_per_100_steps"], after, before)]
    trace_dir = tempfile.mkdtemp(prefix="mxlarge-profile-")
    for which in TRAINERS:
        net, trainer = setups[which]
        for part in ("fwd_bwd", "step"):
            # a file of our own: MXNet 1.9.1's profiler replaces a device such as /dev/null
            # with a regular file of its trace (which then breaks sshd and every `>/dev/null`)
            mx.profiler.set_config(profile_all=True, aggregate_stats=True,
                                   filename=os.path.join(trace_dir, "profile.json"))
            for s in range(profiled):
                x, y = batches[s % len(batches)]
                mx.nd.waitall()
                if part == "fwd_bwd":
                    mx.profiler.set_state("run")
                with autograd.record():
                    loss = loss_fn(net(x), y)
                loss.backward()
                mx.nd.waitall()
                mx.profiler.set_state("run" if part == "step" else "stop")
                trainer.step(n)
                mx.nd.waitall()
                mx.profiler.set_state("stop")
            out[which][f"operators_{part}"] = _operators(mx.profiler.dumps(reset=True),
                                                        profiled)
    shutil.rmtree(trace_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nets", default="demo,resnet20")
    p.add_argument("--steps", type=int, default=30)
    opts = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    print(json.dumps({key: profile_net(key, opts.steps) for key in opts.nets.split(",")},
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
