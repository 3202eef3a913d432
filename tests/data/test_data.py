"""Data pipeline: sharding contract, digits, synthetic, CIFAR-10 binary and RecordIO (real data)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from mxlarge.config import ConfigError, DataConfig
from mxlarge.data import Data, build_data, pad_crop_flip, sharding, train_size
from mxlarge.data import tiny as datagen

MEAN = np.array((123.68, 116.779, 103.939), dtype=np.float32)
STD = np.array((58.393, 57.12, 57.375), dtype=np.float32)


def epoch_np(data: Data, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.asnumpy(), y.asnumpy()) for x, y in data.train.epoch(epoch)]


def val_np(data: Data, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.asnumpy(), y.asnumpy()) for x, y in data.val.batches(batch_size)]


def assert_k_equivalent(cfg: DataConfig, k: int, n: int, epoch: int = 0, seed: int = 3) -> None:
    """k workers with batch n, concatenated per step == 1 worker with batch k*n, bitwise."""
    one = build_data(DataConfig(**{**cfg.__dict__, "batch_size": k * n}), rank=0, num_workers=1,
                     seed=seed)
    ref = epoch_np(one, epoch)
    shards = [epoch_np(build_data(DataConfig(**{**cfg.__dict__, "batch_size": n}), rank=r,
                                  num_workers=k, seed=seed), epoch) for r in range(k)]
    assert all(len(s) == len(ref) == one.train.steps_per_epoch for s in shards)
    for t, (x_ref, y_ref) in enumerate(ref):
        x = np.concatenate([s[t][0] for s in shards])
        y = np.concatenate([s[t][1] for s in shards])
        assert x.dtype == np.float32 and x.tobytes() == x_ref.tobytes(), f"step {t} data differs"
        assert np.array_equal(y, y_ref), f"step {t} labels differ"


# ---------------------------------------------------------------------------------------------
# sharding


@pytest.mark.parametrize("num_samples,n", [(37, 1), (37, 3), (100, 4), (101, 5)])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_shards_disjoint_equal_covering_and_match_one_worker(num_samples, n, k):
    steps = num_samples // (k * n)
    shards = [sharding.shard_indices(num_samples, 2, 7, r, k, n) for r in range(k)]
    for s in shards:
        assert s.shape == (steps, n) and s.dtype.kind == "i"
    flat = np.concatenate([s.ravel() for s in shards])
    assert len(np.unique(flat)) == len(flat) == steps * k * n  # disjoint, none dropped but tail
    perm = sharding.epoch_permutation(num_samples, 2, 7)
    assert set(flat) == set(perm[:steps * k * n])
    one = sharding.shard_indices(num_samples, 2, 7, 0, 1, k * n)
    for t in range(steps):
        assert np.array_equal(np.concatenate([s[t] for s in shards]), one[t])


def test_epoch_order_depends_only_on_seed_and_epoch():
    a = sharding.epoch_permutation(50, 0, 1)
    assert np.array_equal(a, sharding.epoch_permutation(50, 0, 1))
    assert not np.array_equal(a, sharding.epoch_permutation(50, 1, 1))
    assert not np.array_equal(a, sharding.epoch_permutation(50, 0, 2))
    assert sorted(a) == list(range(50))


def test_shift_flip_draws_ranges_and_flip_independence():
    off, flips = sharding.shift_flip_draws(1000, 3, 0, 4, flip=True)
    assert off.shape == (1000, 2) and off.min() == 0 and off.max() == 8
    assert 0.4 < flips.mean() < 0.6
    off2, no_flips = sharding.shift_flip_draws(1000, 3, 0, 4, flip=False)
    assert np.array_equal(off, off2) and not no_flips.any()


def test_pad_crop_flip_matches_a_loop():
    rng = np.random.RandomState(0)
    x = rng.randint(0, 255, size=(5, 3, 6, 7)).astype(np.uint8)
    off = rng.randint(0, 5, size=(5, 2))
    flips = np.array([True, False, True, False, False])
    out = pad_crop_flip(x, off, flips, 2, 9)
    for i in range(5):
        padded = np.pad(x[i], ((0, 0), (2, 2), (2, 2)), constant_values=9)
        want = padded[:, off[i, 0]:off[i, 0] + 6, off[i, 1]:off[i, 1] + 7]
        assert np.array_equal(out[i], want[:, :, ::-1] if flips[i] else want)


@pytest.mark.parametrize("num_samples,k", [(10, 4), (9, 4), (40, 3), (1281167, 256)])
def test_recordio_part_sizes(num_samples, k):
    sizes = sharding.recordio_part_sizes(num_samples, k)
    assert sum(sizes) == num_samples and len(sizes) == k
    assert sizes[0] == -(-num_samples // k)


# ---------------------------------------------------------------------------------------------
# digits


def test_digits_shapes_split_and_normalisation():
    cfg = DataConfig(dataset="digits", batch_size=32, augment=False)
    assert train_size(cfg) == 1400
    data = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert data.input_shape == (1, 8, 8) and data.num_classes == 10
    assert data.train.num_samples == 1400 and data.val.num_samples == 397
    assert data.train.steps_per_epoch == 1400 // 32
    batches = epoch_np(data, 0)
    assert len(batches) == 43
    for x, y in batches:
        assert x.shape == (32, 1, 8, 8) and x.dtype == np.float32
        assert y.shape == (32,) and y.dtype == np.float32
    x = np.concatenate([b[0] for b in batches])
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05  # train-set standardisation
    val = val_np(data, 100)
    assert [len(v[1]) for v in val] == [100, 100, 100, 97]
    labels = np.concatenate([v[1] for v in val])
    assert set(labels) == set(range(10))
    # validation is deterministic and unaugmented
    again = val_np(build_data(cfg, rank=0, num_workers=1, seed=5), 397)
    assert np.array_equal(again[0][0], np.concatenate([v[0] for v in val]))


def test_digits_split_is_the_fixed_seed_0_permutation():
    from sklearn.datasets import load_digits

    from mxlarge.data import digits
    x_train, y_train, x_val, y_val, mean, std = digits.load_split()
    bunch = load_digits()
    raw = bunch.data.reshape(-1, 1, 8, 8) / 16.0
    order = np.random.RandomState(0).permutation(1797)
    assert np.allclose(x_train * std + mean, raw[order[:1400]], atol=1e-5)
    assert np.allclose(x_val * std + mean, raw[order[1400:]], atol=1e-5)
    assert np.array_equal(y_train, bunch.target[order[:1400]])
    assert np.array_equal(y_val, bunch.target[order[1400:]])
    assert mean == pytest.approx(raw[order[:1400]].mean())


def test_digits_deterministic_and_epochs_differ():
    cfg = DataConfig(dataset="digits", batch_size=50)
    a = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=1), 0)
    b = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=1), 0)
    c = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=1), 1)
    for p, q in zip(a, b, strict=True):
        assert np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1])
    assert not np.array_equal(a[0][1], c[0][1])


def test_digits_augmentation_is_a_one_pixel_shift():
    plain = build_data(DataConfig(dataset="digits", batch_size=1400, augment=False), rank=0,
                       num_workers=1, seed=4)
    aug = build_data(DataConfig(dataset="digits", batch_size=1400, augment=True), rank=0,
                     num_workers=1, seed=4)
    (x0, y0), = epoch_np(plain, 0)
    (x1, y1), = epoch_np(aug, 0)
    assert np.array_equal(y0, y1)  # same order: augmentation does not consume the order stream
    fill = x0.min()  # the standardised value of a 0 pixel (digits have blank borders)
    shifted = 0
    for a, b in zip(x0, x1, strict=True):
        padded = np.pad(a, ((0, 0), (1, 1), (1, 1)), constant_values=fill)
        crops = [padded[:, i:i + 8, j:j + 8] for i in range(3) for j in range(3)]
        assert any(np.array_equal(b, c) for c in crops)
        shifted += not np.array_equal(a, b)
    assert shifted > 1000


@pytest.mark.parametrize("k,n", [(2, 16), (3, 8), (4, 5)])
def test_digits_k_workers_equal_one_worker_bitwise(k, n):
    assert_k_equivalent(DataConfig(dataset="digits", augment=True), k, n, epoch=1)


def test_digits_rejects_other_class_count():
    with pytest.raises(ConfigError, match="num_classes"):
        build_data(DataConfig(dataset="digits", num_classes=100), rank=0, num_workers=1, seed=0)


def test_global_batch_larger_than_data():
    with pytest.raises(ConfigError, match="larger than the 1400"):
        build_data(DataConfig(dataset="digits", batch_size=800), rank=0, num_workers=2, seed=0)


# ---------------------------------------------------------------------------------------------
# synthetic


def test_synthetic_shapes_and_determinism():
    cfg = DataConfig(dataset="synthetic", batch_size=4, image_size=16, synthetic_train=50,
                     synthetic_val=13, num_classes=7)
    assert train_size(cfg) == 50
    data = build_data(cfg, rank=0, num_workers=1, seed=2)
    assert data.input_shape == (3, 16, 16) and data.num_classes == 7
    batches = epoch_np(data, 0)
    assert len(batches) == data.train.steps_per_epoch == 12
    for x, y in batches:
        assert x.shape == (4, 3, 16, 16) and x.dtype == np.float32 and y.dtype == np.float32
        assert ((0 <= y) & (y < 7) & (y == np.round(y))).all()
    again = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=2), 0)
    assert all(np.array_equal(p[0], q[0]) for p, q in zip(batches, again, strict=True))
    other = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=3), 0)
    assert not np.array_equal(batches[0][0], other[0][0])
    val = val_np(data, 5)
    assert [len(v[1]) for v in val] == [5, 5, 3]
    assert np.array_equal(val[0][0], val_np(data, 13)[0][0][:5])
    # validation samples are not training samples
    train_first = {x.tobytes() for b in batches for x in b[0]}
    assert not train_first & {x.tobytes() for v in val for x in v[0]}


def test_synthetic_k_workers_equal_one_worker_bitwise():
    cfg = DataConfig(dataset="synthetic", image_size=8, synthetic_train=40, synthetic_val=4)
    assert_k_equivalent(cfg, 2, 5)


# ---------------------------------------------------------------------------------------------
# cifar10


@pytest.fixture
def cifar_root(tmp_path: Path) -> Path:
    datagen.make_cifar10(tmp_path / "cifar", train_counts=(30, 30), test_count=20)
    return tmp_path / "cifar"


def _cifar_index(image_0_255: np.ndarray) -> int:
    # pattern(i)[0, 0, 0] = 7*i mod 256 and 7 is invertible mod 256 (7 * 183 = 1281 = 5*256+1)
    return int(image_0_255[0, 0, 0]) * 183 % 256


def test_cifar10_decodes_exactly(cifar_root):
    cfg = DataConfig(dataset="cifar10", root=str(cifar_root), batch_size=6, augment=False)
    assert train_size(cfg) == 60
    data = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert data.input_shape == (3, 32, 32) and data.num_classes == 10
    assert data.val.num_samples == 20 and data.train.num_samples == 60
    val = val_np(data, 8)
    assert [len(v[1]) for v in val] == [8, 8, 4]
    x = np.concatenate([v[0] for v in val])
    y = np.concatenate([v[1] for v in val])
    pixels = x * STD[None, :, None, None] + MEAN[None, :, None, None]  # undo normalisation
    for i in range(20):
        assert np.abs(pixels[i] - datagen.cifar_pattern(60 + i)).max() < 1e-3
        assert y[i] == (60 + i) % 10
    # one known pixel through the exact formula: red channel, row 2, column 3 of test image 0
    p = datagen.cifar_pattern(60)[0, 2, 3]
    assert x[0, 0, 2, 3] == pytest.approx((p - 123.68) / 58.393, abs=1e-5)
    # training set: every record once per epoch (batch 6 x 10 steps = 60), labels decoded
    seen = []
    for xb, yb in epoch_np(data, 0):
        for img, lab in zip(xb, yb, strict=True):
            raw = np.round(img * STD[:, None, None] + MEAN[:, None, None])
            i = _cifar_index(raw)
            assert np.array_equal(raw, datagen.cifar_pattern(i)) and lab == i % 10
            seen.append(i)
    assert sorted(seen) == list(range(60))


def test_cifar10_augmentation_pad_crop_flip(cifar_root):
    cfg = DataConfig(dataset="cifar10", root=str(cifar_root), batch_size=60, augment=True)
    (x, y), = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=9), 0)
    plain, = epoch_np(build_data(DataConfig(**{**cfg.__dict__, "augment": False}), rank=0,
                                 num_workers=1, seed=9), 0)
    fill = (0 - MEAN) / STD  # padding is black
    flipped = 0
    for a, b in zip(plain[0], x, strict=True):
        padded = np.stack([np.pad(a[c], 4, constant_values=fill[c]) for c in range(3)])
        match = [(i, j, f) for i, j, f in itertools.product(range(9), range(9), (False, True))
                 if np.allclose(b, padded[:, i:i + 32, j:j + 32][:, :, ::-1 if f else 1])]
        assert match
        flipped += match[0][2]
    assert 10 < flipped < 50


def test_cifar10_k_workers_equal_one_worker_bitwise(cifar_root):
    assert_k_equivalent(DataConfig(dataset="cifar10", root=str(cifar_root)), 3, 4)


def test_cifar10_reads_whichever_batches_exist(tmp_path):
    files = datagen.make_cifar10(tmp_path, train_counts=(5, 6, 7), test_count=3)
    (tmp_path / "data_batch_2.bin").unlink()
    cfg = DataConfig(dataset="cifar10", root=str(tmp_path), batch_size=12, augment=False)
    assert train_size(cfg) == 12
    data = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert data.train.num_samples == 12
    labels = sorted(epoch_np(data, 0)[0][1].tolist())
    want = np.concatenate([files["data_batch_1.bin"][1], files["data_batch_3.bin"][1]])
    assert labels == sorted(want.tolist())


def test_cifar10_errors(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match=r"nope.*no such directory.*data_batch_1\.bin"):
        train_size(DataConfig(dataset="cifar10", root=str(missing)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"empty.*no data_batch_\*\.bin.*test_batch\.bin"):
        build_data(DataConfig(dataset="cifar10", root=str(empty)), rank=0, num_workers=1, seed=0)
    datagen.make_cifar10(tmp_path / "notest", train_counts=(3,), test_count=2)
    (tmp_path / "notest" / "test_batch.bin").unlink()
    with pytest.raises(ConfigError, match=r"notest.*test_batch\.bin not found"):
        train_size(DataConfig(dataset="cifar10", root=str(tmp_path / "notest")))
    bad = tmp_path / "bad"
    datagen.make_cifar10(bad, train_counts=(3,), test_count=2)
    with open(bad / "data_batch_1.bin", "ab") as f:
        f.write(b"\0" * 5)
    with pytest.raises(ConfigError, match=r"data_batch_1\.bin: size 9224 bytes is not"):
        build_data(DataConfig(dataset="cifar10", root=str(bad)), rank=0, num_workers=1, seed=0)
    label = tmp_path / "label"
    datagen.make_cifar10(label, train_counts=(3,), test_count=2)
    raw = bytearray((label / "test_batch.bin").read_bytes())
    raw[datagen.CIFAR_RECORD] = 12  # label byte of record 1
    (label / "test_batch.bin").write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=r"test_batch\.bin: record 1 has label 12"):
        build_data(DataConfig(dataset="cifar10", root=str(label), batch_size=3), rank=0,
                   num_workers=1, seed=0)


# ---------------------------------------------------------------------------------------------
# imagenet (RecordIO through ImageRecordIter)


@pytest.fixture(scope="module")
def rec(tmp_path_factory) -> dict:
    return datagen.make_imagenet(tmp_path_factory.mktemp("rec"), num_train=40, num_val=12)


def rec_cfg(rec: dict, **kw) -> DataConfig:
    base = dict(dataset="imagenet", train_rec=rec["train_rec"], val_rec=rec["val_rec"],
                image_size=32, resize=36, batch_size=4, num_classes=40, threads=1)
    return DataConfig(**{**base, **kw})


def expected_solid(colours: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Normalised (n, 3) colours of the records whose labels (= record numbers) are given."""
    return (colours[labels.astype(int)].astype(np.float32) - MEAN) / STD


def test_imagenet_train_batches_are_normalised_crops(rec):
    cfg = rec_cfg(rec)
    assert train_size(cfg) == 40
    data = build_data(cfg, rank=0, num_workers=1, seed=0)
    assert data.input_shape == (3, 32, 32) and data.num_classes == 40
    assert data.train.steps_per_epoch == 10
    batches = epoch_np(data, 0)
    assert len(batches) == 10
    for x, y in batches:
        assert x.shape == (4, 3, 32, 32) and x.dtype == np.float32 and y.shape == (4,)
        want = expected_solid(rec["train_colours"], y)
        # solid colour in, so every pixel of any crop is (v - mean) / std (JPEG: +-2 levels)
        assert np.abs(x - want[:, :, None, None]).max() < 2.5 / 57
    labels = np.concatenate([b[1] for b in batches])
    assert sorted(labels.tolist()) == list(range(40))  # shuffled, each record once
    assert labels.tolist() != list(range(40))


@pytest.mark.parametrize("flip", [True, False])
def test_imagenet_random_resized_crop_and_mirror_happen(tmp_path, flip):
    # 24 copies of a 60x80 image whose red channel grows left to right: a crop shows a slice of
    # the ramp (its span measures the crop width), a mirror makes it fall instead
    ramp = np.zeros((60, 80, 3), np.uint8)
    ramp[:, :, 0] = np.arange(80) * 3
    rec_path, _ = datagen.make_recordio(tmp_path / "ramp.rec", [ramp] * 24, np.arange(24))
    cfg = DataConfig(dataset="imagenet", train_rec=str(rec_path), val_rec=str(rec_path),
                     image_size=16, batch_size=24, num_classes=24, threads=1, flip=flip)
    (x, _), = epoch_np(build_data(cfg, rank=0, num_workers=1, seed=0), 0)
    red = x[:, 0].mean(axis=1) * STD[0] + MEAN[0]  # (24, 16) mean red per output column
    slope = red[:, -1] - red[:, 0]
    falling = int((slope < 0).sum())
    assert (0 < falling < 24) if flip else falling == 0
    span = np.abs(slope)
    assert span.max() - span.min() > 30  # crops of different widths
    assert span.max() < 3 * 80  # never the whole-image ramp plus padding


def test_imagenet_order_is_seeded_per_epoch(rec):
    data = build_data(rec_cfg(rec), rank=0, num_workers=1, seed=0)
    a, b, c = epoch_np(data, 0), epoch_np(data, 0), epoch_np(data, 1)
    assert all(np.array_equal(p[1], q[1]) for p, q in zip(a, b, strict=True))
    assert all(np.array_equal(p[0], q[0]) for p, q in zip(a, b, strict=True))  # same epoch
    assert not all(np.array_equal(p[1], q[1]) for p, q in zip(a, c, strict=True))
    other = epoch_np(build_data(rec_cfg(rec), rank=0, num_workers=1, seed=1), 0)
    assert not all(np.array_equal(p[1], q[1]) for p, q in zip(a, other, strict=True))


def _ramp_epoch(tmp_path, seed: int, epoch: int, threads: int) -> np.ndarray:
    """Epoch ``epoch`` of identical ramp images (so the pixels show only the crop/flip draws),
    24 records, batches of 6."""
    path = tmp_path / "ramp.rec"
    if not path.exists():
        ramp = np.zeros((60, 80, 3), np.uint8)
        ramp[:, :, 0] = np.arange(80) * 3
        datagen.make_recordio(path, [ramp] * 24, np.arange(24))
    cfg = DataConfig(dataset="imagenet", train_rec=str(path), val_rec=str(path), image_size=16,
                     batch_size=6, num_classes=24, threads=threads)
    data = build_data(cfg, rank=0, num_workers=1, seed=seed)
    return np.concatenate([x for x, _ in epoch_np(data, epoch)])


def test_imagenet_augmentation_depends_on_seed_and_epoch_and_not_on_threads(tmp_path):
    """The crop/flip draws change with ``train.seed`` and with the epoch, and replay bitwise for
    the same (seed, epoch) with 1 or 3 decoding threads."""
    a = _ramp_epoch(tmp_path, seed=0, epoch=0, threads=1)
    assert np.array_equal(a, _ramp_epoch(tmp_path, seed=0, epoch=0, threads=1))
    assert np.array_equal(a, _ramp_epoch(tmp_path, seed=0, epoch=0, threads=3))
    assert not np.allclose(a, _ramp_epoch(tmp_path, seed=1, epoch=0, threads=1), atol=0.05)
    assert not np.allclose(a, _ramp_epoch(tmp_path, seed=0, epoch=1, threads=1), atol=0.05)
    # what seed_aug costs (imagenet.py): position j of every batch of an epoch repeats its draw
    batches = a.reshape(4, 6, *a.shape[1:])
    assert all(np.array_equal(batches[0], b) for b in batches[1:])
    assert not np.allclose(batches[0][0], batches[0][1], atol=0.05)


def test_imagenet_batches_do_not_alias(rec):
    data = build_data(rec_cfg(rec), rank=0, num_workers=1, seed=0)
    held = list(data.train.epoch(0))  # NDArrays kept while iterating on
    labels = np.concatenate([y.asnumpy() for _, y in held])
    assert len(set(labels.tolist())) == 40
    import mxnet as mx
    assert all(x.context == mx.cpu() for x, _ in held)


def test_imagenet_validation_covers_every_record_once(rec):
    data = build_data(rec_cfg(rec), rank=0, num_workers=1, seed=0)
    assert data.val.num_samples == 12
    for bs, sizes in ((5, [5, 5, 2]), (4, [4, 4, 4]), (12, [12]), (50, [12])):
        val = val_np(data, bs)
        assert [len(v[1]) for v in val] == sizes
        labels = np.concatenate([v[1] for v in val])
        assert labels.tolist() == list(range(12))  # file order, no repeats from the pad
        x = np.concatenate([v[0] for v in val])
        want = expected_solid(rec["val_colours"], labels)
        assert np.abs(x - want[:, :, None, None]).max() < 2.5 / 57


@pytest.mark.parametrize("k,n", [(2, 4), (4, 3), (7, 1)])
def test_imagenet_ranks_take_equal_steps_from_their_parts(rec, k, n):
    steps = 40 // (k * n)
    sizes = sharding.recordio_part_sizes(40, k)
    starts = np.cumsum([0, *sizes])
    per_rank = []
    for r in range(k):
        data = build_data(rec_cfg(rec, batch_size=n), rank=r, num_workers=k, seed=0)
        assert data.train.steps_per_epoch == steps
        batches = epoch_np(data, 0)
        assert len(batches) == steps and all(b[0].shape == (n, 3, 32, 32) for b in batches)
        labels = np.concatenate([b[1] for b in batches]).astype(int)
        # ImageRecordIter's part r: a contiguous block of records
        assert ((starts[r] <= labels) & (labels < starts[r + 1])).all()
        per_rank.append(labels)
    if k * n * steps <= 40 and all(s >= steps * n for s in sizes):
        flat = np.concatenate(per_rank)
        assert len(set(flat.tolist())) == len(flat)  # disjoint when no part wraps
    if k == 7:  # the last part holds 4 records but must yield 5 batches: it wraps around
        assert sizes[-1] == 4 and len(per_rank[-1]) == 5


def test_imagenet_part_smaller_than_batch(rec):
    with pytest.raises(ConfigError, match="part of 4 records"):
        build_data(rec_cfg(rec, batch_size=5), rank=0, num_workers=7, seed=0)


def test_imagenet_missing_files(rec, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.train_rec = .*missing\.rec"):
        train_size(rec_cfg(rec, train_rec=str(tmp_path / "missing.rec")))
    lonely = tmp_path / "lonely.rec"
    lonely.write_bytes(Path(rec["train_rec"]).read_bytes())
    with pytest.raises(ConfigError, match=r"lonely\.idx does not exist"):
        build_data(rec_cfg(rec, train_rec=str(lonely)), rank=0, num_workers=1, seed=0)
    with pytest.raises(ConfigError, match=r"data\.val_rec = None"):
        build_data(rec_cfg(rec, val_rec=None), rank=0, num_workers=1, seed=0)
    with pytest.raises(ConfigError, match=r"data\.val_rec = .*gone\.rec"):
        build_data(rec_cfg(rec, val_rec=str(tmp_path / "gone.rec")), rank=0, num_workers=1,
                   seed=0)
