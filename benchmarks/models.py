"""Nets, data and trainers shared by the benchmarks (MXNet is imported inside the functions).

The mxlarge side is always "the recipe on": Goyal et al.'s per-iteration linear warmup (the
timed steps fall inside it, so the LR and hence the momentum correction m·η_t/η_{t−1} change at
every step), momentum correction, and no weight decay on BN γ/β and biases.
"""
from __future__ import annotations

from typing import Any

#: The schedule of every mxlarge trainer here: warmup from 0.1 to 0.4 over 10,000 steps, so any
#: timed step is a warmup step (the LR differs at every step).
PEAK_LR, WARMUP_LR, WARMUP_STEPS, DECAY_STEPS = 0.4, 0.1, 10_000, (20_000,)
MOMENTUM, WEIGHT_DECAY = 0.9, 1e-4


def build_net(name: str, classes: int, size: int, seed: int = 0, channels: int = 3,
              width: int = 16) -> Any:
    """A GluonCV/mxlarge net, initialised by mxlarge (He init, zero-γ) and hybridized static.

    Hybridized with ``static_alloc=True, static_shape=True`` as :func:`mxlarge.run.build` does,
    so the benchmark times the same graph a real run executes. Inputs are
    ``(channels, size, size)``; ``width`` is the width of mxlarge's own small nets.
    """
    import mxnet as mx

    from mxlarge.config import ModelConfig
    from mxlarge.nets import build_net as _build
    from mxlarge.nets import initialize

    cfg = ModelConfig(name=name, width=width)
    net = _build(cfg, classes)
    initialize(net, cfg, seed=seed, ctx=[mx.cpu()], input_shape=(channels, size, size))
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def synthetic_batches(count: int, batch: int, size: int, classes: int, seed: int = 0,
                      channels: int = 3) -> list:
    """``count`` fixed ``(data, label)`` batches of uniform noise (the same for every mode)."""
    import mxnet as mx
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        x = rng.uniform(-1, 1, size=(batch, channels, size, size)).astype(np.float32)
        y = rng.integers(0, classes, size=batch).astype(np.float32)
        out.append((mx.nd.array(x), mx.nd.array(y)))
    return out


def recipe_trainer(net: Any, kvstore: Any = "local", fusion_bytes: int | None = None,
                   breakdown: bool = False) -> Any:
    """``mxlarge.Trainer`` with warmup schedule, momentum correction and no-decay roles;
    gradient fusion at ``fusion_bytes`` (default: mxlarge's); sampled steps timed only with
    ``breakdown`` (the benchmarks that measure it add its observer themselves)."""
    from mxlarge.kvstore import FUSION_BYTES
    from mxlarge.schedulers import goyal
    from mxlarge.trainer import Trainer

    schedule = goyal(peak_lr=PEAK_LR, warmup_lr=WARMUP_LR, warmup_steps=WARMUP_STEPS,
                     decay_steps=DECAY_STEPS)
    return Trainer(net.collect_params(), schedule, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY,
                   momentum_correction=True, decay_bn_bias=False, kvstore=kvstore,
                   fusion_bytes=FUSION_BYTES if fusion_bytes is None else fusion_bytes,
                   breakdown=breakdown)


def recipe_loop(net: Any, trainer: Any) -> Any:
    """A :class:`mxlarge.loop.TrainLoop` whose ``train_step`` the benchmarks call directly."""
    import mxnet as mx

    from mxlarge.loop import TrainLoop

    return TrainLoop(net=net, trainer=trainer, train_source=None,
                     loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=1,
                     ctx=[mx.cpu()])
