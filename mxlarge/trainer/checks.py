"""The Trainer's first-step checks: mistakes a migrated script makes that train silently
wrong.

* every worker reads the same data: the first gradients of all k workers are bitwise equal,
  so the job trains k identical copies (:func:`checksum`, :func:`warn_if_unsharded`);
* ``step(k·n)`` on k workers, gluon's ``step(batch_size * num_workers)``: here the mean is over
  the k·n global batch already, so the steps would be k times smaller (:func:`warn_if_global`);
* a global batch below ``reference_batch``: the LR is scaled down, and the warmup starts at
  the scaled LR instead of ramping down to it (:func:`note_scaled_down`).

Each says so once, on kvstore rank 0, on stderr.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import mxnet as mx
import numpy as np


def checksum(grads: Sequence[mx.nd.NDArray]) -> mx.nd.NDArray:
    """(Σ sums, Σ norms) of this worker's gradients, as float32; taken before the
    exchange overwrites them (the engine orders the read)."""
    grads = [g if g.dtype == np.float32 else g.astype(np.float32) for g in grads]
    return mx.nd.concat(mx.nd.add_n(*[g.sum() for g in grads]),
                        mx.nd.add_n(*[g.norm() for g in grads]), dim=0)


def warn_if_unsharded(mine: Any, collectives: Any) -> None:
    """Warns (rank 0) when every rank's :func:`checksum` is bitwise ``mine``
    (collective: one exact gather)."""
    k = collectives.num_workers
    if not collectives.same_on_every_rank(mine) or collectives.rank != 0:
        return
    print(f"mxlarge.Trainer (kvstore rank 0 of {k}): warning: the first gradients of all {k} "
          "workers are bitwise equal: every worker reads the same data, so the job trains "
          f"{k} identical copies. Give each worker its own part: "
          "mx.io.ImageRecordIter(..., num_parts=trainer.num_workers, "
          "part_index=trainer.rank), or a DataLoader with a split sampler "
          "(gluoncv.data.sampler.SplitSampler(len(dataset), num_parts=trainer.num_workers, "
          "part_index=trainer.rank))", file=sys.stderr, flush=True)


def warn_if_global(batch_size: int, fixed: int | None, workers: int, rank: int) -> bool:
    """Warns (rank 0) when ``step(b)`` gets b = k·n, n the batch the schedule was
    ``fixed`` for; returns whether b was k·n (so the caller stops comparing)."""
    if workers < 2 or fixed is None or batch_size != workers * fixed:
        return False
    if rank == 0:
        print(f"mxlarge.Trainer (kvstore rank 0 of {workers}): warning: step({batch_size}) is "
              f"{workers}x the batch of {fixed} the schedule was fixed for (batch_size=, or the "
              "first step's): step(n) takes this worker's own n (the mean is over the "
              f"{workers}*n global batch already), so these steps are {workers}x smaller",
              file=sys.stderr, flush=True)
    return True


def note_scaled_down(note: str | None, workers: int, rank: int) -> None:
    """Says (rank 0) :func:`mxlarge.plan.scaled_down`'s ``note``, if any."""
    if note is None or rank != 0:
        return
    who = f"mxlarge.Trainer (kvstore rank 0 of {workers})" if workers > 1 else "mxlarge.Trainer"
    print(f"{who}: note: {note}", file=sys.stderr, flush=True)
