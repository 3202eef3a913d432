"""MNIST-1D (Greydanus 2020, package ``mnist1d``, MIT): generated locally, cached on disk.

Each sample is a 40-point 1-D signal made from one of 10 digit templates by the package's own
random transforms (pad, dilate, scale, circular translate, correlated and iid noise, shear,
subsample); the whole set is then centred and scaled to unit variance (the package's
definition, statistics over train and validation together). Only ``mnist1d.make_dataset`` is
called: never ``get_dataset``, whose default path downloads a pickle.

Size: ``make_dataset`` draws ``num_samples // 10`` samples per class, then shuffles them with
seed 42; mxlarge asks for ``data.mnist1d_train + data.mnist1d_val`` samples and takes the first
``mnist1d_train`` as training set and the rest as validation set. With the defaults
(4,000 / 1,000) that is exactly the package's standard split (``train_split = 0.8`` of 5,000).

Layout: signals are served as ``(N, 1, 1, 40)`` float32, i.e. ``(C, H, W)`` with ``H = 1``, so
that a 1-D net can run its convolutions as 2-D ones with ``(1, k)`` kernels (see
:mod:`mxlarge.nets.resnet1d` for why).

Augmentation: none. The generator's transforms already make every sample a random variation of
its template; there is no cheap, label-preserving online transform of the finished 40-point
signal that would not duplicate them (a shift of the subsampled signal is not the generator's
translation). ``data.augment`` must be false; more variety comes from more samples
(``data.mnist1d_train``).

Cache: ``<cache dir>/mnist1d-<key>.npz`` with ``key`` = sha256 of the generator's arguments,
the split sizes and the package version, written to a temporary file and renamed (a crash never
leaves half a file, and concurrent sweeps that generate the same set both write the same bytes).
The cache dir is ``data.cache_dir``, else ``$XDG_CACHE_HOME/mxlarge``, else
``~/.cache/mxlarge``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from mxlarge.config import DataConfig
from mxlarge.data.base import ArrayTrainSource, ArrayValSource, Data, check_num_classes

NUM_CLASSES = 10
SEQ_LEN = 40
INPUT_SHAPE = (1, 1, SEQ_LEN)
#: The package's default generator arguments (``mnist1d.data.get_dataset_args``), spelled out so
#: that the cache key and the data cannot change silently with a new package default. The split
#: is mxlarge's (``train_split = 1``, then split by count).
GENERATOR_ARGS: dict[str, Any] = {
    "train_split": 1.0, "template_len": 12, "padding": [36, 60], "scale_coeff": 0.4,
    "max_translation": 48, "corr_noise_scale": 0.25, "iid_noise_scale": 2e-2,
    "shear_scale": 0.75, "shuffle_seq": False, "final_seq_length": SEQ_LEN, "seed": 42}
_FORMAT = 1  # bump when the file layout changes


def cache_dir(cfg: DataConfig) -> Path:
    """``data.cache_dir``, else ``$XDG_CACHE_HOME/mxlarge``, else ``~/.cache/mxlarge``."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "mxlarge"


def cache_key(num_train: int, num_val: int) -> str:
    """sha256 (hex) of everything that determines the generated arrays."""
    spec = {"generator": GENERATOR_ARGS, "num_train": num_train, "num_val": num_val,
            "mnist1d": metadata.version("mnist1d"), "format": _FORMAT}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def cache_path(cfg: DataConfig) -> Path:
    return cache_dir(cfg) / f"mnist1d-{cache_key(cfg.mnist1d_train, cfg.mnist1d_val)[:16]}.npz"


def generate(num_train: int, num_val: int) -> tuple[np.ndarray, ...]:
    """``(x_train, y_train, x_val, y_val)`` from ``mnist1d.make_dataset``; x float32 (N, 40).

    ``make_dataset`` reseeds Python's and NumPy's global generators; their states are restored
    afterwards so that generating (or not, when cached) cannot change anything else in the run.
    """
    from mnist1d.data import make_dataset
    from mnist1d.utils import ObjectView

    total = num_train + num_val
    if total % NUM_CLASSES:
        raise ValueError(f"num_train + num_val = {total}: expected a multiple of {NUM_CLASSES}")
    np_state = np.random.get_state()
    py_state = random.getstate()
    try:
        ds = make_dataset(ObjectView({**GENERATOR_ARGS, "num_samples": total}))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    x = ds["x"].astype(np.float32)
    y = ds["y"].astype(np.int64)
    if x.shape != (total, SEQ_LEN):  # pragma: no cover - another mnist1d
        raise RuntimeError(f"mnist1d.make_dataset returned {x.shape}, expected ({total}, 40)")
    return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


def _read(path: Path, num_train: int, num_val: int) -> tuple[np.ndarray, ...] | None:
    """The cached arrays, or None if the file is missing or not what the key promises."""
    try:
        # our own handle: np.load leaks its file when the archive is damaged
        with path.open("rb") as fh, np.load(fh, allow_pickle=False) as f:
            arrays = tuple(f[k] for k in ("x_train", "y_train", "x_val", "y_val"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None
    shapes = [a.shape for a in arrays]
    if shapes != [(num_train, SEQ_LEN), (num_train,), (num_val, SEQ_LEN), (num_val,)]:
        return None
    return arrays


def _write(path: Path, arrays: tuple[np.ndarray, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, **dict(zip(("x_train", "y_train", "x_val", "y_val"), arrays)))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@functools.lru_cache(maxsize=4)
def load(num_train: int, num_val: int, path: Path) -> tuple[np.ndarray, ...]:
    """``(x_train, y_train, x_val, y_val)`` from the cache file ``path``, else generated and
    written there.

    x is float32 ``(N, 1, 1, 40)``, y int64; read-only (shared by every call).
    """
    arrays = _read(path, num_train, num_val)
    if arrays is None:  # missing, or damaged by something other than mxlarge: regenerate
        arrays = generate(num_train, num_val)
        _write(path, arrays)
    x_train, y_train, x_val, y_val = arrays
    out = (x_train.reshape(-1, *INPUT_SHAPE).astype(np.float32), y_train.astype(np.int64),
           x_val.reshape(-1, *INPUT_SHAPE).astype(np.float32), y_val.astype(np.int64))
    for arr in out:
        arr.flags.writeable = False
    return out


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def build(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """MNIST-1D training shard and validation set; see :func:`mxlarge.data.build_data`."""
    check_num_classes(cfg, NUM_CLASSES)
    x_train, y_train, x_val, y_val = load(cfg.mnist1d_train, cfg.mnist1d_val, cache_path(cfg))
    train = ArrayTrainSource(x_train, y_train, normalize=_identity, pad=0, fill=0.0, flip=False,
                             rank=rank, num_workers=num_workers, batch_size=cfg.batch_size,
                             seed=seed)
    return Data(train=train, val=ArrayValSource(x_val, y_val, _identity),
                num_classes=NUM_CLASSES, input_shape=INPUT_SHAPE)
