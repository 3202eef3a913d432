"""Networks: mxlarge's small demo nets, GluonCV's model zoo, and Goyal et al. initialisation.

Typical use::

    net = build_net(cfg.model, num_classes=10)
    report = initialize(net, cfg.model, seed=cfg.train.seed, input_shape=(1, 8, 8))

GluonCV is imported only when a model-zoo name is asked for (it takes about two seconds).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

from mxnet.gluon import HybridBlock

from mxlarge.config import LOCAL_NETS, ConfigError, ModelConfig
from mxlarge.errors import closest
from mxlarge.nets.init import (
    DEFAULT_INIT,
    InitReport,
    he_initializer,
    initialize,
    last_branch_batchnorm,
    residual_blocks,
)
from mxlarge.nets.resnet1d import ResNet1D
from mxlarge.nets.small import BasicBlock, SmallResNet

__all__ = [
    "DEFAULT_INIT",
    "LOCAL_MODELS",
    "BasicBlock",
    "InitReport",
    "ResNet1D",
    "SmallResNet",
    "build_net",
    "he_initializer",
    "initialize",
    "last_branch_batchnorm",
    "residual_blocks",
    "zoo_classifiers",
]

#: Names served by mxlarge itself; anything else goes to GluonCV's model zoo.
LOCAL_MODELS = LOCAL_NETS

#: GluonCV modules whose builders are image classifiers taking ``classes=``. The rest of the
#: zoo (detection, segmentation, pose, video, int8, ...) is refused: those builders do not take
#: an integer ``classes`` and many download a pretrained backbone even with pretrained=False.
#: The pruned ResNets (``resnet50_v1d_0.86``, ...) are refused too: their layer shapes come from
#: a bundled file with a 1000-way classifier, whatever ``classes`` says.
_CLASSIFIER_MODULES = frozenset(f"gluoncv.model_zoo.{m}" for m in (
    "alexnet", "cifarresnet", "cifarresnext", "cifarwideresnet", "densenet", "dla",
    "googlenet", "hrnet", "inception", "mobilenet", "mobilenetv3", "nasnet",
    "residual_attentionnet", "resnest", "resnet",
    "resnetv1b", "resnext", "se_resnet", "senet", "shufflenet", "squeezenet", "vgg", "xception",
    "yolo.darknet"))


def _zoo_builders() -> dict[str, Callable[..., object]]:
    """GluonCV's name -> builder table (the one ``get_model`` looks names up in)."""
    from gluoncv.model_zoo import model_zoo
    return dict(model_zoo._models)


def _is_classifier(name: str, builder: Callable[..., object]) -> bool:
    if builder.__module__ == "gluoncv.model_zoo.hrnet":
        return name.endswith("_c")  # hrnet_*_s are segmentation nets
    return builder.__module__ in _CLASSIFIER_MODULES


def zoo_classifiers() -> list[str]:
    """The GluonCV model-zoo names :func:`build_net` accepts (importing GluonCV)."""
    return [n for n, b in _zoo_builders().items() if _is_classifier(n, b)]


def build_net(cfg: ModelConfig, num_classes: int) -> HybridBlock:
    """Builds the (uninitialised) network named by ``cfg.name``.

    Args:
        cfg: ``cfg.name`` is ``small_resnet`` (:class:`SmallResNet` with ``cfg.width``),
            ``small_plain`` (the same without BatchNorm), ``resnet1d`` (:class:`ResNet1D` with
            ``cfg.width``, for 1-D signals ``(N, C, 1, L)``) or a GluonCV model-zoo name, built
            with ``classes=num_classes, pretrained=False``. The net is hybridized when
            ``cfg.hybridize`` (the static graph is built at the first forward pass).
        num_classes: units of the classifier.

    Returns:
        A :class:`~mxnet.gluon.HybridBlock`; call :func:`initialize` next.

    Raises:
        ConfigError: for an unknown name (with the closest valid names) or a zoo model that is
            not an image classifier (detection, segmentation, ... builders are refused before
            they run: many would download a pretrained backbone).
    """
    name = cfg.name
    if name == "resnet1d":
        net: HybridBlock = ResNet1D(num_classes, width=cfg.width)
    elif name in LOCAL_MODELS:
        net = SmallResNet(num_classes, width=cfg.width,
                                       use_bn=name == "small_resnet")
    else:
        net = _zoo_net(name, num_classes)
    if cfg.hybridize:
        net.hybridize()
    return net


def _zoo_net(name: str, num_classes: int) -> HybridBlock:
    key = name.lower()  # GluonCV's get_model lower-cases too
    builders = _zoo_builders()
    if key in builders and not _is_classifier(key, builders[key]):
        kind = builders[key].__module__.removeprefix("gluoncv.model_zoo.")
        raise ConfigError(f"model.name = {name!r}: GluonCV model from '{kind}' is not an image "
                          f"classifier built with classes=; expected {', '.join(LOCAL_MODELS)} "
                          "or a GluonCV classification model (e.g. resnet50_v1b)")
    if key not in builders:
        valid = [*LOCAL_MODELS, *zoo_classifiers()]
        close = closest(key, valid, n=5, cutoff=0.5)
        examples = [*LOCAL_MODELS, "resnet50_v1b", "cifar_resnet20_v1"]
        hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(examples)}"
        raise ConfigError(f"model.name = {name!r}: unknown model ({hint}); expected "
                          f"{', '.join(LOCAL_MODELS)} or one of GluonCV's "
                          f"{len(valid) - len(LOCAL_MODELS)} classification model-zoo names")
    builder = builders[key]
    kwargs: dict[str, object] = {"classes": num_classes, "pretrained": False}
    if "pretrained_base" in inspect.signature(builder).parameters:
        kwargs["pretrained_base"] = False  # googlenet would fetch its backbone weights otherwise
    try:
        net = builder(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"model.name = {name!r}: GluonCV's builder rejects "
                          f"classes={num_classes}: {exc}") from None
    if not isinstance(net, HybridBlock):
        raise ConfigError(f"model.name = {name!r}: GluonCV returned a {type(net).__name__}, "
                          "expected a HybridBlock")
    return net
