"""Which sample each rank sees at each step, and the per-sample random draws (pure NumPy).

The contract that makes a k-worker run equal to a one-process run with a k-times larger batch:

* epoch ``e`` uses ONE global permutation of the training set, the same on every rank, drawn
  from ``(seed, e)`` only;
* global step ``t`` is the slice ``perm[t*k*n:(t+1)*k*n]`` (``k`` workers, ``n`` images per
  worker), and rank ``r`` takes the sub-slice ``[r*n:(r+1)*n]`` of it; the trailing partial
  global batch is dropped so that every rank takes ``floor(N / (k*n))`` steps;
* a sample's random augmentation is drawn from ``(seed, e, position of the sample in the global
  order)``; rank and ``k`` never enter, so the concatenation over ranks of the step-``t`` input
  tensors is bitwise what one process with batch ``k*n`` builds at step ``t``.
"""
from __future__ import annotations

import numpy as np

# Distinct streams drawn from the same (seed, epoch): changing how one is consumed must never
# shift the other.
_STREAM_ORDER = 0
_STREAM_AUGMENT = 1
_STREAM_RECORDIO = 2
_STREAM_RECORDIO_AUG = 3


def derive_seed(seed: int, epoch: int, stream: int) -> int:
    """A 32-bit seed from ``(seed, epoch, stream)``, well mixed by NumPy's SeedSequence.

    Mixing (rather than e.g. ``seed + epoch``) keeps runs with seeds 0 and 1 from sharing all
    but one epoch's order.
    """
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    return int(np.random.SeedSequence([seed, epoch, stream]).generate_state(1)[0])


def steps_per_epoch(num_samples: int, num_workers: int, batch_size: int) -> int:
    """``floor(num_samples / (num_workers * batch_size))``: identical on every rank."""
    if num_workers < 1 or batch_size < 1:
        raise ValueError(f"num_workers and batch_size must be >= 1, "
                         f"got {num_workers} and {batch_size}")
    return num_samples // (num_workers * batch_size)


def epoch_permutation(num_samples: int, epoch: int, seed: int) -> np.ndarray:
    """The global order of the training samples in ``epoch``, the same on every rank."""
    rng = np.random.RandomState(derive_seed(seed, epoch, _STREAM_ORDER))
    return rng.permutation(num_samples)


def shard_positions(num_samples: int, rank: int, num_workers: int,
                    batch_size: int) -> np.ndarray:
    """Positions in the global order that ``rank`` reads, shape ``(steps, batch_size)``.

    Position ``p`` of step ``t`` on rank ``r`` is ``t*k*n + r*n + j``; these index both the
    epoch permutation and the per-position augmentation draws.
    """
    if not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} is outside [0, {num_workers})")
    steps = steps_per_epoch(num_samples, num_workers, batch_size)
    global_batch = num_workers * batch_size
    step_start = np.arange(steps, dtype=np.int64)[:, None] * global_batch
    return step_start + rank * batch_size + np.arange(batch_size, dtype=np.int64)[None, :]


def shard_indices(num_samples: int, epoch: int, seed: int, rank: int, num_workers: int,
                  batch_size: int) -> np.ndarray:
    """Sample indices that ``rank`` reads in ``epoch``, shape ``(steps_per_epoch, batch_size)``.

    Row ``t`` is rank ``rank``'s share of global batch ``t``. Shards of different ranks are
    disjoint and equal in size, and concatenating row ``t`` over ranks ``0..k-1`` gives row
    ``t`` of ``shard_indices(..., rank=0, num_workers=1, batch_size=k*n)``.
    """
    perm = epoch_permutation(num_samples, epoch, seed)
    return perm[shard_positions(num_samples, rank, num_workers, batch_size)]


def shift_flip_draws(num_samples: int, epoch: int, seed: int, max_shift: int,
                     flip: bool) -> tuple[np.ndarray, np.ndarray]:
    """Random crop offsets and flips for every POSITION of ``epoch``'s global order.

    Drawing the whole epoch at once keeps the draw of position ``p`` independent of which rank
    reads it and of the batch size (O(N) small integers per epoch, negligible next to decoding).

    Args:
        num_samples: training set size N.
        epoch: epoch number.
        seed: run seed.
        max_shift: the pad width; offsets are uniform in ``[0, 2*max_shift]``.
        flip: whether to draw horizontal flips (else all False).

    Returns:
        ``(offsets, flips)``: int64 ``(N, 2)`` (row, column offset into the padded image) and
        bool ``(N,)``, both indexed by position.
    """
    rng = np.random.RandomState(derive_seed(seed, epoch, _STREAM_AUGMENT))
    offsets = rng.randint(0, 2 * max_shift + 1, size=(num_samples, 2)).astype(np.int64)
    # Drawn even when unused so that turning flips on or off does not move the offsets.
    flips = rng.randint(0, 2, size=num_samples).astype(bool)
    return offsets, (flips if flip else np.zeros(num_samples, dtype=bool))


def recordio_seed(seed: int, epoch: int) -> int:
    """Seed of ImageRecordIter's within-part shuffle for ``epoch`` (its ``seed`` is a C int)."""
    return derive_seed(seed, epoch, _STREAM_RECORDIO) & 0x7FFFFFFF


def recordio_aug_seed(seed: int, epoch: int, rank: int) -> int:
    """ImageRecordIter's ``seed_aug`` for ``epoch`` on ``rank``: < 2^30, because MXNet adds the
    position in the batch (and 111) to it in a C int."""
    return int(np.random.SeedSequence([seed, epoch, _STREAM_RECORDIO_AUG, rank])
               .generate_state(1)[0]) & 0x3FFFFFFF


def recordio_part_sizes(num_samples: int, num_parts: int) -> list[int]:
    """Record counts of ImageRecordIter's ``num_parts`` parts of an indexed .rec.

    dmlc-core's IndexedRecordIOSplitter gives each part ``ceil(N / num_parts)`` consecutive
    records and the last part the remainder, so the parts are unequal and a trailing part can
    even be empty (e.g. N=9, 4 parts: 3, 3, 3, 0), which the C++ code does not handle.
    """
    step = -(-num_samples // num_parts)
    return [max(0, min(num_samples, (r + 1) * step) - r * step) for r in range(num_parts)]
