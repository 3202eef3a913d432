"""mxlarge's own small residual network: the CPU-friendly demo net.

``small_resnet`` is a two-stage ResNet-v1 for digits-sized images (``(N, 1, 8, 8)``, but any
``(C, H, W)`` works: the stem infers ``C`` and the head pools globally)::

    stem:    conv3x3(w) - BN - relu
    stage 1: BasicBlock(w,  stride 1)          downsample = None
    stage 2: BasicBlock(2w, stride 2)          downsample = conv1x1(2w, stride 2) - BN
    head:    global average pool - Dense(num_classes)

Each :class:`BasicBlock` computes, like GluonCV's ``BasicBlockV1``,

.. math::

    y = \\mathrm{relu}\\big(\\mathrm{BN_2}(W_2 * \\mathrm{relu}(\\mathrm{BN_1}(W_1 * x)))
        + \\mathrm{downsample}(x)\\big),

with ``downsample(x) = x`` when the shape does not change. ``BN_2`` is the last BatchNorm of the
residual branch, the one whose gamma the Goyal et al. recipe sets to zero, and it is registered
before ``downsample`` so the generic rule in :mod:`mxlarge.nets.init` finds it.

``small_plain`` has the same topology and residual additions but no BatchNorm (convolutions get a
bias instead): tests use it where BN statistics would get in the way (e.g. exact gradient
equivalence between a large batch and accumulated small batches).
"""
from __future__ import annotations

from typing import Any

from mxnet.gluon import HybridBlock, nn

__all__ = ["BasicBlock", "SmallResNet"]


def _conv3x3(channels: int, strides: int, in_channels: int, use_bias: bool) -> nn.Conv2D:
    return nn.Conv2D(channels, kernel_size=3, strides=strides, padding=1, use_bias=use_bias,
                     in_channels=in_channels)


class BasicBlock(HybridBlock):
    """conv-BN-relu-conv-BN residual block (GluonCV ``BasicBlockV1`` layout).

    Args:
        channels: output channels ``C_out``.
        strides: stride of the first convolution (and of the shortcut projection).
        in_channels: input channels ``C_in``; a 1x1 projection shortcut is used when
            ``C_in != C_out`` or ``strides != 1``.
        use_bn: ``False`` drops both BatchNorms (and the shortcut's) and gives the convolutions
            a bias, so that the block is BN-free but keeps its residual addition.
    """

    def __init__(self, channels: int, strides: int, in_channels: int, use_bn: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        bias = not use_bn
        with self.name_scope():
            # Registration order matters: the residual branch's last BN (bn2) must come before
            # ``downsample`` (whose BN is excluded anyway); see mxlarge.nets.init.
            self.conv1 = _conv3x3(channels, strides, in_channels, bias)
            self.bn1 = nn.BatchNorm(in_channels=channels) if use_bn else None
            self.conv2 = _conv3x3(channels, 1, channels, bias)
            self.bn2 = nn.BatchNorm(in_channels=channels) if use_bn else None
            if strides != 1 or in_channels != channels:
                self.downsample = nn.HybridSequential(prefix="down_")
                with self.downsample.name_scope():
                    self.downsample.add(nn.Conv2D(channels, kernel_size=1, strides=strides,
                                                  use_bias=bias, in_channels=in_channels))
                    if use_bn:
                        self.downsample.add(nn.BatchNorm(in_channels=channels))
            else:
                self.downsample = None

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # F: mx.nd or mx.sym
        out = self.conv1(x)
        if self.bn1 is not None:
            out = self.bn1(out)
        out = F.Activation(out, act_type="relu")
        out = self.conv2(out)
        if self.bn2 is not None:
            out = self.bn2(out)
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.Activation(out + shortcut, act_type="relu")


class SmallResNet(HybridBlock):
    """Two-stage residual net for small images (``small_resnet`` / ``small_plain``).

    Args:
        num_classes: units of the final Dense layer.
        width: channels ``w`` of the stem and stage 1; stage 2 has ``2w``.
        use_bn: ``True`` for ``small_resnet``, ``False`` for ``small_plain``.

    The stem's input channels are inferred at the first forward pass (deferred
    initialisation), every other shape is known at construction.
    """

    def __init__(self, num_classes: int, width: int = 16, use_bn: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_classes < 1 or width < 1:
            raise ValueError(f"num_classes and width must be >= 1, got {num_classes}, {width}")
        self.num_classes = num_classes
        self.width = width
        self.use_bn = use_bn
        with self.name_scope():
            self.stem = nn.HybridSequential(prefix="stem_")
            with self.stem.name_scope():
                self.stem.add(nn.Conv2D(width, kernel_size=3, padding=1, use_bias=not use_bn))
                if use_bn:
                    self.stem.add(nn.BatchNorm(in_channels=width))
                self.stem.add(nn.Activation("relu"))
            self.stage1 = BasicBlock(width, 1, width, use_bn=use_bn, prefix="stage1_")
            self.stage2 = BasicBlock(2 * width, 2, width, use_bn=use_bn, prefix="stage2_")
            self.pool = nn.GlobalAvgPool2D()
            self.flatten = nn.Flatten()
            self.output = nn.Dense(num_classes, in_units=2 * width)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # F: mx.nd or mx.sym
        x = self.stem(x)
        x = self.stage1(x)
        x = self.stage2(x)
        return self.output(self.flatten(self.pool(x)))
