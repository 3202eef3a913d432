"""Tests of mxlarge.nets: builders, generic zero-gamma and the Goyal et al. initialisation."""
from __future__ import annotations

import math

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

from mxlarge.config import ConfigError, ModelConfig
from mxlarge.nets import (
    InitReport,
    build_net,
    initialize,
    last_branch_batchnorm,
    residual_blocks,
)

DIGITS = (1, 8, 8)
CIFAR = (3, 32, 32)


def _cfg(name: str = "small_resnet", **kw) -> ModelConfig:
    return ModelConfig(name=name, hybridize=False, **kw)


def _built(name: str, shape: tuple[int, int, int], seed: int = 0, **kw):
    cfg = _cfg(name, **kw)
    net = build_net(cfg, num_classes=10)
    report = initialize(net, cfg, seed=seed, input_shape=shape)
    return net, report


def _batchnorms(net) -> list[nn.BatchNorm]:
    found: list[nn.BatchNorm] = []

    def visit(b):
        if isinstance(b, nn.BatchNorm):
            found.append(b)
        for c in b._children.values():
            visit(c)
    visit(net)
    return found


def _expected_last_bn(block) -> nn.BatchNorm:
    """The BN just before the addition, read off the GluonCV / mxlarge block sources."""
    kind = type(block).__name__
    if kind in ("BasicBlockV1b", "BasicBlock"):   # conv1 bn1 relu conv2 bn2 | + residual
        return block.bn2
    if kind == "BottleneckV1b":                   # ... conv3 bn3 | + residual
        return block.bn3
    if kind == "CIFARBasicBlockV1":               # body = conv bn relu conv bn | + residual
        return block.body[4]
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def zoo():
    """Nets shared by several tests (building resnet50 once keeps the suite fast)."""
    return {
        name: _built(name, shape)
        for name, shape in [("resnet18_v1b", CIFAR), ("resnet50_v1b", CIFAR),
                            ("cifar_resnet20_v1", CIFAR), ("small_resnet", DIGITS)]
    }


# ---------------------------------------------------------------------------------------------
# zero gamma


@pytest.mark.parametrize("name,blocks", [("resnet18_v1b", 8), ("resnet50_v1b", 16),
                                         ("cifar_resnet20_v1", 9), ("small_resnet", 2)])
def test_zero_gamma_one_per_residual_block(zoo, name, blocks):
    net, report = zoo[name]
    assert isinstance(report, InitReport)
    assert report.residual_blocks == blocks == len(residual_blocks(net))
    assert len(report.zero_gamma) == blocks
    expected = [_expected_last_bn(b).gamma.name for b in residual_blocks(net)]
    assert list(report.zero_gamma) == expected
    assert [last_branch_batchnorm(b).gamma.name for b in residual_blocks(net)] == expected
    for bn in _batchnorms(net):
        gamma = bn.gamma.data().asnumpy()
        if bn.gamma.name in expected:
            assert np.all(gamma == 0), bn.name
        else:  # includes every downsample BN
            assert np.all(gamma == 1), bn.name
        assert np.all(bn.beta.data().asnumpy() == 0)
        # the shape-inference forward ran in inference mode: running stats untouched
        assert np.all(bn.running_mean.data().asnumpy() == 0)
        assert np.all(bn.running_var.data().asnumpy() == 1)


def test_zero_gamma_off_leaves_all_gammas_one():
    net, report = _built("resnet18_v1b", CIFAR, zero_gamma=False)
    assert report.zero_gamma == () and report.residual_blocks == 8
    assert all(np.all(bn.gamma.data().asnumpy() == 1) for bn in _batchnorms(net))


@pytest.mark.parametrize("name,path,has_down", [
    ("small_resnet", ("stage2",), True),
    ("cifar_resnet20_v1", ("features", 3, 0), True),   # stage2, first block: 16 -> 32 channels
    ("resnet18_v1b", ("layer1", 0), False),
])
@pytest.mark.parametrize("train", [False, True])
def test_zero_gamma_block_starts_as_its_shortcut(zoo, name, path, has_down, train):
    net, _ = zoo[name]
    block = net
    for step in path:
        block = block[step] if isinstance(step, int) else getattr(block, step)
    assert (block.downsample is not None) == has_down
    channels = block.downsample[0]._in_channels if has_down else (16 if name == "small_resnet"
                                                                     else 64)
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.standard_normal((2, channels, 8, 8)))
    with mx.autograd.record(train_mode=train):  # train mode: BN uses batch statistics
        out = block(x)
        shortcut = block.downsample(x) if has_down else x
    np.testing.assert_allclose(out.asnumpy(), np.maximum(shortcut.asnumpy(), 0), atol=1e-6)


def test_preactivation_blocks_are_skipped():
    net, report = _built("cifar_resnet20_v2", CIFAR)
    assert report.residual_blocks == 9 and report.zero_gamma == ()
    assert [kind for _, kind in report.skipped] == ["CIFARBasicBlockV2"] * 9
    assert report.warning().startswith("zero-gamma applies to 0 of 9 residual blocks; skipped "
                                       "9 x CIFARBasicBlockV2")
    assert _built("cifar_resnet20_v1", CIFAR)[1].warning() is None
    assert all(last_branch_batchnorm(b) is None for b in residual_blocks(net))
    # Why: zeroing the last BN of a v2 branch (BN - relu - conv) would kill it for good. The
    # BN output is 0, relu'(0) = 0 in MXNet, so gamma, beta and the conv get no gradient.
    block = net.features[2][1]
    assert type(block).__name__ == "CIFARBasicBlockV2"
    block.bn2.gamma.set_data(mx.nd.zeros_like(block.bn2.gamma.data()))
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, 16, 8, 8)))
    with mx.autograd.record():
        loss = (block(x) ** 2).sum()
    loss.backward()
    for p in block.collect_params().values():
        if p.grad_req != "null":
            assert np.all(p.grad().asnumpy() == 0), p.name
    # A v1 block with gamma = 0 is different: gamma itself gets a gradient and grows.
    v1, _ = _built("cifar_resnet20_v1", CIFAR)
    block = v1.features[2][1]
    with mx.autograd.record():
        loss = (block(x) ** 2).sum()
    loss.backward()
    assert np.all(block.body[4].gamma.data().asnumpy() == 0)
    assert np.any(block.body[4].gamma.grad().asnumpy() != 0)


class _ReluEndedBlock(nn.HybridBlock):
    """Has a ``downsample`` attribute but its last BN feeds a relu, not an addition (like
    GluonCV DLA's ``Tree``): a zero gamma would silence it for good, so it must be skipped."""

    def __init__(self, **kw):
        super().__init__(**kw)
        with self.name_scope():
            self.conv = nn.Conv2D(4, 3, padding=1, in_channels=4)
            self.bn = nn.BatchNorm(in_channels=4)
            self.downsample = None

    def hybrid_forward(self, F, x):
        return F.relu(self.bn(self.conv(x))) + 0 * x


def test_last_bn_must_feed_the_addition():
    block = _ReluEndedBlock()
    assert residual_blocks(block) == [block]
    assert last_branch_batchnorm(block) is None
    report = initialize(block, _cfg(), seed=0)
    assert report.zero_gamma == () and report.residual_blocks == 1


def test_bn_free_net_has_blocks_but_no_zero_gamma():
    net, report = _built("small_plain", DIGITS)
    assert report.residual_blocks == 2 and report.zero_gamma == ()
    assert not _batchnorms(net)


# ---------------------------------------------------------------------------------------------
# He / Dense / biases / determinism


def _single_conv(**kw):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(256, kernel_size=3, in_channels=128, use_bias=True),
            nn.Dense(10, in_units=256))
    report = initialize(net, _cfg(**kw), seed=3)
    return net, report


def test_he_std_is_sqrt_2_over_fan_out():
    net, report = _single_conv()
    assert report.he_convs == 1
    w = net[0].weight.data().asnumpy()
    expected = math.sqrt(2 / (256 * 3 * 3))  # fan_out = C_out * kh * kw, not C_in * kh * kw
    assert w.std() == pytest.approx(expected, rel=0.02)
    assert abs(w.mean()) < 0.05 * expected
    assert np.all(net[0].bias.data().asnumpy() == 0)


def test_he_off_keeps_builder_default():
    net, report = _single_conv(he_init=False)
    assert report.he_convs == 0
    w = net[0].weight.data().asnumpy()
    assert w.std() == pytest.approx(0.07 / math.sqrt(3), rel=0.02)  # Gluon's Uniform(0.07)


def test_large_convs_of_resnet50_follow_he(zoo):
    net, report = zoo["resnet50_v1b"]
    assert report.he_convs == 53
    big = [p for name, p in net.collect_params(".*conv.*weight").items() if p.data().size > 10**5]
    assert big
    for p in big:
        fan_out = p.shape[0] * p.shape[2] * p.shape[3]
        assert p.data().asnumpy().std() == pytest.approx(math.sqrt(2 / fan_out), rel=0.05)


def test_final_dense_std(zoo):
    net, report = zoo["resnet50_v1b"]
    assert report.final_dense == net.fc.weight.name
    w = net.fc.weight.data().asnumpy()
    assert w.shape == (10, 2048)
    assert w.std() == pytest.approx(0.01, rel=0.03)
    assert np.all(net.fc.bias.data().asnumpy() == 0)


def test_fc_init_std_zero_keeps_builder_default():
    net, report = _built("small_resnet", DIGITS, fc_init_std=0.0)
    assert report.final_dense is None
    w = net.output.weight.data().asnumpy()
    assert w.std() == pytest.approx(0.07 / math.sqrt(3), rel=0.25)  # 320 samples of U(-.07, .07)


def test_final_dense_is_the_classifier_not_an_se_dense():
    net, report = _built("se_resnet18_v1", CIFAR)
    assert report.final_dense == net.output.weight.name
    assert len(report.zero_gamma) == report.residual_blocks == 8  # BN -> SE mul -> add


def test_all_biases_zero():
    net, _ = _built("small_plain", DIGITS)
    biases = net.collect_params(".*bias").values()
    assert len(biases) == 7  # stem, 2 + 2 block convs, 1 projection, dense
    assert all(np.all(p.data().asnumpy() == 0) for p in biases)


def _values(net) -> list[np.ndarray]:
    return [p.data().asnumpy() for p in net.collect_params().values()]


@pytest.mark.parametrize("name,shape", [("small_resnet", DIGITS), ("cifar_resnet20_v1", CIFAR)])
def test_deterministic_given_seed(name, shape):
    a, _ = _built(name, shape, seed=7)
    b, _ = _built(name, shape, seed=7)
    c, _ = _built(name, shape, seed=8)
    for x, y in zip(_values(a), _values(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert any(not np.array_equal(x, z) for x, z in zip(_values(a), _values(c), strict=True))


def test_reinitialise_same_net_is_deterministic():
    net, _ = _built("small_resnet", DIGITS, seed=1)
    first = _values(net)
    initialize(net, _cfg(), seed=1, input_shape=DIGITS)
    for x, y in zip(first, _values(net), strict=True):
        np.testing.assert_array_equal(x, y)


def test_deferred_shapes_need_input_shape():
    cfg = _cfg("cifar_resnet20_v1")
    with pytest.raises(ValueError, match="input_shape"):
        initialize(build_net(cfg, 10), cfg, seed=0)


# ---------------------------------------------------------------------------------------------
# builder


@pytest.mark.parametrize("typo,suggestion", [("resnet50_v1x", "resnet50_v1"),
                                             ("small_resnt", "small_resnet"),
                                             ("cifar_resnet20", "cifar_resnet20_v1")])
def test_unknown_model_suggests(typo, suggestion):
    with pytest.raises(ConfigError, match="unknown model") as err:
        build_net(_cfg(typo), 10)
    assert typo in str(err.value) and suggestion in str(err.value)


@pytest.mark.parametrize("name", ["yolo3_darknet53_coco", "fcn_resnet50_voc",
                                  "resnet18_v1b_0.89"])
def test_non_classifiers_refused_before_building(name):
    # building these would fetch backbone weights or ignore classes=: refuse up front
    with pytest.raises(ConfigError, match="not an image classifier"):
        build_net(_cfg(name), 10)


def test_builders_never_fetch_backbones():
    net = build_net(_cfg("googlenet"), 10)  # GluonCV's default pretrained_base=True downloads
    assert net.output._units == 10


@pytest.mark.parametrize("name", ["small_resnet", "small_plain"])
def test_small_forward_shapes(name):
    net, _ = _built(name, DIGITS)
    assert net(mx.nd.zeros((4, *DIGITS))).shape == (4, 10)
    wide = build_net(_cfg(name, width=4), num_classes=3)
    initialize(wide, _cfg(name, width=4), seed=0, input_shape=(3, 17, 13))  # any (C, H, W)
    assert wide(mx.nd.zeros((2, 3, 17, 13))).shape == (2, 3)


def test_cifar_forward_shape(zoo):
    net, _ = zoo["cifar_resnet20_v1"]
    assert net(mx.nd.zeros((2, *CIFAR))).shape == (2, 10)


@pytest.mark.parametrize("name,shape", [("small_resnet", DIGITS), ("small_plain", DIGITS),
                                        ("cifar_resnet20_v1", CIFAR)])
def test_hybridized_equals_imperative(name, shape):
    net, _ = _built(name, shape, zero_gamma=False)  # nonzero branches: a real comparison
    x = mx.nd.array(np.random.default_rng(0).standard_normal((4, *shape)))
    imperative = net(x).asnumpy()
    net.hybridize()
    hybrid = net(x).asnumpy()
    np.testing.assert_allclose(hybrid, imperative, rtol=1e-5, atol=1e-6)


def test_build_net_hybridizes_per_config():
    cfg = ModelConfig(name="small_resnet", hybridize=True, zero_gamma=False)
    net = build_net(cfg, 10)
    initialize(net, cfg, seed=0, input_shape=DIGITS)
    assert net._cached_graph  # the shape-inference forward already built the static graph
    plain, _ = _built("small_resnet", DIGITS, seed=0, zero_gamma=False)
    # same values whatever the mode, and the cached graph sees the re-drawn parameters
    for x, y in zip(_values(net), _values(plain), strict=True):
        np.testing.assert_array_equal(x, y)
    x = mx.nd.array(np.random.default_rng(1).standard_normal((2, *DIGITS)))
    np.testing.assert_allclose(net(x).asnumpy(), plain(x).asnumpy(), rtol=1e-5, atol=1e-6)
