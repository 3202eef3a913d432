"""``resnet1d``: a small 1-D ResNet-v1 for MNIST-1D, with its convolutions run as 2-D ones.

Input ``(N, C, 1, L)`` (MNIST-1D: ``(N, 1, 1, 40)``)::

    stem:    conv(1x5, w) - BN - relu
    stage 1: BasicBlock1D(w,  stride 1)          downsample = None
    stage 2: BasicBlock1D(2w, stride 2)          downsample = conv(1x1, 2w, stride 2) - BN
    stage 3: BasicBlock1D(4w, stride 2)          downsample = conv(1x1, 4w, stride 2) - BN
    head:    mean over (H, L) - Dense(num_classes)

Each block computes, like GluonCV's ``BasicBlockV1`` with 1-D kernels of size ``k``,

.. math::

    y = \\mathrm{relu}\\big(\\mathrm{BN_2}(W_2 * \\mathrm{relu}(\\mathrm{BN_1}(W_1 * x)))
        + \\mathrm{downsample}(x)\\big).

It follows :mod:`mxlarge.nets.init`'s convention (a ``downsample`` attribute, ``BN_2``
registered before it), so He init, the N(0, 0.01) final Dense and zero-gamma on ``BN_2`` of
every block apply unchanged; a 1-D kernel of size k as a ``(1, k)`` 2-D kernel has the same
fan-out ``C_out * k``.

**Why 2-D convolutions.** On MXNet 1.9.1's CPU build, a hybridized ``Conv1D`` followed by
``BatchNorm`` fails inside MKLDNN with ``Check failed: !is_view`` (ndarray.cc:649), in training
as well as at inference (pinned by ``tests/nets/test_resnet1d.py``).
``MXNET_MKLDNN_ENABLED=0`` avoids it but is process-wide, slows every other net, and leaves
MXNet's reference Conv1D far slower than this layout. A ``(1, k)`` kernel over an ``H = 1``
input is the same operation, MKLDNN runs it as any 2-D net, and nothing global changes.

**Why ``mean`` and not ``GlobalAvgPool2D``.** MKLDNN's backward of a global pooling over an
``(N, 4w, 1, 10)`` map is slow and hands the last BatchNorm's backward a layout that makes it
slower still; ``F.mean(x, axis=(2, 3))`` is the same average (a sum over ``H * L`` divided by
``H * L``) without MKLDNN.
"""
from __future__ import annotations

from typing import Any

from mxnet.gluon import HybridBlock, nn

__all__ = ["BasicBlock1D", "ResNet1D"]


def _conv(channels: int, kernel: int, strides: int, in_channels: int) -> nn.Conv2D:
    """A 1-D convolution over the last axis as a ``(1, kernel)`` 2-D one ('same' padding)."""
    return nn.Conv2D(channels, kernel_size=(1, kernel), strides=(1, strides),
                     padding=(0, kernel // 2), use_bias=False, in_channels=in_channels)


class BasicBlock1D(HybridBlock):
    """conv-BN-relu-conv-BN residual block over 1-D signals (``(N, C, 1, L)``).

    Args:
        channels: output channels ``C_out``.
        kernel: kernel length k (odd, so 'same' padding keeps the length at stride 1).
        strides: stride of the first convolution (and of the shortcut projection).
        in_channels: input channels ``C_in``; a 1x1 projection shortcut is used when
            ``C_in != C_out`` or ``strides != 1``.
    """

    def __init__(self, channels: int, kernel: int, strides: int, in_channels: int,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        with self.name_scope():
            # bn2 before downsample: mxlarge.nets.init takes the branch's last BN in
            # registration order (and checks that it feeds the addition).
            self.conv1 = _conv(channels, kernel, strides, in_channels)
            self.bn1 = nn.BatchNorm(in_channels=channels)
            self.conv2 = _conv(channels, kernel, 1, channels)
            self.bn2 = nn.BatchNorm(in_channels=channels)
            if strides != 1 or in_channels != channels:
                self.downsample = nn.HybridSequential(prefix="down_")
                with self.downsample.name_scope():
                    self.downsample.add(_conv(channels, 1, strides, in_channels))
                    self.downsample.add(nn.BatchNorm(in_channels=channels))
            else:
                self.downsample = None

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # F: mx.nd or mx.sym
        out = F.Activation(self.bn1(self.conv1(x)), act_type="relu")
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.Activation(out + shortcut, act_type="relu")


class ResNet1D(HybridBlock):
    """Three-stage 1-D residual net (``resnet1d``).

    Args:
        num_classes: units of the final Dense layer.
        width: channels ``w`` of the stem and stage 1; stages 2 and 3 have ``2w`` and ``4w``.
        kernel: kernel length of every 1-D convolution but the 1x1 projections.

    The stem's input channels are inferred at the first forward pass.
    """

    def __init__(self, num_classes: int, width: int = 16, kernel: int = 5,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if num_classes < 1 or width < 1 or kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"num_classes, width >= 1 and an odd kernel expected, got "
                             f"{num_classes}, {width}, {kernel}")
        with self.name_scope():
            self.stem = nn.HybridSequential(prefix="stem_")
            with self.stem.name_scope():
                self.stem.add(nn.Conv2D(width, kernel_size=(1, kernel), padding=(0, kernel // 2),
                                        use_bias=False))
                self.stem.add(nn.BatchNorm(in_channels=width))
                self.stem.add(nn.Activation("relu"))
            self.stage1 = BasicBlock1D(width, kernel, 1, width, prefix="stage1_")
            self.stage2 = BasicBlock1D(2 * width, kernel, 2, width, prefix="stage2_")
            self.stage3 = BasicBlock1D(4 * width, kernel, 2, 2 * width, prefix="stage3_")
            self.output = nn.Dense(num_classes, in_units=4 * width)

    def hybrid_forward(self, F: Any, x: Any) -> Any:  # F: mx.nd or mx.sym
        x = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.output(F.mean(x, axis=(2, 3)))
