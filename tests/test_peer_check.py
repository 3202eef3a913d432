"""The peers benchmark's closed-form check (benchmarks.peer_worker.formula_check): MXNet's own
momentum kernel on k float32 gradients added in different orders stays within the derived
float32 bound, and an LR off by 1e-5 (or a momentum bug) does not."""
from __future__ import annotations

import argparse
import itertools

import mxnet as mx
import numpy as np
import pytest

from benchmarks.peer_worker import formula_check

LR, M, WD, N = 0.1, 0.9, 1e-4, 8


def _opts() -> argparse.Namespace:
    return argparse.Namespace(lr=LR, momentum=M, wd=WD)


def _run(grads_by_step, order, lr=LR, momentum=M):
    """Weights after each step, summing the ranks' gradients in ``order`` (float32)."""
    rng = np.random.default_rng(0)
    w = mx.nd.array(rng.normal(0, 1, 4096).astype(np.float32))
    mom = mx.nd.zeros(w.shape)
    out = [w.asnumpy()]
    for grads in grads_by_step:
        total = mx.nd.array(grads[order[0]])
        for r in order[1:]:
            total = total + mx.nd.array(grads[r])
        mx.nd.sgd_mom_update(w, total, mom, out=w, lr=lr, momentum=momentum, wd=WD,
                             rescale_grad=1.0 / (len(order) * N))
        out.append(w.asnumpy())
    return out


@pytest.mark.parametrize("k", [3, 5])
def test_every_summation_order_meets_the_bound_and_a_1e5_lr_error_does_not(k: int) -> None:
    rng = np.random.default_rng(1)
    # gradients of mixed sign and scale: cancellation across ranks is where orders differ most
    steps = [[(rng.normal(0, 1, 4096) * rng.choice([1e-3, 1, 30], 4096)).astype(np.float32)
              for _ in range(k)] for _ in range(3)]
    orders = list(itertools.permutations(range(k)))[:6]
    traces = [_run(steps, o) for o in orders]
    assert any(not np.array_equal(traces[0][-1], t[-1]) for t in traces[1:])  # orders differ
    for trace in traces:
        for t in range(3):
            before = trace[max(t - 1, 0)]
            f = formula_check(t, k, _opts(), 1.0 / (k * N), [[g] for g in steps[t]],
                              [before], [trace[t]], [trace[t + 1]])
            assert f["ok"], f
            assert f["lr_detect"] < 1e-5
    for wrong in (_run(steps, orders[0], lr=LR * (1 + 1e-5)), _run(steps, orders[0], momentum=0)):
        found = [formula_check(t, k, _opts(), 1.0 / (k * N), [[g] for g in steps[t]],
                               [wrong[max(t - 1, 0)]], [wrong[t]], [wrong[t + 1]])
                 for t in range(3)]
        assert not all(f["ok"] for f in found)


def _run16(grads_by_step, kind, lr=LR):
    """Weights after each step on a 16-bit wire: every gradient rounded to float16, then summed
    in float32 and rounded once (``server``: mxlarge's servers in multi-precision mode) or
    summed in float16 (``ring``: Horovod's Compression.fp16)."""
    rng = np.random.default_rng(0)
    w = mx.nd.array(rng.normal(0, 1, 4096).astype(np.float32))
    mom = mx.nd.zeros(w.shape)
    out = [w.asnumpy()]
    for grads in grads_by_step:
        wire = [g.astype(np.float16) for g in grads]
        if kind == "server":
            total = np.sum([x.astype(np.float32) for x in wire], axis=0, dtype=np.float32)
            total = total.astype(np.float16)
        else:
            total = wire[0]
            for x in wire[1:]:
                total = total + x  # float16 + float16: rounded to float16
        mx.nd.sgd_mom_update(w, mx.nd.array(total.astype(np.float32)), mom, out=w, lr=lr,
                             momentum=M, wd=WD, rescale_grad=1.0 / (len(grads) * N))
        out.append(w.asnumpy())
    return out


@pytest.mark.parametrize("kind", ["server", "ring"])
@pytest.mark.parametrize("k", [3, 5])
def test_a_16_bit_wire_meets_its_bound_needs_it_and_a_5e2_lr_error_does_not(kind: str,
                                                                           k: int) -> None:
    rng = np.random.default_rng(2)
    # scales from below float16's smallest normal (2⁻¹⁴ ≈ 6e-5: subnormal rounding) to large
    steps = [[(rng.normal(0, 1, 4096) * rng.choice([1e-6, 1e-3, 1, 30], 4096)).astype(np.float32)
              for _ in range(k)] for _ in range(3)]

    def checks(trace, wire):
        return [formula_check(t, k, _opts(), 1.0 / (k * N), [[g] for g in steps[t]],
                              [trace[max(t - 1, 0)]], [trace[t]], [trace[t + 1]], wire)
                for t in range(3)]

    trace = _run16(steps, kind)
    found = checks(trace, kind)
    assert all(f["ok"] for f in found), found
    assert max(f["lr_detect"] for f in found) < 2e-2
    assert not all(f["ok"] for f in checks(trace, None))  # the float32 bound alone fails
    assert not all(f["ok"] for f in checks(_run16(steps, kind, lr=LR * 1.05), kind))
