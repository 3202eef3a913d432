"""scikit-learn's 8x8 handwritten digits: a real, download-free dataset for tests and smoke runs.

1797 images of 10 classes, split by a fixed permutation (seed 0) into 1400 training and 397
validation images. Pixels (0..16) are scaled to [0, 1] and then standardised with the mean and
std of the 1400 training images (one channel; ``cfg.mean``/``cfg.std`` are for 0-255 RGB and do
not apply). Augmentation (``cfg.augment``): a random shift of up to one pixel (zero-pad 1, random
8x8 crop); no flip, which would turn digits into other shapes.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from mxlarge.config import DataConfig
from mxlarge.data.base import ArrayTrainSource, ArrayValSource, Data, check_num_classes

NUM_IMAGES = 1797
NUM_TRAIN = 1400
NUM_VAL = NUM_IMAGES - NUM_TRAIN
NUM_CLASSES = 10
INPUT_SHAPE = (1, 8, 8)
SPLIT_SEED = 0
SHIFT = 1


@functools.lru_cache(maxsize=1)
def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float]:
    """The fixed split, standardised: ``(x_train, y_train, x_val, y_val, mean, std)``.

    Images are float32 ``(N, 1, 8, 8)``; labels int64; ``mean``/``std`` are of the raw /16
    training pixels. Cached: every rank and every call sees the same read-only arrays.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (bunch.data.reshape(-1, *INPUT_SHAPE) / 16.0).astype(np.float32)
    labels = bunch.target.astype(np.int64)
    if len(images) != NUM_IMAGES:  # pragma: no cover - a different scikit-learn dataset
        raise RuntimeError(f"load_digits() returned {len(images)} images, expected {NUM_IMAGES}")
    order = np.random.RandomState(SPLIT_SEED).permutation(NUM_IMAGES)
    train = order[:NUM_TRAIN]
    val = order[NUM_TRAIN:]
    mean = float(images[train].mean(dtype=np.float64))
    std = float(images[train].std(dtype=np.float64))
    norm = _normalizer(mean, std)
    out = (norm(images[train]), labels[train], norm(images[val]), labels[val])
    for arr in out:
        arr.flags.writeable = False
    return (*out, mean, std)


def _normalizer(mean: float, std: float) -> Callable[[np.ndarray], np.ndarray]:
    mean32 = np.float32(mean)
    std32 = np.float32(std)
    return lambda x: (x - mean32) / std32


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def build(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """Digits training shard and validation set; see :func:`mxlarge.data.build_data`."""
    check_num_classes(cfg, NUM_CLASSES)
    x_train, y_train, x_val, y_val, mean, std = load_split()
    # Images are stored standardised, so the zero padding is the standardised value of 0.
    fill = float(_normalizer(mean, std)(np.zeros((), dtype=np.float32)))
    train = ArrayTrainSource(
        x_train, y_train, normalize=_identity, pad=SHIFT if cfg.augment else 0, fill=fill,
        flip=False, rank=rank, num_workers=num_workers, batch_size=cfg.batch_size, seed=seed)
    val = ArrayValSource(x_val, y_val, _identity)
    return Data(train=train, val=val, num_classes=NUM_CLASSES, input_shape=INPUT_SHAPE)
