"""mxlarge.Trainer in one process: roles, parity with gluon.Trainer where both mean the same,
states round trip, and the BN-statistics modes."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from mxlarge import Trainer
from mxlarge.kvstore.roles import param_roles, role_counts
from mxlarge.kvstore.sync import validate_kvstore
from mxlarge.schedulers import Constant, goyal


def _net(seed=0):
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((2, 1, 6, 6)))
    return net


def _batches(n=8, steps=6, seed=1):
    rng = np.random.RandomState(seed)
    return [(mx.nd.array(rng.randn(n, 1, 6, 6)), mx.nd.array(rng.randint(0, 3, n)))
            for _ in range(steps)]


def _train(net, trainer_step, batches):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for t, (x, y) in enumerate(batches):
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer_step(x.shape[0], t)
    return [v.data().asnumpy() for v in net.collect_params().values()]


def test_param_roles_from_gluon_facts():
    net = _net()
    by_suffix = {}
    for r in param_roles(net.collect_params()):
        by_suffix.setdefault(r.name.rsplit("_", 1)[-1], []).append(r)
    assert all(r.pushed and r.decay for r in by_suffix["weight"])
    assert all(r.pushed and not r.decay for r in by_suffix["bias"])
    assert all(r.pushed and not r.decay for r in by_suffix["gamma"] + by_suffix["beta"])
    assert all(r.local_stat and not r.pushed for r in by_suffix["mean"] + by_suffix["var"])
    counts = role_counts(param_roles(net.collect_params()))
    assert counts == {"pushed": 6, "local_stats": 2, "no_decay": 4,
                      "pushed_elements": 4 * 9 + 4 + 4 + 4 + 3 * 4 + 3}
    with_decay = role_counts(param_roles(net.collect_params(), decay_bn_bias=True))
    assert with_decay["no_decay"] == 0


def test_same_as_gluon_trainer_when_both_mean_the_same():
    """Constant LR (so no correction), decay on everything, one process: identical math."""
    batches = _batches()
    a, b = _net(), _net()
    ga = gluon.Trainer(a.collect_params(), "sgd",
                       {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    wa = _train(a, lambda n, t: ga.step(n), batches)
    tb = Trainer(b.collect_params(), Constant(0.1), momentum=0.9, weight_decay=1e-3,
                 decay_bn_bias=True)
    wb = _train(b, tb.step, batches)
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_schedule_with_warmup_differs_from_gluon_by_the_correction_only():
    batches = _batches(steps=8)
    sched = goyal(0.8, 0.1, 4, (6,))
    a, b = _net(), _net()
    ta = Trainer(a.collect_params(), sched, momentum=0.9, momentum_correction=False)
    tb = Trainer(b.collect_params(), sched, momentum=0.9, momentum_correction=True)
    wa, wb = _train(a, ta.step, batches), _train(b, tb.step, batches)
    diff = max(np.abs(x - y).max() for x, y in zip(wa, wb))
    assert diff > 1e-4  # the correction really changes the trajectory


def test_states_round_trip(tmp_path):
    batches = _batches(steps=4)
    net = _net()
    tr = Trainer(net.collect_params(), Constant(0.1), momentum=0.9)
    _train(net, tr.step, batches[:2])
    f = str(tmp_path / "states.nd")
    tr.save_states(f)
    net2 = _net()
    for p, q in zip(net.collect_params().values(), net2.collect_params().values()):
        q.set_data(p.data())
    tr2 = Trainer(net2.collect_params(), Constant(0.1), momentum=0.9)
    tr2.load_states(f)
    # continuing both from identical weights and states gives identical weights
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for n_, t_ in ((net, tr), (net2, tr2)):
        for t, (x, y) in enumerate(batches[2:], start=2):
            with autograd.record():
                loss = loss_fn(n_(x), y)
            loss.backward()
            t_.step(x.shape[0], t)
    for p, q in zip(net.collect_params().values(), net2.collect_params().values()):
        np.testing.assert_array_equal(p.data().asnumpy(), q.data().asnumpy())
    with open(f, "rb") as fh:
        assert b"pickle" not in fh.read(64)


def test_states_from_another_net_refused(tmp_path):
    net = _net()
    tr = Trainer(net.collect_params(), Constant(0.1), momentum=0.9)
    f = str(tmp_path / "s.nd")
    mx.nd.save(f, {"momentum:99": mx.nd.zeros((2,))})
    with pytest.raises(ValueError, match="do not match this net"):
        tr.load_states(f)


def test_uninitialised_params_refused():
    net = gluon.nn.Dense(3)
    net.initialize()
    with pytest.raises(ValueError, match="not initialised"):
        Trainer(net.collect_params(), Constant(0.1))


@pytest.mark.parametrize("name", ["horovod", "byteps", "dist_synk", "nccl", "dist_async"])
def test_unknown_kvstore_is_an_error_not_a_silent_local_store(name):
    with pytest.raises(ValueError, match="not supported"):
        validate_kvstore(name)


def test_mxnet_silently_falls_back_to_local_for_unknown_names():
    """Pins the MXNet fact that makes the validation necessary."""
    kv = mx.kv.create("horovod")
    assert kv.num_workers == 1 and kv.rank == 0


def test_bn_stats_modes_on_two_devices():
    """Two CPU devices in one process: each keeps its own running stats; `reduce` evaluates with
    their mean and restores them afterwards."""
    ctx = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(2, 1), gluon.nn.BatchNorm(), gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(mx.nd.zeros((2, 1, 3, 3), ctx=ctx[0]))
    net(mx.nd.zeros((2, 1, 3, 3), ctx=ctx[1]))
    tr = Trainer(net.collect_params(), Constant(0.1), kvstore="device", bn_stats="reduce")
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    x = mx.nd.array(rng.randn(8, 1, 3, 3))
    x[4:] *= 5  # different data per device -> different running statistics
    y = mx.nd.array(rng.randint(0, 2, 8))
    xs = gluon.utils.split_and_load(x, ctx)
    ys = gluon.utils.split_and_load(y, ctx)
    with autograd.record():
        losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
    autograd.backward(losses)
    tr.step(8, 0)
    mean = [p for n, p in net.collect_params().items() if n.endswith("running_mean")][0]
    d0, d1 = (a.asnumpy() for a in mean.list_data())
    assert not np.allclose(d0, d1)
    for p in net.collect_params().values():
        if p.grad_req != "null":
            np.testing.assert_array_equal(p.list_data()[0].asnumpy(), p.list_data()[1].asnumpy())
    with tr.bn.evaluation():
        for a in mean.list_data():
            np.testing.assert_allclose(a.asnumpy(), (d0 + d1) / 2, rtol=1e-6)
    np.testing.assert_array_equal(mean.list_data()[0].asnumpy(), d0)
    np.testing.assert_array_equal(mean.list_data()[1].asnumpy(), d1)
