"""Gradient fusion: the bucket plan (pure) and bitwise-equal sums on a real multi-device store.

The dist_sync equivalence (2 workers + 2 servers, fused vs per key, bitwise after 10 steps) is
tests/e2e/test_dist.py::test_fused_and_per_key_push_pull_give_bitwise_identical_weights.
"""
import mxnet as mx
import numpy as np
import pytest

from mxlarge.kvstore.fusion import FUSE_KEY, Bucket, fuse, piece_floats, server_of, spread
from mxlarge.kvstore.roles import param_roles
from mxlarge.kvstore.sync import SyncStore


def test_buckets_fill_in_backward_order_and_big_tensors_travel_alone():
    sizes = [10, 3, 100, 4, 4]
    got = fuse(sizes, [4, 3, 2, 1, 0], limit=8)
    assert got == [Bucket(FUSE_KEY, (4, 3), (0, 4), 8), Bucket(2, (2,), (0,), 100),
                   Bucket(0, (0,), (0,), 10), Bucket(1, (1,), (0,), 3)]


def test_a_tensor_over_the_piece_size_travels_as_consecutive_pieces_under_bucket_keys():
    """With ``piece``, a lone tensor of n > piece elements is k = ⌈n / piece⌉ pieces of
    ⌊n / k⌋ elements (the last takes the rest) covering it in order; smaller ones stay whole."""
    sizes = [10, 25, 3, 2, 30]
    got = fuse(sizes, [4, 3, 2, 1, 0], limit=8, piece=12)
    assert [(b.members, b.offsets, b.size, b.alone) for b in got] == [
        ((4,), (0,), 10, False), ((4,), (10,), 10, False), ((4,), (20,), 10, False),
        ((1,), (0,), 8, False), ((1,), (8,), 8, False), ((1,), (16,), 9, False),
        ((0,), (0,), 10, True), ((3, 2), (0, 2), 5, False)]
    assert [b.key for b in got] == [FUSE_KEY + j for j in range(6)] + [0, FUSE_KEY + 6]
    assert fuse(sizes, [4, 3, 2, 1, 0], limit=8) == \
        fuse(sizes, [4, 3, 2, 1, 0], limit=8, piece=30)  # nothing above the piece size


def test_pieces_are_one_bucket_per_server_and_only_across_hosts(monkeypatch):
    from mxlarge.kvstore import spans_hosts

    assert piece_floats(3, 65536, True) == 3 * 65536
    assert piece_floats(1, 65536, True) == piece_floats(3, 65536, False) == 0
    assert piece_floats(3, 0, True) == 0  # fusion off: one key per tensor
    monkeypatch.delenv("MXLARGE_PIECES", raising=False)
    monkeypatch.setenv("DMLC_PS_ROOT_URI", "127.0.0.1")
    assert not spans_hosts()
    monkeypatch.setenv("DMLC_PS_ROOT_URI", "198.18.0.10")
    assert spans_hosts()
    monkeypatch.setenv("MXLARGE_PIECES", "0")
    assert not spans_hosts()


@pytest.mark.parametrize("limit", [0, 1, 5, 7, 64, 10**9])
def test_every_tensor_in_exactly_one_bucket_and_no_bucket_over_the_limit(limit):
    rng = np.random.default_rng(limit)
    sizes = [int(s) for s in rng.integers(1, 20, size=40)]
    order = list(reversed(range(40)))
    buckets = fuse(sizes, order, limit, alone=frozenset({7}))
    members = [i for b in buckets for i in b.members]
    assert sorted(members) == list(range(40))
    assert len({b.key for b in buckets}) == len(buckets)
    for b in buckets:
        assert b.size == sum(sizes[i] for i in b.members)
        assert list(b.offsets) == list(np.cumsum([0] + [sizes[i] for i in b.members])[:-1])
        assert [order.index(i) for i in b.members] == sorted(order.index(i) for i in b.members)
        if b.fused:
            assert b.size <= limit and b.key >= FUSE_KEY and 7 not in b.members
        else:
            assert b.key == b.members[0]
    if limit <= 0:
        assert not any(b.fused for b in buckets)
    if limit >= sum(sizes):
        assert sum(b.fused for b in buckets) == 1


def _loads(buckets: list[Bucket], servers: int, bound: int) -> list[float]:
    """Elements each server sums: a key below ``bound`` whole on server_of(key), else size/S
    on each (MXNet 1.9.1's EncodeDefaultKey)."""
    load = [0.0] * servers
    for b in buckets:
        if b.size >= bound:
            load = [x + b.size / servers for x in load]
        else:
            load[server_of(b.key, servers)] += b.size
    return load


@pytest.mark.parametrize("servers", [2, 3, 4, 7])
def test_spread_gives_every_server_the_same_share_in_every_prefix(servers):
    """Bucket after bucket, each multi-member bucket goes to the least-loaded server so far:
    over any prefix of the push order the servers' loads differ by at most two whole keys (the
    last one placed by spread, and a lone tensor its own key sends anywhere), members and lone
    keys unchanged."""
    rng = np.random.default_rng(servers)
    sizes = [int(s) for s in rng.integers(1, 3000, size=300)] + [50_000, 70_000]
    order = list(reversed(range(len(sizes))))
    limit, bound = 4000, 40_000
    plain = fuse(sizes, order, limit)
    spread_ = spread(plain, servers, bound, 50_000)
    assert [(b.members, b.offsets, b.size) for b in spread_] == \
        [(b.members, b.offsets, b.size) for b in plain]
    assert [b.key for b in spread_ if not b.fused] == [b.key for b in plain if not b.fused]
    keys = [b.key for b in spread_]
    assert len(set(keys)) == len(keys) and all(FUSE_KEY <= k < FUSE_KEY + 50_000
                                              for b, k in zip(spread_, keys) if b.fused)
    big = max(b.size for b in spread_ if b.size < bound)
    for n in range(1, len(spread_) + 1):
        load = _loads(spread_[:n], servers, bound)
        assert max(load) - min(load) <= 2 * big, (n, load)
    # MXNet's own placement of FUSE_KEY + b is round-robin by count, not by size: further apart
    assert max(_loads(spread_, servers, bound)) <= max(_loads(plain, servers, bound))
    assert spread(plain, 1, bound, 50_000) == plain


CTX = [mx.cpu(0), mx.cpu(1)]


def _net(mode: str = "hybrid") -> mx.gluon.nn.HybridSequential:
    """Conv, BN, Dense on 2 devices, seed 1: ``mode`` imperative, hybrid, or static
    (hybridized with static_alloc)."""
    mx.random.seed(1)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.Dense(10))
    net.initialize(mx.init.Xavier(), ctx=CTX)
    if mode != "imperative":
        net.hybridize(static_alloc=mode == "static", static_shape=mode == "static")
    return net


def _grads_after_allreduce(fusion_bytes: int) -> tuple[SyncStore, list[np.ndarray]]:
    net, ctx = _net(), CTX
    x = [mx.nd.random.uniform(shape=(4, 3, 8, 8), ctx=c) for c in ctx]
    for xi in x:
        net(xi)
    params = net.collect_params()
    store = SyncStore("device", list(params.values()), param_roles(params),
                      fusion_bytes=fusion_bytes)
    with mx.autograd.record():
        losses = [net(xi).sum() for xi in x]
    mx.autograd.backward(losses)
    store.allreduce_grads()
    return store, [g.asnumpy() for p in params.values() if p.grad_req != "null"
                   for g in p.list_grad()]


def test_fused_sums_over_two_devices_equal_per_key_sums_bitwise():
    per_key, want = _grads_after_allreduce(0)
    fused, got = _grads_after_allreduce(64)  # 16 floats: several buckets, big tensors alone
    assert not any(b.fused for b in per_key.buckets)
    assert sum(b.fused for b in fused.buckets) >= 1
    assert any(not b.fused for b in fused.buckets)
    assert any(np.abs(g).sum() > 0 for g in want)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_negative_fusion_size_is_refused():
    net = mx.gluon.nn.Dense(2, in_units=2)
    net.initialize()
    params = net.collect_params()
    with pytest.raises(ValueError, match="fusion_bytes -1"):
        SyncStore("local", list(params.values()), param_roles(params), fusion_bytes=-1)


def _grads_over_steps(fusion_bytes: int, mode: str, reinit_at: int | None = None,
                      backward_first: bool = False
                      ) -> tuple[SyncStore, list[list[np.ndarray]], list[bool]]:
    """Three backward + allreduce steps on 2 devices (``mode``: imperative, hybrid or static,
    i.e. hybridized with static_alloc); per step every summed gradient, and whether each fused
    bucket's members' gradient arrays were its views during the step's backward."""
    net, ctx = _net(mode), CTX
    params = net.collect_params()
    for c in ctx:
        with mx.autograd.record(train_mode=False):
            y = net(mx.nd.zeros((4, 3, 8, 8), ctx=c))
        if backward_first:  # the CachedOp sees Gluon's own gradient arrays first
            y.backward()
    store = SyncStore("device", list(params.values()), param_roles(params),
                      fusion_bytes=fusion_bytes)
    out, adopted = [], []
    for step in range(3):
        if step == reinit_at:  # Gluon re-creates every gradient array
            for p in params.values():
                p._init_grad()
        x = [mx.nd.random.uniform(shape=(4, 3, 8, 8), ctx=c) for c in ctx]
        adopted.append(all(store.views.adopted(b) for b in store.buckets if b.fused))
        with mx.autograd.record():
            losses = [net(xi).sum() for xi in x]
        mx.autograd.backward(losses)
        store.allreduce_grads()
        out.append([g.asnumpy() for p in params.values() if p.grad_req != "null"
                    for g in p.list_grad()])
    return store, out, adopted


def _assert_bitwise(want: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> None:
    for step_want, step_got in zip(want, got, strict=True):
        assert any(np.abs(g).sum() > 0 for g in step_want)
        for a, b in zip(step_want, step_got, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode,reinit_at", [("static", None), ("hybrid", None),
                                            ("imperative", None), ("hybrid", 2),
                                            ("imperative", 1)])
def test_fused_members_write_into_the_bucket_and_sum_bitwise_as_per_key(mode, reinit_at):
    """A fused bucket's gradients are views of its buffer from the first backward on (backward
    writes there, nothing is copied); every step's sums stay bitwise the per-key sums, also
    after Gluon re-creates the gradient arrays (copied that step, views again after)."""
    _, want, _ = _grads_over_steps(0, mode, reinit_at)
    fused, got, adopted = _grads_over_steps(64, mode, reinit_at)
    assert sum(b.fused for b in fused.buckets) >= 1
    assert adopted == [step != reinit_at for step in range(3)]
    assert all(fused.views.adopted(b) for b in fused.buckets if b.fused) and not fused.views.copied
    _assert_bitwise(want, got)


def test_a_static_net_that_ran_backward_before_the_store_keeps_copying_bitwise():
    """A static-alloc CachedOp writes the gradient arrays of its first backward whatever the
    marks say: the NaN probe sees it at the first step and the bucket is copied from then on."""
    _, want, _ = _grads_over_steps(0, "static", backward_first=True)
    fused, got, _ = _grads_over_steps(64, "static", backward_first=True)
    assert fused.views.copied == {b.key for b in fused.buckets if b.fused}
    assert not any(fused.views.adopted(b) for b in fused.buckets if b.fused)
    _assert_bitwise(want, got)


def test_resnet50_over_3_servers_with_the_launchers_bound_is_even():
    """ResNet-50 v1b's gradients in the default buckets over 3 servers: with the launcher's
    big-array bound (the bucket's floats) only buckets go whole and spread evens them out;
    with the former bound 100,000 and MXNet's own placement of FUSE_KEY + b the busiest server
    summed 3.6 % more than an even third."""
    from gluoncv.model_zoo import get_model

    from mxlarge.kvstore import FUSION_BYTES
    from mxlarge.launcher.tuning import COMMON

    net = get_model("resnet50_v1b", pretrained=False)
    net.initialize(ctx=mx.cpu())
    net(mx.nd.zeros((1, 3, 32, 32)))  # shapes only: global pooling before the classifier
    sizes = [int(np.prod(p.shape)) for p in net.collect_params().values()
             if p.grad_req != "null"]
    bound = int(COMMON["MXNET_KVSTORE_BIGARRAY_BOUND"])
    assert bound == FUSION_BYTES // 4  # a tensor that travels alone is sliced
    plain = fuse(sizes, list(reversed(range(len(sizes)))), FUSION_BYTES // 4)
    third = sum(sizes) / 3
    assert max(_loads(spread(plain, 3, bound, 50_000), 3, bound)) / third < 1.001
    assert max(_loads(plain, 3, 100_000)) / third > 1.03
