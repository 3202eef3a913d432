"""Worker script of the peers benchmark (:mod:`benchmarks.peers`): one trainer, one net, one job.

Started as every role of a local (or testbed) dist_sync job for the peers ``mxlarge``,
``mxlarge_fp16``, ``gluon_kv`` and ``gluon``, or as every rank of a ``horovodrun`` job for
``horovod`` and ``horovod_fp16``. A
scheduler or server serves its role inside ``import mxnet`` (the first non-stdlib import below)
and exits there; only a worker gets to :func:`work`.

Every peer runs the same loop on the same net (built from seed 0 on every rank, so the initial
weights w₀ are identical everywhere), on fixed per-rank batches of noise (rank r draws from seed
r), with SGD η, momentum m, weight decay λ on every tensor::

    with autograd.record(): loss = SoftmaxCrossEntropy(net(x), y)     # summed over n images
    loss.backward(); trainer.step(b)

What differs is the trainer line and ``b`` (:func:`make_trainer`). Each is configured for the update
of the mean gradient over the global batch of k·n images (k workers, n per worker), eq. (10)
of Goyal et al. with a constant η (so momentum correction is a no-op)::

    v ← m·v − η·(ḡ + λ·w),  w ← w + v,   ḡ = (1/(k·n)) Σ_ranks Σ_images ∇loss

Phases, in this order, in one launch:

1. **Same math** (``--check-steps`` S steps from w₀): rank 0 saves w₀, w₁ and w_S of every
   trainable tensor (``--save``); with ``--reference`` (mxlarge's file) every rank compares
   its w_S with it. Agreement is NumPy's ``allclose``: |w − w_ref| ≤ atol + rtol·|w_ref| for
   every element. A drift prints one ``PEERS_DRIFT {json}`` line (peer, net, max |Δw|, the
   tensor, and the first update's size ‖w₁ − w₀‖ ÷ ‖w₁,ref − w₀‖) and exits 3 before
   anything is timed, unless ``--expect-drift`` (a configuration measured only to record by
   how much it differs: it reports and stops).

   With k ≥ 3 ranks the sum of k float32 gradients depends on the order it is added in (ps-lite
   servers add pushes as they arrive, a ring adds chunk by chunk), and the difference grows
   chaotically over steps (ResNet-50 at 32×32 normalises its last BN layers over n = 8
   values), so w_S cannot be compared with mxlarge's elementwise. There the criterion is the
   closed form, step by step (:func:`formula_check`): rank 0 recomputes every rank's gradient
   g_r at its own w_t (each rank's batches are a function of the rank) and checks every element
   of w_{t+1} against eq. (10) evaluated in float64 from float32 w_t, w_{t−1}, g_r, within the
   float32 bound of :func:`update_bound`. The cross-peer |Δw_S| is still reported. The check
   also reports the smallest relative LR error it would catch (``lr_detect``).

   The 16-bit wire peers (:data:`WIRE16`) cannot agree with float32 weights elementwise at any
   k: every gradient is rounded to float16. For them the closed form decides at every k, with
   the float16 error of the summed gradient added to the bound (:func:`wire16_error`: how the
   sum is formed differs, mxlarge's servers add float16 pushes in float32 and round once,
   Horovod's ring adds in float16), and |Δw_S| against mxlarge's float32 weights is reported.
2. **Timing** (unless ``--blocks 0``: the check only): 2 warm-up steps, then ``--blocks``
   blocks of ``--steps`` steps, each timed from the first forward to ``mx.nd.waitall()`` after
   the last update. Then ``--split-steps`` steps with ``mx.nd.waitall()`` after backward, timed
   in two parts: forward+backward, and communication+update (``trainer.step`` to its end),
   nothing overlapping: which term a peer spends its step in.
3. **The engine's exchange alone** (``--floor-steps`` F, mxlarge's launches; in float16 in
   ``mxlarge_fp16``'s): F exchanges of the
   same tensors with nothing else, timed each to ``mx.nd.waitall()``, in two layouts alternated
   on the job's own store and servers (keys apart from the trainer's, :data:`FLOOR_KEYS`): bare
   ``kv.pushpull`` (in place, backward order, priority −i, then ``waitall``) of one key per
   trainable tensor (as Gluon issues them), of flat arrays the sizes of mxlarge's buckets, and
   of the same number of floats in :func:`even_sizes` equal keys (each sliced evenly over the
   servers: every server and link carries the same bytes). A dist_sync step contains an
   exchange of these bytes, so the fastest layout's time bounds from below the step time of
   any peer that exchanges them through these servers in one of these ways. Then F times the
   equal keys' exchange issued together with a forward+backward (the perfect-overlap bound),
   and F times with the trainer's update after the forward+backward (the bound with its update).

One ``BENCH_RESULT`` line per rank: the check's outcome, and seconds per step of every block
with the cores the process kept busy.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import mxnet as mx

from benchmarks.common import KEY_STRIDE, emit_result, worker_main
from benchmarks.models import build_net, synthetic_batches
from benchmarks.pushpull_worker import BareKV, even_sizes

#: The peers; how each is built: :func:`make_trainer` (described in ``benchmarks.peers``).
PEERS = ("mxlarge", "gluon_kv", "gluon", "horovod", "mxlarge_fp16", "horovod_fp16")
#: The peers whose gradients travel in float16, and where their sum is formed: ``server``
#: (float16 pushes summed in float32, rounded to float16 once) or ``ring`` (summed in float16).
WIRE16 = {"mxlarge_fp16": "server", "horovod_fp16": "ring"}
DRIFT_MARK = "PEERS_DRIFT "
#: Key offsets of phase 3's two layouts: above a trainer's parameter keys (< KEY_STRIDE for
#: nets of fewer tensors) and below mxlarge's statistic, bucket and collective keys (≥ 100,000).
FLOOR_KEYS = {"per_tensor": KEY_STRIDE, "buckets": 2 * KEY_STRIDE, "even": 3 * KEY_STRIDE}
DRIFT_EXIT = 3


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--peer", required=True, choices=PEERS)
    p.add_argument("--net", required=True)
    p.add_argument("--channels", type=int, default=3)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch", type=int, default=32, help="images per worker and step (n)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--lr-scale", type=float, default=1.0,
                   help="multiply this peer's LR (only to see the same-math check fail)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--wd", type=float, default=1e-4)
    p.add_argument("--naive", action="store_true",
                   help="gluon peers: step(n), as Gluon's docs say, instead of step(k·n)")
    p.add_argument("--check-steps", type=int, default=3)
    p.add_argument("--save", default=None, help="rank 0 writes w0, w1, wS here (.npz)")
    p.add_argument("--reference", default=None, help="mxlarge's .npz to compare with")
    p.add_argument("--rtol", type=float, default=1e-5)
    p.add_argument("--atol", type=float, default=1e-6)
    p.add_argument("--expect-drift", action="store_true")
    p.add_argument("--steps", type=int, default=5, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=3, help="timed blocks (0: check only)")
    p.add_argument("--floor-steps", type=int, default=0,
                   help="exchanges of the engine alone per layout (phase 3; dist_sync only)")
    p.add_argument("--split-steps", type=int, default=0,
                   help="then this many steps timed in two parts (profile of the terms)")
    return p.parse_args(argv)


def make_trainer(peer: str, params: Any, opt: dict[str, float],
                 naive: bool) -> tuple[Any, int, int, Callable[[int], int], Any]:
    """Builds ``peer``'s trainer over ``params``.

    Returns:
        (trainer, rank, k workers, b(n), the dist_sync store or None for Horovod):
        ``trainer.step(b(n))`` applies the mean-gradient update above for n images per worker
        (``naive``: Gluon's ``step(n)``).
    """
    if peer in ("horovod", "horovod_fp16"):
        import horovod.mxnet as hvd

        hvd.init()
        hvd.broadcast_parameters(params, root_rank=0)
        # allreduce averages over the k ranks, step(n) rescales by 1/n: the global mean.
        # Compression.fp16 casts each gradient to float16 for the allreduce (summed in float16
        # around the ring) and back.
        compression = hvd.Compression.fp16 if peer == "horovod_fp16" else hvd.Compression.none
        return (hvd.DistributedTrainer(params, "sgd", opt, compression=compression),
                hvd.rank(), hvd.size(), lambda n: n, None)
    kv = mx.kv.create("dist_sync")
    k = kv.num_workers
    if peer in ("mxlarge", "mxlarge_fp16"):
        import mxlarge

        # step(n) rescales the summed gradient by 1/(k·n) itself; decay_bn_bias=True decays
        # every tensor, as the peers' SGD does (Goyal's no-decay roles are not what they do).
        # The 16-bit wire pushes float16 (prescale 1 here: no rescale_grad, no AMP).
        trainer = mxlarge.Trainer(params, "sgd", opt, kvstore=kv, decay_bn_bias=True,
                                  wire_dtype="float16" if peer == "mxlarge_fp16" else "float32")
        return trainer, kv.rank, k, lambda n: n, kv
    # Servers sum the k pushes and Gluon rescales by 1/b: b = k·n gives the global mean.
    trainer = mx.gluon.Trainer(params, "sgd", opt, kvstore=kv,
                               update_on_kvstore=None if peer == "gluon_kv" else False)
    if peer == "gluon":
        # Gluon initialises the store lazily inside the first step, where its initial weight
        # pull races the first gradient push of the same key (the MXNet facts note): a
        # weight can come back as a gradient sum. Initialise and wait before any gradient.
        trainer._init_kvstore()
        trainer._init_params()
        mx.nd.waitall()
    return trainer, kv.rank, k, (lambda n: n) if naive else (lambda n: k * n), kv


def trainable(net: Any) -> list[Any]:
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def snapshot(params: Sequence[Any]) -> list[Any]:
    return [p.data().asnumpy() for p in params]


def compare(got: dict[str, Any], ref: dict[str, Any], rtol: float,
            atol: float) -> dict[str, Any]:
    """``got`` vs ``ref`` (each ``w0_i``, ``w1_i``, ``wS_i`` per trainable tensor i).

    Returns:
        ``agree`` (every wS element within atol + rtol·|ref|, NumPy's ``allclose``),
        ``max_abs`` = max |wS − wS_ref| and its tensor, ``init_max_abs`` = max |w0 − w0_ref|,
        and ``update_ratio`` = ‖w1 − w0‖ ÷ ‖w1_ref − w0_ref‖ (2-norms over all tensors): the
        first update's size relative to the reference's (k for a k× update without decay).
    """
    import numpy as np

    n = sum(1 for key in ref if key.startswith("wS_"))
    if sum(1 for key in got if key.startswith("wS_")) != n:
        return {"agree": False, "max_abs": float("inf"), "tensor": "tensor count differs",
                "init_max_abs": float("inf"), "update_ratio": float("nan")}
    agree, worst, where, init = True, 0.0, -1, 0.0
    num = den = 0.0
    for i in range(n):
        a, b = got[f"wS_{i}"], ref[f"wS_{i}"]
        if a.shape != b.shape:
            return {"agree": False, "max_abs": float("inf"), "tensor": f"{i}: shape {a.shape} "
                    f"vs {b.shape}", "init_max_abs": float("inf"), "update_ratio": float("nan")}
        agree = agree and bool(np.allclose(a, b, rtol=rtol, atol=atol))
        d = float(np.abs(a - b).max()) if a.size else 0.0
        if d > worst:
            worst, where = d, i
        init = max(init, float(np.abs(got[f"w0_{i}"] - ref[f"w0_{i}"]).max()) if a.size else 0.0)
        num += float(np.square(got[f"w1_{i}"] - got[f"w0_{i}"]).sum())
        den += float(np.square(ref[f"w1_{i}"] - ref[f"w0_{i}"]).sum())
    shape = tuple(ref[f"wS_{where}"].shape) if where >= 0 else ()
    return {"agree": agree, "max_abs": worst, "tensor": f"{where} {shape}",
            "init_max_abs": init, "update_ratio": (num / den) ** 0.5 if den else float("nan")}


#: Unit roundoff of float32 (round to nearest): |fl(x) − x| ≤ U·|x|.
U = 2.0 ** -24


#: Unit roundoff of float16, and half its subnormal step (the largest error of rounding a
#: value below float16's smallest normal 2⁻¹⁴, where the relative bound does not hold).
U16 = 2.0 ** -11
T16 = 2.0 ** -25


def wire16_error(kind: str, k: int, sum_abs: Any, total: Any) -> Any:
    """Elementwise bound on |G̃ − Σ_r g_r| for k float32 gradients g_r summed over a float16
    wire (``sum_abs`` = Σ_r|g_r|, ``total`` = Σ_r g_r, exact); prescale 1 (what the peers run).

    Every g_r is rounded to float16 once: ≤ U16·|g_r| + T16 each. Then

    * ``server`` (mxlarge's 16-bit wire, servers in multi-precision mode): the k float16
      values are added in float32 (that error, ≤ (k−1)·U·Σ|g_r|, is :func:`update_bound`'s
      own term) and the sum is rounded to float16 once: ≤ U16·|G̃₃₂| + T16. So
      E = U16·(Σ|g_r| + |Σ g_r|) + (k + 1)·T16, to first order;
    * ``ring`` (Horovod's ``Compression.fp16``): the k − 1 additions of the allreduce are
      float16 roundings of partial sums (in any order or tree: each ≤ U16·Σ|g̃_r|; float16
      values are multiples of 2⁻²⁴, so a sum below 2⁻¹⁴ is exact and adds no T16):
      E = k·U16·Σ|g_r| + k·T16, to first order.

    The second-order terms (U16² and U16·T16) are covered by :func:`update_bound`'s factor 2.
    """
    import numpy as np

    if kind == "server":
        return U16 * (sum_abs + np.abs(total)) + (k + 1) * T16
    if kind == "ring":
        return k * U16 * sum_abs + k * T16
    raise ValueError(f"wire16_error: kind {kind!r}: expected 'server' or 'ring'")


def update_bound(k: int, lr: float, rescale: float, wd: float, momentum: float, sum_abs: Any,
                 w: Any, v: Any, w_next: Any, wire_error: Any = 0.0) -> Any:
    """Elementwise float32 bound on |w_{t+1} − ref| for eq. (10) with k ranks.

    ``ref = w + m·v − η·(s·Σ_r g_r + λ·w)`` exactly (float64), v = w_t − w_{t−1}; a peer adds
    the k gradients in some order (error ≤ (k−1)·U·Σ_r|g_r|, the recursive-summation bound,
    Higham, Accuracy and Stability, §4.2), divides or rescales (≤ 2 roundings of the sum), runs
    the momentum update (≤ 3 roundings of each term m·v, η·s·G, η·λ·w, one of the result
    w_{t+1}) and keeps its momentum state where the reconstruction v = w_t − w_{t−1} sees it
    through the rounded w_t (≤ m·U·|w_t|)::

        B = 2·U·[(k + 1)·η·s·Σ_r|g_r| + 3·(m·|v| + η·s·Σ_r|g_r| + η·λ·|w|) + |w_{t+1}| + m·|w|]

    The factor 2 covers the second-order terms (γ_n = nU/(1 − nU) for U) with room to spare;
    nothing in it grows with the step. A 16-bit wire adds its error E of the summed gradient
    (``wire_error``, :func:`wire16_error`) as it moves the weight, η·s·E, under the same factor.
    """
    import numpy as np

    a = lr * rescale * sum_abs
    return 2 * (U * ((k + 1) * a + 3 * (momentum * np.abs(v) + a + lr * wd * np.abs(w))
                     + np.abs(w_next) + momentum * np.abs(w))
                + lr * rescale * wire_error)


def formula_check(step: int, k: int, opts: argparse.Namespace, rescale: float,
                  grads: Sequence[Sequence[Any]], before: Sequence[Any], w: Sequence[Any],
                  after: Sequence[Any], wire: str | None = None) -> dict[str, Any]:
    """w_{t+1} of every tensor against eq. (10) with the nominal η (``--lr``, not the scaled
    one), within :func:`update_bound`; ``grads[r][i]``: rank r's gradient of tensor i at w_t,
    ``before``: w_{t−1} (w_0 at the first step, v = 0); ``wire``: a :data:`WIRE16` kind, whose
    float16 error (:func:`wire16_error`) the bound then includes.

    Returns ``ok``, the worst element as a multiple of its bound (``worst_ratio``, ≤ 1 when
    ok) and its tensor, and ``lr_detect``: the smallest δ for which an η·(1 + δ) would move
    some element by more than twice its bound, min_j 2·B_j ÷ (η·|s·G_j + λ·w_j|).
    """
    import numpy as np

    lr, m, wd = opts.lr, opts.momentum, opts.wd
    worst, where, detect = 0.0, -1, float("inf")
    for i, (wt, wprev, wn) in enumerate(zip(w, before, after, strict=True)):
        gs = [np.asarray(g[i], np.float64) for g in grads]
        total, sum_abs = np.sum(gs, axis=0), np.sum(np.abs(gs), axis=0)
        w64, v = wt.astype(np.float64), wt.astype(np.float64) - wprev.astype(np.float64)
        force = rescale * total + wd * w64
        ref = w64 + m * v - lr * force
        bound = update_bound(k, lr, rescale, wd, m, sum_abs, w64, v, wn.astype(np.float64),
                             wire16_error(wire, k, sum_abs, total) if wire else 0.0)
        ratio = np.abs(wn.astype(np.float64) - ref) / np.maximum(bound, np.finfo(np.float64).tiny)
        if ratio.size and float(ratio.max()) > worst:
            worst, where = float(ratio.max()), i
        moved = lr * np.abs(force)
        live = moved > 0
        if live.any():
            detect = min(detect, float((2 * bound[live] / moved[live]).min()))
    return {"step": step, "ok": worst <= 1.0, "worst_ratio": worst, "tensor": where,
            "lr_detect": detect}


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot, from /proc/stat (the network
    namespaces of the testbed share it: the whole machine)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def work(opts: argparse.Namespace) -> None:
    import numpy as np
    from mxnet import autograd

    net = build_net(opts.net, opts.classes, opts.size, seed=0, channels=opts.channels,
                    width=opts.width)
    params = net.collect_params()
    opt = {"learning_rate": opts.lr * opts.lr_scale, "momentum": opts.momentum, "wd": opts.wd}
    if opts.floor_steps and opts.peer not in ("mxlarge", "mxlarge_fp16"):
        raise SystemExit(f"--floor-steps: measured in mxlarge's launches (its buckets are one "
                         f"layout), not with --peer {opts.peer}")
    trainer, rank, k, step_batch, kv = make_trainer(opts.peer, params, opt, opts.naive)
    batches = synthetic_batches(4, opts.batch, opts.size, opts.classes, seed=rank,
                                channels=opts.channels)
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    b = step_batch(opts.batch)

    def step(s: int) -> None:
        x, y = batches[s % len(batches)]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(b)

    def split_step(s: int) -> tuple[float, float]:
        """One step with ``waitall`` after backward: (forward+backward, communication+update)
        seconds, serialised (nothing overlaps)."""
        x, y = batches[s % len(batches)]
        mx.nd.waitall()
        t0 = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        mx.nd.waitall()
        t1 = time.perf_counter()
        trainer.step(b)
        mx.nd.waitall()
        return t1 - t0, time.perf_counter() - t1

    def rank_grads(s: int) -> list[list[Any]]:
        """Every rank's gradients at the current weights for step s, computed here (rank r's
        batch is a function of r); grads are overwritten by the step's own backward next."""
        out = []
        for r_batches in every_rank:
            x, y = r_batches[s % len(r_batches)]
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            out.append([p.grad().asnumpy() for p in tensors])
        return out

    # -- 1. same math ------------------------------------------------------------------------
    tensors = trainable(net)
    formula = rank == 0 and not opts.naive
    every_rank = [synthetic_batches(4, opts.batch, opts.size, opts.classes, seed=r,
                                    channels=opts.channels) for r in range(k)] if formula else []
    w_now = snapshot(tensors)
    weights = {f"w0_{i}": w for i, w in enumerate(w_now)}
    w_before, formulas = w_now, []
    for s in range(opts.check_steps):
        grads = rank_grads(s) if formula else None
        step(s)
        w_next = snapshot(tensors)
        if grads is not None:
            formulas.append(formula_check(s, k, opts, 1.0 / (k * opts.batch), grads, w_before,
                                          w_now, w_next, WIRE16.get(opts.peer)))
        w_before, w_now = w_now, w_next
        if s == 0:
            weights.update({f"w1_{i}": w for i, w in enumerate(w_now)})
    weights.update({f"wS_{i}": w for i, w in enumerate(w_now)})
    if rank == 0 and opts.save:
        np.savez(opts.save, **weights)
    check: dict[str, Any] = {"peer": opts.peer, "net": opts.net, "rank": rank,
                             "steps": opts.check_steps, "rtol": opts.rtol, "atol": opts.atol,
                             "naive": opts.naive, "agree": True,
                             "wire16": WIRE16.get(opts.peer)}
    if opts.reference:
        with np.load(opts.reference) as ref:
            check.update(compare(weights, dict(ref), opts.rtol, opts.atol))
        # with 3+ ranks the summation order differs, and a 16-bit wire rounds every gradient:
        # the closed form decides, |Δw_S| is reported (module docstring)
        check.update(ranks=k, elementwise=check["agree"],
                     agree=check["agree"] or k >= 3 or opts.peer in WIRE16)
    if formulas:  # rank 0; also in the reference launch: mxlarge must meet eq. (10) too
        check.update(formula=formulas, formula_ok=all(f["ok"] for f in formulas),
                     lr_detect=max(f["lr_detect"] for f in formulas))
        check["agree"] = check["agree"] and check["formula_ok"]
    if not check["agree"] and not opts.expect_drift:
        print(DRIFT_MARK + json.dumps(check), flush=True)
        sys.stderr.flush()
        os._exit(DRIFT_EXIT)  # no exit barrier to wait in: the launcher ends the others
    result: dict[str, Any] = {"rank": rank, "host": socket.gethostname(), "peer": opts.peer,
                              "net": opts.net, "workers": k, "batch": opts.batch,
                              "step_batch": b, "check": check if opts.reference else None}
    if opts.expect_drift or opts.blocks == 0:
        emit_result(result)
        return

    # -- 2. timing ---------------------------------------------------------------------------
    for s in range(2):
        step(s)
    mx.nd.waitall()
    secs, cores, machine = [], [], []
    for blk in range(opts.blocks):
        (b0, j0), c0, t0 = machine_jiffies(), time.process_time(), time.perf_counter()
        for s in range(opts.steps):
            step(blk * opts.steps + s)
        mx.nd.waitall()
        wall = time.perf_counter() - t0
        (b1, j1) = machine_jiffies()
        secs.append(wall / opts.steps)
        cores.append((time.process_time() - c0) / wall)
        machine.append(os.cpu_count() * (b1 - b0) / max(j1 - j0, 1))
    split = [split_step(s) for s in range(opts.split_steps)]

    def fwd_bwd(s: int) -> None:
        x, y = batches[s % len(batches)]
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()

    floor, overlap, overlap_update = exchange_floor(
        kv, tensors, trainer.store.buckets, opts.floor_steps,
        "float16" if opts.peer in WIRE16 else "float32", fwd_bwd,
        lambda: trainer.update(b)) if opts.floor_steps else ({}, [], [])
    emit_result({**result, "sec_per_step": secs, "cores_busy": cores, "machine_busy": machine,
                 "steps_per_block": opts.steps, "fwd_bwd": [f for f, _ in split],
                 "comm_update": [c for _, c in split], "floor": floor, "overlap": overlap,
                 "overlap_update": overlap_update,
                 "lead": getattr(getattr(trainer, "store", None), "lead", None)})


def exchange_floor(kv: Any, tensors: Sequence[Any], buckets: Sequence[Any], steps: int,
                   dtype: str, fwd_bwd: Callable[[int], None], update: Callable[[], None],
                   ) -> tuple[dict[str, list[float]], list[float], list[float]]:
    """Phase 3 (module docstring): layout → seconds of each of ``steps`` bare exchanges, the
    layouts alternated exchange by exchange, every rank starting each one after a barrier;
    arrays of ``dtype`` (float16: the 16-bit wire's bytes, summed in float32 by the servers
    that its trainer put in multi-precision mode). Then the perfect-overlap bound: ``steps``
    times the equal keys' exchange issued together with a forward+backward
    (``fwd_bwd(s)``, which shares no array with it), each to ``waitall``: a step that
    computes these gradients and exchanges them through these servers on these cores, with
    nothing waiting for anything (perfect overlap, no update). Last, ``steps`` times the same
    with the trainer's update (``update()``) after the forward+backward: MXNet 1.9.1 runs a CPU
    device's operations on one engine thread, so the update cannot overlap the forward and
    backward, only the exchange; this is the bound a step can approach (perfect overlap with
    its update)."""
    layouts = {"per_tensor": BareKV(kv, [p.shape for p in tensors], FLOOR_KEYS["per_tensor"],
                                    dtype),
               # reversed: the first layers' bucket last, at priority 0, as the tensors are
               "buckets": BareKV(kv, [(b.size,) for b in reversed(buckets)],
                                 FLOOR_KEYS["buckets"], dtype),
               "even": BareKV(kv, even_sizes(sum(p.data().size for p in tensors)),
                              FLOOR_KEYS["even"], dtype)}
    for bare in layouts.values():  # warm-up: the servers' buffers of the new keys
        bare.push_pull()
    out: dict[str, list[float]] = {name: [] for name in layouts}
    for _ in range(steps):
        for name, bare in layouts.items():
            kv._barrier()
            t0 = time.perf_counter()
            bare.push_pull()
            out[name].append(time.perf_counter() - t0)
    even = layouts["even"]  # the same keys on every rank (each rank's fastest could differ)
    overlap = []
    for s in range(steps):
        kv._barrier()
        t0 = time.perf_counter()
        fwd_bwd(s)
        even.push_pull()  # ends in waitall
        overlap.append(time.perf_counter() - t0)
    with_update = []
    for s in range(steps):
        kv._barrier()
        t0 = time.perf_counter()
        fwd_bwd(s)
        update()
        even.push_pull()
        with_update.append(time.perf_counter() - t0)
    return out, overlap, with_update


def main(argv: list[str] | None = None) -> int:
    return worker_main(_parse, work, argv)


if __name__ == "__main__":
    raise SystemExit(main())
