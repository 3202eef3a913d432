"""ImageNet (or any labelled image set) from indexed RecordIO, read by ``mx.io.ImageRecordIter``.

``cfg.train_rec`` and ``cfg.val_rec`` are ``.rec`` files packed by ``im2rec.py`` (or
``mx.recordio.MXIndexedRecordIO`` + ``pack_img``); each needs its ``.idx`` beside it (same path,
``.idx`` instead of ``.rec``). The record header's label is the class.

Training follows Goyal et al. / He et al.: random-resized crop with area fraction in
``cfg.scale`` and aspect ratio in ``cfg.ratio``, resized to ``(3, S, S)`` (bilinear), random
horizontal flip if ``cfg.flip``, then ``(x - mean) / std``. Validation: shorter side resized to
``cfg.resize``, centre ``S x S`` crop, same normalisation.

Sharding differs from the in-memory datasets, because ImageRecordIter cannot read an arbitrary
index list: rank ``r`` of ``k`` reads ImageRecordIter's part ``r`` (``num_parts=k,
part_index=r``), a CONTIGUOUS block of ``ceil(N / k)`` records (the last part holds the rest, so
parts are unequal), shuffled within the part each epoch with a seed derived from ``(seed,
epoch)``. Every rank still yields exactly ``floor(N / (k * n))`` batches per epoch: a part that
runs out first (only the last part can, and it lacks fewer than ``k`` records) wraps around to
a fresh shuffle of itself, so a few of its records are seen twice in that epoch. So a k-worker
run is statistically, not bitwise, equivalent to one process with batch ``k * n``; pack the
.rec in random order (``im2rec.py --shuffle``), or a rank's part would hold only a few classes.

Augmentation draws: without ``seed_aug`` ImageRecordIter seeds each decoding thread's generator
with a constant ((thread + 1) · 111, iter_image_recordio_2.cc), so the draws ignore the seed,
replay every epoch (one iterator is built per epoch), and with ``cfg.threads > 1`` depend on
which thread decodes which record (a race). Here ``seed_aug`` is set per epoch and rank from
``(seed, epoch, rank)``: MXNet then re-seeds the generator before each record with
``seed_aug + j + 111``, j the record's position in its batch, so the draws depend on the seed,
are fresh every epoch, and are reproducible bitwise whatever ``cfg.threads``. The price: within
one epoch, position j of every batch gets the same crop area, aspect ratio, crop offset draw and
flip (applied to different images); the n draws of a batch are distinct, and an image's draw
changes from epoch to epoch because both its position and ``seed_aug`` do.

So a RecordIO run is reproducible (and resume is exact) given the same seed, worker count and
batch size; it is equivalent to one process only statistically (contiguous parts, above).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mxlarge.config import ConfigError, DataConfig
from mxlarge.data import sharding
from mxlarge.data.base import Batch, Data, TrainSource, ValSource


def rec_paths(rec: str | None, key: str) -> tuple[Path, Path]:
    """``(path.rec, path.idx)`` after checking that both files exist.

    Raises:
        ConfigError: naming the config key and the missing path.
    """
    if not rec:
        raise ConfigError(f"{key} = None: expected the path of an indexed RecordIO .rec file "
                          "(with its .idx beside it) when data.dataset is imagenet")
    rec_path = Path(rec)
    if not rec_path.is_file():
        raise ConfigError(f"{key} = '{rec}': no such file {rec_path}")
    idx_path = rec_path.with_suffix(".idx")
    if not idx_path.is_file():
        raise ConfigError(f"{key} = '{rec}': its index {idx_path} does not exist; create it "
                          "with im2rec.py or mx.recordio.MXIndexedRecordIO")
    return rec_path, idx_path


_MAGIC = 0xCED7230A  # dmlc RecordIO record header
_SAMPLE = 1000  # record headers checked per file (first, last and an even spread)


def check_records(rec_path: Path, idx_path: Path) -> int:
    """Counts the records of an indexed ``.rec`` after checking that the pair is intact.

    A truncated or corrupt pair would otherwise abort the process inside MXNet's C++ reader
    (no Python exception). Checked: every ``.idx`` line is ``key<TAB>offset`` with an offset
    inside the ``.rec``; at up to 1,000 offsets (always the first and the last) the header
    carries the RecordIO magic and the record fits in the file.

    Raises:
        ConfigError: naming the file, the line or offset, and what was expected.
    """
    size = rec_path.stat().st_size
    offsets = []
    with open(idx_path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            parts = line.split()
            try:
                offset = int(parts[1])
            except (IndexError, ValueError):
                raise ConfigError(f"{idx_path}: line {lineno} is {line[:60]!r}: expected "
                                  "'key<TAB>offset' (a RecordIO index)") from None
            if not 0 <= offset < size:
                raise ConfigError(f"{idx_path}: line {lineno} points at byte {offset} but "
                                  f"{rec_path} has {size} bytes (truncated .rec or a .idx "
                                  "of another file)")
            offsets.append(offset)
    if not offsets:
        raise ConfigError(f"{idx_path}: the index lists no records")
    ordered = sorted(offsets)
    step = max(1, len(ordered) // _SAMPLE)
    sample = sorted(set(ordered[::step] + [ordered[-1]]))
    with open(rec_path, "rb") as f:
        for offset in sample:
            f.seek(offset)
            head = f.read(8)
            magic = int.from_bytes(head[:4], "little") if len(head) == 8 else None
            if magic != _MAGIC:
                raise ConfigError(f"{rec_path}: no RecordIO record at byte {offset} (listed in "
                                  f"{idx_path}): corrupt .rec or mismatched .idx")
            length = int.from_bytes(head[4:], "little") & ((1 << 29) - 1)
            if offset + 8 + length > size:
                raise ConfigError(f"{rec_path}: the record at byte {offset} needs "
                                  f"{8 + length} bytes but the file ends at {size}: the .rec "
                                  "is truncated")
    return len(offsets)


def train_size(cfg: DataConfig) -> int:
    """Number of records in ``cfg.train_rec`` (read from its ``.idx``, pair checked)."""
    return check_records(*rec_paths(cfg.train_rec, "data.train_rec"))


def _normalize_kwargs(cfg: DataConfig) -> dict[str, Any]:
    (mr, mg, mb) = cfg.mean
    (sr, sg, sb) = cfg.std
    return dict(mean_r=mr, mean_g=mg, mean_b=mb, std_r=sr, std_g=sg, std_b=sb)


def _copy(batch: Any, n: int | None = None) -> Batch:
    """Owned float32 copies on ``mx.cpu()`` of the first ``n`` samples of an iterator batch.

    ImageRecordIter hands out views of buffers it recycles (with ``ctx='cpu'`` every batch is
    the same buffer) that live on ``cpu_pinned(0)`` even in CPU builds; a copy on ``cpu(0)``
    neither aliases later batches nor mixes contexts with the network's parameters.
    """
    import mxnet as mx
    data = batch.data[0]
    label = batch.label[0]
    if n is not None and n < data.shape[0]:
        data = data[:n]
        label = label[:n]
    out = (data.copyto(mx.cpu()), label.reshape((-1,)).copyto(mx.cpu()))
    # Wait, so that the source buffer may be recycled as soon as we ask for the next batch.
    for arr in out:
        arr.wait_to_read()
    return out


class RecordTrain(TrainSource):
    """This rank's ImageRecordIter part of the training set (see the module docstring)."""

    def __init__(self, cfg: DataConfig, rec: Path, idx: Path, num_samples: int, *, rank: int,
                 num_workers: int, seed: int):
        super().__init__(num_samples=num_samples, rank=rank, num_workers=num_workers,
                         batch_size=cfg.batch_size, seed=seed)
        self.cfg = cfg
        self.rec = rec
        self.idx = idx
        self.part_size = sharding.recordio_part_sizes(num_samples, num_workers)[rank]
        smallest = min(sharding.recordio_part_sizes(num_samples, num_workers))
        # A part smaller than one batch makes ImageRecordIter abort the process (CHECK failure
        # in its round-robin fill); an empty part is undefined behaviour in dmlc-core.
        if smallest < cfg.batch_size:
            raise ConfigError(
                f"data.train_rec = '{rec}': its {num_samples} records split into "
                f"{num_workers} ImageRecordIter parts leave a part of {smallest} records, fewer "
                f"than data.batch_size = {cfg.batch_size}")

    def make_iter(self, epoch: int) -> Any:
        """A fresh ImageRecordIter for ``epoch`` (shuffle seeded by ``(seed, epoch)``)."""
        import mxnet as mx
        cfg = self.cfg
        s = cfg.image_size
        return mx.io.ImageRecordIter(
            path_imgrec=str(self.rec), path_imgidx=str(self.idx), data_shape=(3, s, s),
            batch_size=cfg.batch_size, label_width=1,
            shuffle=True, seed=sharding.recordio_seed(self.seed, epoch),
            seed_aug=sharding.recordio_aug_seed(self.seed, epoch, self.rank),
            num_parts=self.num_workers, part_index=self.rank,
            random_resized_crop=True,
            min_random_area=cfg.scale[0], max_random_area=cfg.scale[1],
            min_aspect_ratio=cfg.ratio[0], max_aspect_ratio=cfg.ratio[1],
            rand_mirror=cfg.flip, preprocess_threads=cfg.threads,
            # round_batch: a part's last partial batch is filled from the start of its next
            # shuffle, so every yielded batch is full (and batch.pad is then correct).
            round_batch=True, verbose=False, **_normalize_kwargs(cfg))

    def epoch(self, epoch: int) -> Iterator[Batch]:
        it = self.make_iter(epoch)
        done = 0
        empty_passes = 0
        while done < self.steps_per_epoch:
            try:
                batch = it.next()
            except StopIteration:
                empty_passes += 1
                if empty_passes > 1:  # pragma: no cover - guarded by the part-size check
                    raise RuntimeError(f"{self.rec}: part {self.rank} yielded no batch") from None
                it.reset()
                continue
            empty_passes = 0
            yield _copy(batch)
            done += 1


class RecordVal(ValSource):
    """The whole validation .rec in file order, each record exactly once."""

    def __init__(self, cfg: DataConfig, rec: Path, idx: Path, num_samples: int):
        self.cfg = cfg
        self.rec = rec
        self.idx = idx
        self.num_samples = num_samples

    def batches(self, batch_size: int) -> Iterator[Batch]:
        import mxnet as mx
        if batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: expected >= 1")
        cfg = self.cfg
        s = cfg.image_size
        # ImageRecordIter aborts if the set is smaller than a batch.
        batch_size = min(batch_size, self.num_samples)
        # round_batch=True although no sample should repeat: with round_batch=False MXNet 1.9
        # reports pad = 0 for the short last batch (it computes the pad after overwriting the
        # size), so the padded slots (stale data) could not be told apart. With round_batch the
        # last batch is topped up from the start and batch.pad counts those extra samples.
        it = mx.io.ImageRecordIter(
            path_imgrec=str(self.rec), path_imgidx=str(self.idx), data_shape=(3, s, s),
            batch_size=batch_size, label_width=1, shuffle=False, resize=cfg.resize,
            rand_crop=False, rand_mirror=False, preprocess_threads=cfg.threads,
            round_batch=True, verbose=False, **_normalize_kwargs(cfg))
        seen = 0
        for batch in it:
            n = min(batch_size - batch.pad, self.num_samples - seen)
            if n <= 0:
                break
            yield _copy(batch, n)
            seen += n


def build(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """RecordIO training shard and validation set; see :func:`mxlarge.data.build_data`."""
    train_rec, train_idx = rec_paths(cfg.train_rec, "data.train_rec")
    val_rec, val_idx = rec_paths(cfg.val_rec, "data.val_rec")
    train = RecordTrain(cfg, train_rec, train_idx, check_records(train_rec, train_idx),
                        rank=rank, num_workers=num_workers, seed=seed)
    val = RecordVal(cfg, val_rec, val_idx, check_records(val_rec, val_idx))
    s = cfg.image_size
    return Data(train=train, val=val, num_classes=cfg.num_classes, input_shape=(3, s, s))
