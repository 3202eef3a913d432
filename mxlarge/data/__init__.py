"""Training and validation data, sharded over dist_sync workers (Goyal et al. 2017, sec. 3).

Public interface::

    train_size(cfg) -> int
    build_data(cfg, rank=..., num_workers=..., seed=...) -> Data(train, val, num_classes,
                                                                 input_shape)

``Data.train`` is this rank's shard: ``TrainSource.epoch(e)`` yields exactly
``steps_per_epoch`` batches of ``(data float32 (n, C, H, W), label float32 (n,))`` on the CPU,
where ``n = cfg.batch_size`` and ``steps_per_epoch = floor(N / (num_workers * n))`` is the same on
every rank. ``Data.val`` is the whole validation set, never sharded.

For the in-memory datasets (digits, mnist1d, synthetic, cifar10) the order and the augmentation
follow :mod:`mxlarge.data.sharding`: k workers with batch n see, step by step, exactly the tensors
that one process with batch k*n sees. ImageNet RecordIO cannot (see :mod:`mxlarge.data.imagenet`).

MXNet is imported inside functions: a ps-lite scheduler/server process must not have imported
anything heavy before ``import mxnet``, and the data modules are imported by tools that do not
need it.
"""
from __future__ import annotations

from mxlarge.config import ConfigError, DataConfig
from mxlarge.data import sharding
from mxlarge.data.base import (
    ArrayTrainSource,
    ArrayValSource,
    Batch,
    Data,
    TrainSource,
    ValSource,
    check_num_classes,
    pad_crop_flip,
    to_nd,
)

__all__ = ["ArrayTrainSource", "ArrayValSource", "Batch", "Data", "TrainSource", "ValSource",
           "build_data", "check_num_classes", "pad_crop_flip", "sharding", "to_nd", "train_size"]


def train_size(cfg: DataConfig) -> int:
    """Number of training images of ``cfg.dataset`` (over all ranks), read cheaply.

    Raises:
        ConfigError: if the dataset's files are missing or malformed.
    """
    if cfg.dataset == "digits":
        from mxlarge.data import digits
        return digits.NUM_TRAIN
    if cfg.dataset == "synthetic":
        return cfg.synthetic_train
    if cfg.dataset == "mnist1d":
        return cfg.mnist1d_train
    if cfg.dataset == "cifar10":
        from mxlarge.data import cifar10
        return cifar10.train_size(cfg)
    if cfg.dataset == "imagenet":
        from mxlarge.data import imagenet
        return imagenet.train_size(cfg)
    raise ConfigError(f"data.dataset = {cfg.dataset!r}: expected one of digits, synthetic, "
                      "cifar10, imagenet, mnist1d")


def build_data(cfg: DataConfig, *, rank: int, num_workers: int, seed: int) -> Data:
    """Builds this rank's training shard and the full validation set.

    Args:
        cfg: the data section of the experiment config.
        rank: this worker's rank in ``[0, num_workers)``.
        num_workers: number of workers k (each with batch ``cfg.batch_size``).
        seed: run seed; with the epoch number it fixes the order and the augmentation.

    Raises:
        ConfigError: missing or malformed files, or a global batch larger than the training set.
    """
    if num_workers < 1 or not 0 <= rank < num_workers:
        raise ValueError(f"rank {rank} / num_workers {num_workers}: expected "
                         "0 <= rank < num_workers")
    if seed < 0:
        raise ValueError(f"seed = {seed}: expected >= 0")
    n_train = train_size(cfg)
    if sharding.steps_per_epoch(n_train, num_workers, cfg.batch_size) < 1:
        raise ConfigError(
            f"data.batch_size = {cfg.batch_size}: with {num_workers} worker(s) the global batch "
            f"{num_workers * cfg.batch_size} is larger than the {n_train} training images of "
            f"'{cfg.dataset}'")
    kw = dict(rank=rank, num_workers=num_workers, seed=seed)
    if cfg.dataset == "digits":
        from mxlarge.data import digits
        return digits.build(cfg, **kw)
    if cfg.dataset == "synthetic":
        from mxlarge.data import synthetic
        return synthetic.build(cfg, **kw)
    if cfg.dataset == "mnist1d":
        from mxlarge.data import mnist1d
        return mnist1d.build(cfg, **kw)
    if cfg.dataset == "cifar10":
        from mxlarge.data import cifar10
        return cifar10.build(cfg, **kw)
    from mxlarge.data import imagenet
    return imagenet.build(cfg, **kw)
