"""The data contract (:class:`TrainSource`, :class:`ValSource`, :class:`Data`) and the
in-memory implementation shared by the datasets. The dataset modules import this; the package
``mxlarge.data`` imports them (never the other way round).
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mxlarge.config import ConfigError, DataConfig
from mxlarge.data import sharding

if TYPE_CHECKING:  # pragma: no cover
    import mxnet as mx

Batch = tuple["mx.nd.NDArray", "mx.nd.NDArray"]


class TrainSource(abc.ABC):
    """This rank's shard of the training set.

    Attributes:
        num_samples: training images over all ranks (N).
        steps_per_epoch: ``floor(N / (num_workers * batch_size))``, identical on every rank.
        batch_size: images per batch on this rank (Goyal's n).
        rank: this worker's rank.
        num_workers: number of workers k.
    """

    def __init__(self, *, num_samples: int, rank: int, num_workers: int, batch_size: int,
                 seed: int):
        if not 0 <= rank < num_workers:
            raise ValueError(f"rank {rank} is outside [0, {num_workers})")
        self.num_samples = num_samples
        self.rank = rank
        self.num_workers = num_workers
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = sharding.steps_per_epoch(num_samples, num_workers, batch_size)

    @abc.abstractmethod
    def epoch(self, epoch: int) -> Iterator[Batch]:
        """Yields exactly ``steps_per_epoch`` batches ``(data, label)`` for ``epoch``.

        The result depends only on ``(seed, epoch)`` and the sharding, not on earlier calls, so
        a run resumed at epoch e sees what an uninterrupted run sees.
        """


class ValSource(abc.ABC):
    """The whole validation set (not sharded).

    Attributes:
        num_samples: number of validation images.
    """

    num_samples: int

    @abc.abstractmethod
    def batches(self, batch_size: int) -> Iterator[Batch]:
        """Every validation image exactly once, in a fixed order, without augmentation.

        The last batch may be smaller than ``batch_size``.
        """


@dataclass
class Data:
    """What :func:`build_data` returns."""

    train: TrainSource
    val: ValSource
    num_classes: int
    input_shape: tuple[int, int, int]


def check_num_classes(cfg: DataConfig, actual: int) -> None:
    """Datasets with a fixed label set reject a different ``cfg.num_classes``.

    A mismatch would silently build a classifier of the wrong width.
    """
    if cfg.num_classes != actual:
        raise ConfigError(f"data.num_classes = {cfg.num_classes}: expected {actual} for "
                          f"data.dataset = {cfg.dataset!r}")


# ---------------------------------------------------------------------------------------------
# in-memory datasets (digits, cifar10)


def pad_crop_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray, pad: int,
                  fill: float) -> np.ndarray:
    """Pads every image by ``pad`` with ``fill``, crops back to its size at ``offsets``, flips.

    Each output image depends only on its own input, offset and flip: that is what makes the
    result independent of how samples are grouped into batches.

    Args:
        images: ``(n, C, H, W)``.
        offsets: int ``(n, 2)``: row and column of the crop's corner in the padded image, in
            ``[0, 2*pad]``.
        flips: bool ``(n,)``: mirror the crop left-right.
        pad: pad width on each side.
        fill: value of the padding (in the units of ``images``).

    Returns:
        ``(n, C, H, W)`` array of ``images.dtype``.
    """
    n, c, h, w = images.shape
    padded = np.full((n, c, h + 2 * pad, w + 2 * pad), fill, dtype=images.dtype)
    padded[:, :, pad:pad + h, pad:pad + w] = images
    rows = offsets[:, :1] + np.arange(h)
    cols = offsets[:, 1:2] + np.arange(w)
    cols = np.where(flips[:, None], cols[:, ::-1], cols)
    return padded[np.arange(n)[:, None, None, None], np.arange(c)[None, :, None, None],
                  rows[:, None, :, None], cols[:, None, None, :]]


def to_nd(data: np.ndarray, label: np.ndarray) -> Batch:
    """Float32 CPU NDArrays (copies, so later batches cannot alias earlier ones)."""
    import mxnet as mx
    return (mx.nd.array(data, ctx=mx.cpu(), dtype=np.float32),
            mx.nd.array(label, ctx=mx.cpu(), dtype=np.float32))


class ArrayTrainSource(TrainSource):
    """Training shard of an in-memory dataset, following the contract of :mod:`sharding`.

    Args:
        images: all training images ``(N, C, H, W)`` (any dtype ``normalize`` accepts).
        labels: ``(N,)`` class indices.
        normalize: maps a batch of ``images`` (after augmentation) to float32 network input;
            must be elementwise so batches of any composition give the same per-image values.
        pad: shift range of the pad-and-crop augmentation (0: no shift).
        fill: padding value, in the units of ``images``.
        flip: random horizontal flips.
        rank, num_workers, batch_size, seed: see :class:`TrainSource`.
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, *,
                 normalize: Callable[[np.ndarray], np.ndarray], pad: int, fill: float,
                 flip: bool, rank: int, num_workers: int, batch_size: int, seed: int):
        super().__init__(num_samples=len(images), rank=rank, num_workers=num_workers,
                         batch_size=batch_size, seed=seed)
        self.images = images
        self.labels = np.asarray(labels, dtype=np.float32)
        self.normalize = normalize
        self.pad = pad
        self.fill = fill
        self.flip = flip

    def epoch(self, epoch: int) -> Iterator[Batch]:
        n_total = self.num_samples
        perm = sharding.epoch_permutation(n_total, epoch, self.seed)
        positions = sharding.shard_positions(n_total, self.rank, self.num_workers,
                                             self.batch_size)
        # (offsets, flips) of every sample this epoch, or None without augmentation
        draws = (sharding.shift_flip_draws(n_total, epoch, self.seed, self.pad, self.flip)
                 if self.pad > 0 or self.flip else None)
        for pos in positions:
            idx = perm[pos]
            x = self.images[idx]
            if draws is not None:
                offsets, flips = draws
                x = pad_crop_flip(x, offsets[pos], flips[pos], self.pad, self.fill)
            yield to_nd(self.normalize(x), self.labels[idx])


class ArrayValSource(ValSource):
    """Validation set held in memory, served in its stored order."""

    def __init__(self, images: np.ndarray, labels: np.ndarray,
                 normalize: Callable[[np.ndarray], np.ndarray]):
        self.images = images
        self.labels = np.asarray(labels, dtype=np.float32)
        self.normalize = normalize
        self.num_samples = len(images)

    def batches(self, batch_size: int) -> Iterator[Batch]:
        if batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: expected >= 1")
        for start in range(0, self.num_samples, batch_size):
            sl = slice(start, start + batch_size)
            yield to_nd(self.normalize(self.images[sl]), self.labels[sl])
