"""Tiny datasets in the real on-disk formats, generated in a test's tmp_path (no downloads).

* :func:`make_cifar10` writes CIFAR-10 binary batches (``data_batch_*.bin``, ``test_batch.bin``).
* :func:`make_recordio` packs JPEGs into an indexed RecordIO ``.rec``/``.idx`` pair as
  ``im2rec.py`` would; :func:`make_imagenet` makes a train and a val pair of solid-colour images.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

CIFAR_RECORD = 1 + 3 * 32 * 32


def cifar_pattern(index: int) -> np.ndarray:
    """A known uint8 ``(3, 32, 32)`` RGB image: every (channel, row, column) distinguishable."""
    c, y, x = np.meshgrid(np.arange(3), np.arange(32), np.arange(32), indexing="ij")
    return ((index * 7 + c * 85 + y * 5 + x * 3) % 256).astype(np.uint8)


def write_cifar_batch(path: str | Path, images: np.ndarray, labels: Sequence[int] | np.ndarray,
                      ) -> Path:
    """Writes ``images`` (uint8 ``(N, 3, 32, 32)``, RGB) and labels as one binary batch file.

    Record layout: 1 label byte, then the R, G and B planes (1024 bytes each, row-major).
    """
    images = np.asarray(images, dtype=np.uint8)
    label_bytes = np.asarray(labels, dtype=np.uint8)
    assert images.shape[1:] == (3, 32, 32) and len(images) == len(label_bytes)
    records = np.concatenate([label_bytes[:, None], images.reshape(len(images), -1)], axis=1)
    path = Path(path)
    path.write_bytes(records.tobytes())
    return path


def make_cifar10(root: str | Path, train_counts: Sequence[int] = (30, 30), test_count: int = 20,
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Writes ``data_batch_1.bin``.. (one per count) and ``test_batch.bin`` into ``root``.

    Image ``i`` (numbered across all files, training first) is :func:`cifar_pattern` ``(i)``
    with label ``i % 10``.

    Returns:
        ``{file name: (images, labels)}`` of what was written.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i + 1}.bin" for i in range(len(train_counts))] + ["test_batch.bin"]
    out = {}
    start = 0
    for name, count in zip(names, [*train_counts, test_count], strict=True):
        idx = np.arange(start, start + count)
        images = np.stack([cifar_pattern(int(i)) for i in idx]) if count else np.zeros(
            (0, 3, 32, 32), np.uint8)
        labels = idx % 10
        write_cifar_batch(root / name, images, labels)
        out[name] = (images, labels)
        start += count
    return out


def make_recordio(rec_path: str | Path, images: Sequence[np.ndarray],
                  labels: Sequence[float] | np.ndarray, quality: int = 100) -> tuple[Path, Path]:
    """Packs RGB uint8 ``(H, W, 3)`` images as JPEGs into ``rec_path`` and its ``.idx``.

    Record ``i`` has key ``i`` and header label ``labels[i]``.
    """
    import mxnet as mx

    rec_path = Path(rec_path)
    idx_path = rec_path.with_suffix(".idx")
    writer = mx.recordio.MXIndexedRecordIO(str(idx_path), str(rec_path), "w")
    try:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            header = mx.recordio.IRHeader(0, float(label), i, 0)
            # pack_img encodes with OpenCV, which takes BGR; ImageRecordIter decodes to RGB.
            bgr = np.ascontiguousarray(np.asarray(image, dtype=np.uint8)[:, :, ::-1])
            writer.write_idx(i, mx.recordio.pack_img(header, bgr, quality=quality,
                                                     img_fmt=".jpg"))
    finally:
        writer.close()
    return rec_path, idx_path


def solid_images(count: int, sizes: Sequence[tuple[int, int]] = ((48, 64), (70, 40)),
                 seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    """``count`` solid-colour RGB images, cycling through ``sizes`` (height, width).

    Returns:
        ``(images, colours)`` with colours uint8 ``(count, 3)``.
    """
    colours = np.random.RandomState(seed).randint(0, 256, size=(count, 3)).astype(np.uint8)
    images = [np.broadcast_to(colours[i], (*sizes[i % len(sizes)], 3)).copy()
              for i in range(count)]
    return images, colours


def make_imagenet(root: str | Path, num_train: int = 40, num_val: int = 12,
                  num_classes: int | None = None, seed: int = 0) -> dict[str, object]:
    """A tiny ImageNet-like pair ``train.rec``/``val.rec`` (+ ``.idx``) of solid-colour JPEGs.

    Labels are ``i % num_classes``, or the record number ``i`` if ``num_classes`` is None (so a
    test can tell records apart by label).

    Returns:
        dict with ``train_rec``, ``val_rec`` (str paths) and ``train_colours``,
        ``val_colours``, ``train_labels``, ``val_labels`` (arrays).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, object] = {}
    for split, count, split_seed in (("train", num_train, seed), ("val", num_val, seed + 1)):
        images, colours = solid_images(count, seed=split_seed)
        ids = np.arange(count)
        labels = ids if num_classes is None else ids % num_classes
        rec, _ = make_recordio(root / f"{split}.rec", images, labels)
        out[f"{split}_rec"] = str(rec)
        out[f"{split}_colours"] = colours
        out[f"{split}_labels"] = labels.astype(np.float32)
    return out
