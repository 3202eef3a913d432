"""MNIST-1D: generated with mnist1d.make_dataset only, cached by its arguments, sharded exactly."""
from __future__ import annotations

import random

import numpy as np
import pytest

from mxlarge.config import ConfigError, DataConfig, config_from_dict
from mxlarge.data import build_data, mnist1d, train_size
from tests.data.test_data import assert_k_equivalent, epoch_np, val_np


def _cfg(tmp_path, **kw) -> DataConfig:
    base = dict(dataset="mnist1d", augment=False, batch_size=8, mnist1d_train=300,
                mnist1d_val=100, cache_dir=str(tmp_path))
    return DataConfig(**{**base, **kw})


def test_default_split_is_the_packages_standard_dataset(tmp_path):
    """4,000 / 1,000 equals make_dataset's own 0.8 split of its default 5,000 samples."""
    from mnist1d.data import get_dataset_args, make_dataset

    state = np.random.get_state()
    ref = make_dataset(get_dataset_args())  # the package default: 5000 samples, split 0.8
    np.random.set_state(state)
    x_train, y_train, x_val, y_val = mnist1d.generate(4000, 1000)
    assert np.array_equal(x_train, ref["x"].astype(np.float32))
    assert np.array_equal(x_val, ref["x_test"].astype(np.float32))
    assert np.array_equal(y_train, ref["y"]) and np.array_equal(y_val, ref["y_test"])


def test_generation_is_deterministic_and_leaves_global_generators_alone():
    np.random.seed(123)
    random.seed(7)
    np_before, py_before = np.random.get_state()[1].copy(), random.getstate()
    a = mnist1d.generate(200, 50)
    assert np.array_equal(np.random.get_state()[1], np_before)
    assert random.getstate() == py_before
    b = mnist1d.generate(200, 50)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    assert a[0].shape == (200, 40) and a[2].shape == (50, 40) and a[0].dtype == np.float32
    assert set(np.concatenate([a[1], a[3]])) == set(range(10))


def test_shapes_sizes_and_validation_order(tmp_path):
    cfg = _cfg(tmp_path, batch_size=32, mnist1d_train=600, mnist1d_val=150)
    assert train_size(cfg) == 600
    data = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert data.input_shape == (1, 1, 40) and data.num_classes == 10
    assert data.train.num_samples == 600 and data.val.num_samples == 150
    batches = epoch_np(data, 0)
    assert len(batches) == 600 // 32 == data.train.steps_per_epoch
    assert all(x.shape == (32, 1, 1, 40) and x.dtype == np.float32 and y.shape == (32,)
               for x, y in batches)
    _, _, x_val, y_val = mnist1d.generate(600, 150)
    (xv, yv), = val_np(data, 150)
    assert np.array_equal(xv[:, 0, 0], x_val) and np.array_equal(yv, y_val)
    # training batches are the generated training samples in the epoch's order
    x_train, y_train, _, _ = mnist1d.generate(600, 150)
    from mxlarge.data import sharding
    idx = sharding.shard_indices(600, 0, 0, 0, 1, 32)
    assert np.array_equal(batches[3][0][:, 0, 0], x_train[idx[3]])
    assert np.array_equal(batches[3][1], y_train[idx[3]])


def test_cache_is_keyed_by_the_arguments_written_once_and_read_back(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    other = _cfg(tmp_path, mnist1d_train=290, mnist1d_val=110)
    assert mnist1d.cache_key(300, 100) != mnist1d.cache_key(290, 110)
    assert mnist1d.cache_path(cfg) != mnist1d.cache_path(other)
    first = build_data(cfg, rank=0, num_workers=1, seed=0)
    path = mnist1d.cache_path(cfg)
    assert path.is_file() and [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp left
    # a fresh process (empty in-memory cache) reads the file instead of generating
    mnist1d.load.cache_clear()

    def no_generation(*_):
        raise AssertionError("generated although the cache file exists")

    monkeypatch.setattr(mnist1d, "generate", no_generation)
    again = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert np.array_equal(first.train.images, again.train.images)
    assert np.array_equal(first.val.labels, again.val.labels)


def test_damaged_cache_file_is_regenerated(tmp_path):
    cfg = _cfg(tmp_path)
    good = build_data(cfg, rank=0, num_workers=1, seed=0).train.images.copy()
    mnist1d.load.cache_clear()
    path = mnist1d.cache_path(cfg)
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert np.array_equal(build_data(cfg, rank=0, num_workers=1, seed=0).train.images, good)
    mnist1d.load.cache_clear()
    assert mnist1d._read(path, 300, 100) is not None  # rewritten whole


@pytest.mark.parametrize("k,n", [(2, 16), (4, 8), (3, 5)])
def test_k_workers_equal_one_worker_bitwise(tmp_path, k, n):
    assert_k_equivalent(_cfg(tmp_path), k, n, epoch=2)


def test_an_epoch_depends_only_on_seed_and_epoch(tmp_path):
    """What resume relies on: epoch 2 straight after epochs 0, 1 equals epoch 2 of a new source."""
    cfg = _cfg(tmp_path)
    data = build_data(cfg, rank=1, num_workers=2, seed=4)
    epoch_np(data, 0), epoch_np(data, 1)
    fresh = build_data(cfg, rank=1, num_workers=2, seed=4)
    for (x, y), (x2, y2) in zip(epoch_np(data, 2), epoch_np(fresh, 2), strict=True):
        assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert not np.array_equal(epoch_np(fresh, 3)[0][1], epoch_np(fresh, 2)[0][1])


def test_config_refuses_augmentation_and_uneven_class_counts():
    with pytest.raises(ConfigError, match=r"data.augment = True: expected false .*mnist1d"):
        config_from_dict({"data": {"dataset": "mnist1d"}})
    with pytest.raises(ConfigError, match=r"mnist1d_val = 4005: expected a multiple of 10"):
        config_from_dict({"data": {"dataset": "mnist1d", "augment": False, "mnist1d_val": 5}})
    with pytest.raises(ConfigError, match="num_classes"):
        build_data(DataConfig(dataset="mnist1d", augment=False, num_classes=5), rank=0,
                   num_workers=1, seed=0)
