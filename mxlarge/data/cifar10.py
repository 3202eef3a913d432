"""CIFAR-10 from the standard *binary* version (``cifar-10-batches-bin``), never downloaded.

``cfg.root`` holds ``data_batch_1.bin`` ... ``data_batch_5.bin`` (whichever exist; at least one)
and ``test_batch.bin``. Each record is 3073 bytes: the label byte, then 1024 red, 1024 green and
1024 blue bytes, each plane a row-major 32x32 image. Images stay uint8 in memory (50000 x 3072 B
= 150 MB; as float32 they would take 600 MB per worker) and are normalised per batch with
``cfg.mean``/``cfg.std`` (0-255 scale).

Augmentation (``cfg.augment``): pad 4 with black (0) pixels, random 32x32 crop, and a random
horizontal flip if ``cfg.flip``; drawn per sample from ``(seed, epoch, position)`` as described in
:mod:`mxlarge.data.sharding`.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mxlarge.config import ConfigError, DataConfig
from mxlarge.data.base import ArrayTrainSource, ArrayValSource, Data, check_num_classes

RECORD_BYTES = 1 + 3 * 32 * 32
NUM_CLASSES = 10
INPUT_SHAPE = (3, 32, 32)
PAD = 4
TEST_FILE = "test_batch.bin"
_EXPECTED = ("data_batch_1.bin ... data_batch_5.bin (at least one) and test_batch.bin, "
             "the CIFAR-10 binary version (cifar-10-batches-bin)")


def _root(cfg: DataConfig) -> Path:
    if not cfg.root:
        raise ConfigError(f"data.root = None: expected a directory with {_EXPECTED}")
    root = Path(cfg.root)
    if not root.is_dir():
        raise ConfigError(f"data.root = '{root}': no such directory; expected a directory "
                          f"with {_EXPECTED}")
    return root


def _batch_number(path: Path) -> tuple[int, str]:
    match = re.fullmatch(r"data_batch_(\d+)\.bin", path.name)
    return (int(match.group(1)) if match else 1 << 30, path.name)


def _num_records(path: Path) -> int:
    size = path.stat().st_size
    if size == 0 or size % RECORD_BYTES:
        raise ConfigError(f"{path}: size {size} bytes is not a positive multiple of the "
                          f"{RECORD_BYTES}-byte CIFAR-10 record (1 label byte + 3072 pixel "
                          "bytes); is this the binary version of CIFAR-10?")
    return size // RECORD_BYTES


def files(cfg: DataConfig) -> tuple[list[Path], Path]:
    """The training files in batch order and the test file, after checking they exist.

    Raises:
        ConfigError: naming the directory and the expected file names if some are missing.
    """
    root = _root(cfg)
    train = sorted(root.glob("data_batch_*.bin"), key=_batch_number)
    if not train:
        raise ConfigError(f"data.root = '{root}': no data_batch_*.bin found; expected "
                          f"{_EXPECTED}")
    test = root / TEST_FILE
    if not test.is_file():
        raise ConfigError(f"data.root = '{root}': {TEST_FILE} not found; expected {_EXPECTED}")
    return train, test


def train_size(cfg: DataConfig) -> int:
    """Number of training records in the existing ``data_batch_*.bin`` files (50000 for all 5)."""
    train, test = files(cfg)
    _num_records(test)
    return sum(_num_records(p) for p in train)


def read_records(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 ``(N, 3, 32, 32)`` (RGB) and labels int64 ``(N,)`` of one binary batch.

    Raises:
        ConfigError: naming the file if its size is not a multiple of 3073 or a label is not
            in 0..9.
    """
    n = _num_records(path)
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size != n * RECORD_BYTES:  # pragma: no cover - file changed while reading
        raise ConfigError(f"{path}: changed size while being read")
    raw = raw.reshape(n, RECORD_BYTES)
    labels = raw[:, 0].astype(np.int64)
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if bad.size:
        raise ConfigError(f"{path}: record {bad[0]} has label {labels[bad[0]]}, expected 0..9")
    images = np.ascontiguousarray(raw[:, 1:]).reshape(n, *INPUT_SHAPE)
    return images, labels


def _read_all(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    parts = [read_records(p) for p in paths]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def normalizer(cfg: DataConfig) -> Callable[[np.ndarray], np.ndarray]:
    """uint8 ``(n, 3, H, W)`` -> float32 ``(x - mean) / std``, elementwise in float32."""
    mean = np.asarray(cfg.mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(cfg.std, dtype=np.float32).reshape(1, 3, 1, 1)
    return lambda x: (x.astype(np.float32) - mean) / std


def build(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """CIFAR-10 training shard and test set; see :func:`mxlarge.data.build_data`."""
    check_num_classes(cfg, NUM_CLASSES)
    train_files, test_file = files(cfg)
    x_train, y_train = _read_all(train_files)
    x_val, y_val = read_records(test_file)
    norm = normalizer(cfg)
    train = ArrayTrainSource(
        x_train, y_train, normalize=norm, pad=PAD if cfg.augment else 0, fill=0,
        flip=cfg.augment and cfg.flip, rank=rank, num_workers=num_workers,
        batch_size=cfg.batch_size, seed=seed)
    return Data(train=train, val=ArrayValSource(x_val, y_val, norm), num_classes=NUM_CLASSES,
                input_shape=INPUT_SHAPE)
