"""Synthetic ImageNet-shaped data, generated per batch: throughput runs without a dataset.

Sample ``i`` of a split is drawn from its own generator keyed by ``(seed, split, i)``, so any
sample can be produced on any rank in O(1) without materialising the set (1.28M x 3x224x224
float32 would be 770 GB). Its label is uniform in ``[0, num_classes)``; its image is noise plus
a small per-class, per-channel offset (:data:`SIGNAL`), so that a smoke run can show the loss
falling, while the noise dominates and, as in real data, a model must average over the image to
find the class. The noise is uniform with zero mean and unit variance rather than Gaussian
because NumPy draws float32 uniforms about five times faster (about 0.5 ms per 224x224 image),
which keeps this source from bottlenecking throughput runs.

The training order follows :mod:`mxlarge.data.sharding` like the other in-memory datasets.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from mxlarge.config import DataConfig
from mxlarge.data import sharding
from mxlarge.data.base import Batch, Data, TrainSource, ValSource, to_nd

SIGNAL = 0.5
_SPLIT_TRAIN = 0
_SPLIT_VAL = 1
_CLASS_STREAM = 2
# uniform on [-0.5, 0.5) times sqrt(12) has variance 1
_UNIT_VARIANCE = np.float32(np.sqrt(12.0))


class SyntheticSet:
    """Deterministic random images of one split.

    Args:
        num_samples: size of the split.
        image_size: side S of the (3, S, S) images.
        num_classes: labels are in ``[0, num_classes)``.
        seed: run seed.
        split: 0 for training, 1 for validation (distinct samples).
    """

    def __init__(self, num_samples: int, image_size: int, num_classes: int, seed: int,
                 split: int):
        self.num_samples = num_samples
        self.shape = (3, image_size, image_size)
        self.num_classes = num_classes
        self.seed = seed
        self.split = split
        # Shared by both splits, so a model fitted on training data transfers to validation.
        rng = np.random.default_rng([seed, _CLASS_STREAM])
        self.class_offsets = (SIGNAL * rng.standard_normal((num_classes, 3))).astype(np.float32)

    def sample(self, index: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
        """Image float32 ``(3, S, S)`` (written into ``out`` if given) and label of ``index``."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside [0, {self.num_samples})")
        rng = np.random.default_rng([self.seed, self.split, int(index)])
        label = int(rng.integers(self.num_classes))
        image = np.empty(self.shape, dtype=np.float32) if out is None else out
        rng.random(out=image, dtype=np.float32)
        image -= np.float32(0.5)
        image *= _UNIT_VARIANCE
        image += self.class_offsets[label][:, None, None]
        return image, label

    def batch(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images ``(n, 3, S, S)`` and labels ``(n,)`` of ``indices``."""
        data = np.empty((len(indices), *self.shape), dtype=np.float32)
        labels = np.empty(len(indices), dtype=np.float32)
        for j, i in enumerate(indices):
            labels[j] = self.sample(int(i), out=data[j])[1]
        return data, labels


class SyntheticTrain(TrainSource):
    """This rank's shard of the synthetic training set."""

    def __init__(self, dataset: SyntheticSet, *, rank: int, num_workers: int, batch_size: int,
                 seed: int):
        super().__init__(num_samples=dataset.num_samples, rank=rank, num_workers=num_workers,
                         batch_size=batch_size, seed=seed)
        self.dataset = dataset

    def epoch(self, epoch: int) -> Iterator[Batch]:
        idx = sharding.shard_indices(self.num_samples, epoch, self.seed, self.rank,
                                     self.num_workers, self.batch_size)
        for row in idx:
            yield to_nd(*self.dataset.batch(row))


class SyntheticVal(ValSource):
    """The synthetic validation set in index order."""

    def __init__(self, dataset: SyntheticSet):
        self.dataset = dataset
        self.num_samples = dataset.num_samples

    def batches(self, batch_size: int) -> Iterator[Batch]:
        if batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: expected >= 1")
        for start in range(0, self.num_samples, batch_size):
            stop = min(start + batch_size, self.num_samples)
            yield to_nd(*self.dataset.batch(np.arange(start, stop)))


def build(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """Synthetic training shard and validation set; see :func:`mxlarge.data.build_data`."""
    s = cfg.image_size
    train_set = SyntheticSet(cfg.synthetic_train, s, cfg.num_classes, seed, _SPLIT_TRAIN)
    val_set = SyntheticSet(cfg.synthetic_val, s, cfg.num_classes, seed, _SPLIT_VAL)
    train = SyntheticTrain(train_set, rank=rank, num_workers=num_workers,
                           batch_size=cfg.batch_size, seed=seed)
    return Data(train=train, val=SyntheticVal(val_set), num_classes=cfg.num_classes,
                input_shape=(3, s, s))
