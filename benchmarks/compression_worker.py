"""Worker script of benchmark 8: TCP bytes a worker sends and receives per training step.

Started as every role of a local dist_sync job. Each worker builds a 3-layer MLP of ~1.3 M
float32 parameters, wraps it in :class:`mxlarge.Trainer` with or without 2-bit compression (or
with the 16-bit wire),
runs warm-up steps, then reads the ``bytes_sent``/``bytes_received`` counters of its own TCP
sockets (``ss -tinpH``: the kernel's per-connection totals, so every ps-lite message counts,
headers included), runs ``--steps`` steps, waits for them, and reads the counters again.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess

import mxnet as mx  # a scheduler/server serves its role inside this import, then exits

from benchmarks.common import emit_result, worker_main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--compression", choices=("none", "2bit"), default="none")
    p.add_argument("--wire", choices=("float32", "float16"), default="float32")
    p.add_argument("--steps", type=int, default=10)
    return p.parse_args(argv)


def socket_bytes(pid: int) -> tuple[int, int]:
    """(bytes sent, bytes received) summed over the TCP sockets of process ``pid``."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    sent = received = 0
    owned = False
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):  # a socket line; its details follow indented
            owned = f"pid={pid}," in line
        elif owned:
            m = re.search(r"bytes_sent:(\d+)", line)
            sent += int(m.group(1)) if m else 0
            m = re.search(r"bytes_received:(\d+)", line)
            received += int(m.group(1)) if m else 0
    return sent, received


def _work(opts: argparse.Namespace) -> None:
    from mxnet import autograd, gluon

    import mxlarge

    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(1024, activation="relu"), gluon.nn.Dense(1024, activation="relu"),
            gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 256)))
    compression = {"type": "2bit", "threshold": 0.5} if opts.compression == "2bit" else None
    trainer = mxlarge.Trainer(net.collect_params(), lambda step: 0.01, kvstore="dist_sync",
                              compression=compression, wire_dtype=opts.wire)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    x = mx.nd.random.normal(shape=(32, 256))
    y = mx.nd.array([i % 10 for i in range(32)])

    def step(t: int) -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(32, t)

    for t in range(2):
        step(t)
    mx.nd.waitall()
    trainer.collectives.barrier()
    pid = os.getpid()
    sent0, recv0 = socket_bytes(pid)
    for t in range(2, 2 + opts.steps):
        step(t)
    mx.nd.waitall()
    sent1, recv1 = socket_bytes(pid)
    params = sum(p.data().size for p in net.collect_params().values())
    emit_result({"rank": trainer.rank, "params": params, "steps": opts.steps,
                 "sent_per_step": (sent1 - sent0) / opts.steps,
                 "received_per_step": (recv1 - recv0) / opts.steps})
    trainer.collectives.barrier()


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, _work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
