"""mxlarge.Trainer in one process: roles, parity with gluon.Trainer where both mean the same,
states round trip, and the BN-statistics modes."""
import struct

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


class _GluonSchedule:
    """``sched`` as an MXNet ``lr_scheduler``: MXNet asks for num_update = t + 1 at step t."""

    def __init__(self, sched):
        self.sched = sched
        self.base_lr = sched(0)

    def __call__(self, num_update: int) -> float:
        return self.sched(num_update - 1)


def test_schedule_with_warmup_differs_from_gluon_by_the_correction_only():
    """Through warmup and a decay: without momentum correction mxlarge.Trainer is
    gluon.Trainer('sgd') with the same schedule; with it, the trajectory differs."""
    batches = _batches(steps=8)
    sched = goyal(0.8, 0.1, 4, (6,))
    g, a, b = _net(), _net(), _net()
    tg = gluon.Trainer(g.collect_params(), "sgd",
                       {"learning_rate": sched(0), "momentum": 0.9, "wd": 1e-4,
                        "lr_scheduler": _GluonSchedule(sched)})
    ta = Trainer(a.collect_params(), sched, momentum=0.9, weight_decay=1e-4,
                 decay_bn_bias=True, momentum_correction=False)
    tb = Trainer(b.collect_params(), sched, momentum=0.9, weight_decay=1e-4,
                 decay_bn_bias=True, momentum_correction=True)
    wg = _train(g, lambda n, t: tg.step(n), batches)
    wa, wb = _train(a, ta.step, batches), _train(b, tb.step, batches)
    for x, y in zip(wg, wa):
        np.testing.assert_allclose(x, y, atol=1e-6)
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
    # An MXNet NDArray list file (magic 0x112, little-endian uint64), not a pickle: a pickle
    # starts with 0x80 (protocol >= 2) or an opcode such as '(' or ']' (protocol 0/1).
    with open(f, "rb") as fh:
        assert struct.unpack("<Q", fh.read(8))[0] == 0x112


def test_states_from_another_net_refused(tmp_path):
    net = _net()
    tr = Trainer(net.collect_params(), Constant(0.1), momentum=0.9)
    f = str(tmp_path / "s.nd")
    mx.nd.save(f, {"momentum:99": mx.nd.zeros((2,))})
    with pytest.raises(ValueError, match="do not match this net"):
        tr.load_states(f)


def test_uninitialised_params_refused():
    net = gluon.nn.Dense(3)  # no net.initialize()
    with pytest.raises(ValueError, match="not initialised: call net.initialize()"):
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


# -- the drop-in (Gluon) form: one test per call a gluon.Trainer user writes --------------------

def _gluon_and_mxlarge(opt_params, steps=6, **mx_kwargs):
    """The same net and data through gluon.Trainer and through mxlarge.Trainer's Gluon form with
    the recipe's differences off (decay everywhere); returns both weight lists and trainers."""
    batches = _batches(steps=steps)
    a, b = _net(), _net()
    ga = gluon.Trainer(a.collect_params(), "sgd", dict(opt_params))
    wa = _train(a, lambda n, t: ga.step(n), batches)
    tb = Trainer(b.collect_params(), "sgd", dict(opt_params), decay_bn_bias=True, **mx_kwargs)
    wb = _train(b, lambda n, t: tb.step(n), batches)
    return wa, wb, ga, tb


def test_gluon_form_name_and_params_equal_gluon_trainer():
    """Call 1, ``Trainer(params, 'sgd', {...})`` with ``step(batch_size)`` (call 2, internal
    count): constant LR, one process, decay on everything: gluon.Trainer's weights."""
    wa, wb, _, tb = _gluon_and_mxlarge({"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, atol=1e-6)
    assert tb.num_update == 6


def test_mxnet_multifactor_scheduler_and_learning_rate_follow_gluon():
    """``lr_scheduler=MultiFactorScheduler`` (MXNet asks it for 1 on the first update) and the
    ``learning_rate`` property (call 3) agree with gluon.Trainer at every step; without
    momentum the correction has nothing to act on, so the weights agree too."""
    def run(make):
        net = _net()
        sched = mx.lr_scheduler.MultiFactorScheduler(step=[2, 4], factor=0.5, base_lr=0.2)
        tr = make(net, {"learning_rate": 0.2, "lr_scheduler": sched, "wd": 1e-3})
        lrs = []
        _train(net, lambda n, t: (tr.step(n), lrs.append(tr.learning_rate)), _batches(steps=6))
        return [v.data().asnumpy() for v in net.collect_params().values()], lrs

    wa, la = run(lambda net, p: gluon.Trainer(net.collect_params(), "sgd", p))
    wb, lb = run(lambda net, p: Trainer(net.collect_params(), "sgd", p, decay_bn_bias=True))
    assert la == pytest.approx(lb) and la == pytest.approx([0.2, 0.2, 0.1, 0.1, 0.05, 0.05])
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_gluoncv_lr_sequential_is_a_schedule():
    from gluoncv.utils import LRScheduler, LRSequential

    sched = LRSequential([LRScheduler("linear", base_lr=0.01, target_lr=0.1, niters=4),
                          LRScheduler("step", base_lr=0.1, niters=8, step_iter=[4],
                                      step_factor=0.1)])
    net = _net()
    tr = Trainer(net.collect_params(), "sgd", {"lr_scheduler": sched, "momentum": 0.9})
    ref = LRSequential([LRScheduler("linear", base_lr=0.01, target_lr=0.1, niters=4),
                        LRScheduler("step", base_lr=0.1, niters=8, step_iter=[4],
                                    step_factor=0.1)])
    want = [ref(t + 1) for t in range(12)]
    assert [tr.lr_at(t) for t in range(12)] == pytest.approx(want)
    assert len(set(want)) > 3  # warmup and a decay really happen


def test_optimizer_instance_honoured_and_others_refused():
    """Call 4, an ``mx.optimizer.SGD`` instance: same as the name; SGLD (noise per worker)
    and Nadam (state in the optimizer object) are refused with the reason."""
    batches = _batches(steps=4)
    a, b = _net(), _net()
    ta = Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3})
    tb = Trainer(b.collect_params(), mx.optimizer.SGD(learning_rate=0.1, momentum=0.9, wd=1e-3))
    for x, y in zip(_train(a, lambda n, t: ta.step(n), batches),
                    _train(b, lambda n, t: tb.step(n), batches)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="SGLD is not supported: it adds random noise"):
        Trainer(_net().collect_params(), mx.optimizer.SGLD())
    with pytest.raises(ValueError, match="Nadam is not supported: its m_schedule"):
        Trainer(_net().collect_params(), "nadam")
    with pytest.raises(ValueError, match="'adamw': MXNet registers no such optimizer"):
        Trainer(_net().collect_params(), "adamw")
    nag = Trainer(_net().collect_params(), "nag", {"momentum": 0.9})
    lars = Trainer(_net().collect_params(), "lars", {"momentum": 0.9, "eta": 0.02})
    assert nag.optimizer.nesterov and lars.optimizer.lars and lars.optimizer.lars_eta == 0.02
    lbsgd = Trainer(_net().collect_params(), "lbsgd", {"momentum": 0.9})
    assert lbsgd.optimizer.lars and lbsgd.optimizer.momentum == 0.9
    with pytest.raises(ValueError, match="lbsgd's warmup_epochs are not supported"):
        Trainer(_net().collect_params(), "lbsgd", {"momentum": 0.9, "warmup_epochs": 3})


def test_large_batch_keywords_derive_scaling_and_warmup_from_the_world():
    """η(t) = warmed_up(ρ·η_user, W, η_user(0)) with ρ = B/B_ref from the store's world:
    2 CPU devices × 8 images = global batch 16 against reference 4 gives ρ = 4."""
    from mxlarge import schedulers

    ctx = [mx.cpu(0), mx.cpu(1)]
    net = gluon.nn.Dense(2, in_units=3)
    net.initialize(ctx=ctx)
    tr = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                 kvstore="device", reference_batch=4, warmup_steps=5, batch_size=16)
    want = schedulers.warmed_up(schedulers.Constant(0.4), 5, 0.1)
    assert [tr.lr_at(t) for t in range(8)] == pytest.approx([want(t) for t in range(8)])
    assert tr.lr_at(0) == pytest.approx(0.1) and tr.lr_at(5) == pytest.approx(0.4)
    assert tr.world(16).global_batch == 16


@pytest.mark.parametrize("warmup_lr", [None, 0.5])
def test_a_global_batch_below_the_reference_is_never_ramped_down_and_said_once(warmup_lr,
                                                                              capsys):
    """Global batch 16 against reference 64: ρ = 1/4, η = 0.025 from step 0 (the warmup
    would start at η_user(0) = 0.1, or at warmup_lr, and ramp down); the run steps through
    the first update and the line is printed once, naming both LRs."""
    tr = Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1},
                 reference_batch=64, warmup_steps=10, warmup_lr=warmup_lr, batch_size=16)
    lrs = [tr.lr_at(t) for t in range(20)]
    assert lrs == pytest.approx([0.025] * 20)
    assert all(b >= a for a, b in zip(lrs, lrs[1:]))
    batches = _batches(steps=3)
    net = _net()
    tr = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                 reference_batch=64, warmup_steps=10, warmup_lr=warmup_lr)
    capsys.readouterr()
    _train(net, lambda n, t: tr.step(n), batches)
    said = [ln for ln in capsys.readouterr().err.splitlines() if "scaled down" in ln]
    n = len(batches[0][0])
    assert len(said) == 1, said
    assert f"global batch of {n} is below the reference batch of 64" in said[0]
    assert f"scaled down {n / 64:.4g}x (linear scaling), from 0.1 to {0.1 * n / 64:.6g}" \
        in said[0]


def test_a_global_batch_above_the_reference_warms_up_and_says_nothing(capsys):
    tr = Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1},
                 reference_batch=4, warmup_steps=4, batch_size=16)
    assert [tr.lr_at(t) for t in range(6)] == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert "scaled down" not in capsys.readouterr().err


def test_allreduce_grads_then_update_equals_step():
    """Call 5, ``allreduce_grads()`` / ``update(batch_size)``."""
    batches = _batches(steps=4)
    a, b = _net(), _net()
    p = {"learning_rate": 0.1, "momentum": 0.9}
    ta, tb = (Trainer(n.collect_params(), "sgd", dict(p)) for n in (a, b))
    wa = _train(a, lambda n, t: ta.step(n), batches)
    wb = _train(b, lambda n, t: (tb.allreduce_grads(), tb.update(n)), batches)
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)


def test_set_learning_rate_keeps_the_momentum_correction():
    """Call 6, ``set_learning_rate``: from the next update on η = lr, and update t0 uses the
    corrected momentum m·lr/η(t0−1): the same weights as the explicit Join schedule."""
    from mxlarge.schedulers import Join

    batches = _batches(steps=6)
    a, b = _net(), _net()
    ta = Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})

    def step_a(n, t):
        if t == 3:
            ta.set_learning_rate(0.025)
        ta.step(n)

    wa = _train(a, step_a, batches)
    tb = Trainer(b.collect_params(), Join((Constant(0.1), Constant(0.025)), (3,)),
                 momentum=0.9, weight_decay=0.0)
    wb = _train(b, tb.step, batches)
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)
    assert ta.learning_rate == 0.025
    assert ta.optimizer.momentum_at(3) == pytest.approx(0.9 * 0.25)


def test_optimizer_property_is_the_mxnet_optimizer():
    """Call 7, ``.optimizer``."""
    tr = Trainer(_net().collect_params(), "sgd", {"momentum": 0.8, "wd": 2e-4})
    assert isinstance(tr.optimizer, mx.optimizer.Optimizer)
    assert tr.optimizer.momentum == 0.8 and tr.optimizer.wd == 2e-4


def test_kvstore_none_is_one_process():
    """Call 8, ``kvstore=None``: no store, the same update as ``local``."""
    batches = _batches(steps=3)
    a, b = _net(), _net()
    ta = Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=None)
    tb = Trainer(b.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore="local")
    assert ta.store.kv is None and ta.num_workers == 1
    for x, y in zip(_train(a, lambda n, t: ta.step(n), batches),
                    _train(b, lambda n, t: tb.step(n), batches)):
        np.testing.assert_array_equal(x, y)


def _deferred_net(seed, bn, hybridize, ctx=None):
    """A GluonCV-style net whose shapes come from the first forward (no in_channels/in_units)."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(4, 3, padding=1))
    if bn:
        net.add(gluon.nn.BatchNorm())
    net.add(gluon.nn.Activation("relu"), gluon.nn.GlobalAvgPool2D(), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if hybridize:
        net.hybridize()
    return net


def _lr_sequential(steps=6):
    """GluonCV's warmup + cosine decay, as its ImageNet script builds it."""
    from gluoncv.utils import LRScheduler, LRSequential

    return LRSequential([LRScheduler("linear", base_lr=0.0, target_lr=0.2, niters=2),
                         LRScheduler("cosine", base_lr=0.2, target_lr=0, niters=steps - 2)])


@pytest.mark.parametrize("bn", [True, False])
@pytest.mark.parametrize("hybridize", [True, False])
def test_deferred_init_trains_as_if_the_shapes_were_known_first(bn, hybridize):
    """Call 9, deferred initialisation (GluonCV's ``net.initialize()`` then Trainer, shapes
    from the first forward), on 2 devices so the store's broadcast runs: bitwise the weights of
    the same net given one forward pass before its Trainer; NAG with an LRSequential warmup."""
    ctx = [mx.cpu(0), mx.cpu(1)]
    batches = _batches(steps=6)

    def run(forward_first):
        net = _deferred_net(0, bn, hybridize, ctx)
        if forward_first:
            for c in ctx:
                net(mx.nd.zeros((2, 1, 6, 6), ctx=c))
        p = {"momentum": 0.9, "wd": 1e-4, "lr_scheduler": _lr_sequential()}
        tr = Trainer(net.collect_params(), "nag", p, kvstore="device")
        assert tr.is_ready == forward_first
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        for x, y in batches:
            xs, ys = gluon.utils.split_and_load(x, ctx), gluon.utils.split_and_load(y, ctx)
            with autograd.record():
                losses = [loss_fn(net(a), b) for a, b in zip(xs, ys)]
            autograd.backward(losses)
            tr.step(x.shape[0])
        assert tr.is_ready and tr.num_update == 6
        return [a.asnumpy() for v in net.collect_params().values() for a in v.list_data()]

    for x, y in zip(run(True), run(False)):
        np.testing.assert_array_equal(x, y)


def test_step_before_the_first_forward_names_the_uninitialised_parameters():
    net = _deferred_net(0, True, False)
    tr = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    with pytest.raises(ValueError, match="were never initialised: run the net's forward"):
        tr.step(8)


def test_update_on_kvstore_refused_with_the_reason():
    """Call 10, ``update_on_kvstore=True``."""
    with pytest.raises(ValueError, match="update_on_kvstore=True is not supported: .*wd_mult"):
        Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1}, update_on_kvstore=True)
    Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1}, update_on_kvstore=False)


def test_ignore_stale_grad_refused_before_any_push():
    """Call 11, ``step(n, ignore_stale_grad=True)`` (also gluon's positional form)."""
    net = _net()
    tr = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    before = [p.data().asnumpy() for p in net.collect_params().values()]
    for call in (lambda: tr.step(8, ignore_stale_grad=True), lambda: tr.step(8, True)):
        with pytest.raises(ValueError, match="ignore_stale_grad=True is not supported"):
            call()
    for p, w in zip(net.collect_params().values(), before):
        np.testing.assert_array_equal(p.data().asnumpy(), w)
    assert tr.num_update == 0


def test_load_states_reads_gluon_trainer_files(tmp_path):
    """Call 12, ``load_states`` of ``gluon.Trainer.save_states``'s pickle: its momentum continues
    exactly where gluon.Trainer would (constant LR, decay everywhere)."""
    batches = _batches(steps=5)
    p = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}
    a = _net()
    ga = gluon.Trainer(a.collect_params(), "sgd", dict(p))
    _train(a, lambda n, t: ga.step(n), batches[:2])
    f = str(tmp_path / "gluon.states")
    ga.save_states(f)
    b = _net()
    for x, y in zip(a.collect_params().values(), b.collect_params().values()):
        y.set_data(x.data())
    tb = Trainer(b.collect_params(), "sgd", dict(p), decay_bn_bias=True)
    tb.load_states(f)
    wa = _train(a, lambda n, t: ga.step(n), batches[2:])
    wb = _train(b, lambda n, t: tb.step(n), batches[2:])
    for x, y in zip(wa, wb):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_load_states_refuses_a_pickle_that_is_not_states(tmp_path):
    import pickle

    f = tmp_path / "evil.states"
    f.write_bytes(pickle.dumps(({0: None}, __import__("subprocess").Popen), protocol=2))
    with pytest.raises(ValueError, match="not a gluon.Trainer states file.*not allowed"):
        Trainer(_net().collect_params(), "sgd", {}).load_states(str(f))


def test_save_states_round_trip_gluon_form(tmp_path):
    """Call 13, ``save_states``: mxlarge's own NDArray file (no pickle) loads back."""
    batches = _batches(steps=2)
    net = _net()
    tr = Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    _train(net, lambda n, t: tr.step(n), batches)
    f = str(tmp_path / "s.nd")
    tr.save_states(f)
    other = Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    other.load_states(f)
    for key, value in tr.state_arrays().items():
        np.testing.assert_array_equal(other.state_arrays()[key].asnumpy(), value.asnumpy())


def test_the_two_forms_do_not_mix():
    with pytest.raises(ValueError, match="go in optimizer_params"):
        Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1}, momentum=0.9)
    with pytest.raises(ValueError, match="schedule passed to the Trainer is final"):
        Trainer(_net().collect_params(), Constant(0.1), reference_batch=256)


def test_a_list_of_parameters_works_as_with_gluon_and_anything_else_is_refused():
    """gluon.Trainer takes ``list(net.collect_params().values())`` too: same weights."""
    batches = _batches(steps=4)
    a, b = _net(), _net()
    ta = Trainer(a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    tb = Trainer(list(b.collect_params().values()), "sgd", {"learning_rate": 0.1,
                                                            "momentum": 0.9})
    for x, y in zip(_train(a, lambda n, t: ta.step(n), batches),
                    _train(b, lambda n, t: tb.step(n), batches)):
        np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match="params: expected a ParameterDict"):
        Trainer([1, 2], "sgd", {"learning_rate": 0.1})


# -- what a gluon.Trainer script reads back, and what differs by default -------------------------

def test_learning_rate_reads_back_what_set_learning_rate_set_as_gluon_does():
    """Gluon returns the new LR at once (also when set twice between updates)."""
    net_a, net_b = _net(), _net()
    ga = gluon.Trainer(net_a.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    tb = Trainer(net_b.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    seen = []
    for net, tr in ((net_a, ga), (net_b, tb)):
        lrs = []

        def step(n, t, tr=tr, lrs=lrs):
            if t == 2:
                tr.set_learning_rate(0.05)
                lrs.append(tr.learning_rate)
                tr.set_learning_rate(tr.learning_rate * 0.5)  # decays twice before an update
                lrs.append(tr.learning_rate)
            tr.step(n)
            lrs.append(tr.learning_rate)

        _train(net, step, _batches(steps=4))
        seen.append(lrs)
    assert seen[0] == seen[1] == pytest.approx([0.1, 0.1, 0.05, 0.025, 0.025, 0.025])


def test_optimizer_num_update_is_the_update_count_as_in_gluon():
    wa, wb, ga, tb = _gluon_and_mxlarge({"learning_rate": 0.1, "momentum": 0.9}, steps=5)
    assert ga.optimizer.num_update == 5
    assert tb.optimizer.num_update == tb.num_update == 5


def test_set_learning_rate_with_a_scheduler_raises_gluons_user_warning():
    """gluon.Trainer raises MXNet's UserWarning (an exception) when optimizer_params hold an
    lr_scheduler; mxlarge.Trainer raises the same one, with the same text."""
    def sched():
        return mx.lr_scheduler.FactorScheduler(step=2, factor=0.5, base_lr=0.1)

    ga = gluon.Trainer(_net().collect_params(), "sgd", {"lr_scheduler": sched()})
    with pytest.raises(UserWarning) as gluon_raised:
        ga.set_learning_rate(0.01)
    tb = Trainer(_net().collect_params(), "sgd", {"lr_scheduler": sched()})
    with pytest.raises(UserWarning) as ours:
        tb.set_learning_rate(0.01)
    assert type(ours.value) is type(gluon_raised.value)
    assert str(ours.value) == str(gluon_raised.value)
    assert tb.lr_at(0) == pytest.approx(0.1)  # nothing changed


def test_the_default_update_is_said_at_construction_and_the_keywords_give_gluons_bitwise(capsys):
    """The Gluon form says once, on stderr, what differs from gluon.Trainer by default; with
    momentum_correction=False, decay_bn_bias=True it is silent and bitwise gluon.Trainer's
    (sgd, BN net, weight decay, a MultiFactor schedule so the LR changes)."""
    def sched():
        return mx.lr_scheduler.MultiFactorScheduler(step=[2, 4], factor=0.5, base_lr=0.2)

    p = {"learning_rate": 0.2, "momentum": 0.9, "wd": 1e-3}
    capsys.readouterr()
    Trainer(_net().collect_params(), "sgd", {**p, "lr_scheduler": sched()})
    err = capsys.readouterr().err
    assert err.count("mxlarge.Trainer: note:") == 1, err
    assert ("the update differs from gluon.Trainer's by momentum correction" in err
            and "no weight decay on BatchNorm gamma/beta and biases" in err
            and "momentum_correction=False, decay_bn_bias=True give gluon.Trainer's update"
            in err), err
    Trainer(_net().collect_params(), "nag", p)
    assert "nag with wd: the decay term reads the weight before the update" in \
        capsys.readouterr().err

    batches = _batches(steps=6)
    a, b, c = _net(), _net(), _net()
    ga = gluon.Trainer(a.collect_params(), "sgd", {**p, "lr_scheduler": sched()})
    wa = _train(a, lambda n, t: ga.step(n), batches)
    tb = Trainer(b.collect_params(), "sgd", {**p, "lr_scheduler": sched()},
                 momentum_correction=False, decay_bn_bias=True)
    assert capsys.readouterr().err == ""
    wb = _train(b, lambda n, t: tb.step(n), batches)
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)
    tc = Trainer(c.collect_params(), "sgd", {**p, "lr_scheduler": sched()})
    wc = _train(c, lambda n, t: tc.step(n), batches)
    assert max(float(np.abs(x - y).max()) for x, y in zip(wa, wc)) > 1e-4


def _gluoncv_style(net, make_trainer, batches, save=None, load=None):
    """A GluonCV-style loop over ``batches``: ``trainer.step(batch_size)`` with no step, the
    optional ``load_states`` right after the Trainer (before the first forward), as GluonCV's
    ``--resume-states``."""
    tr = make_trainer(net)
    if load is not None:
        tr.load_states(load)
    _train(net, lambda n, t: tr.step(n), batches)
    if save is not None:
        tr.save_states(save)
    return tr


def _copy_params(src, dst):
    for p, q in zip(src.collect_params().values(), dst.collect_params().values()):
        q.set_data(p.data())


@pytest.mark.parametrize("bn", [True, False])
def test_resume_from_mxlarge_states_continues_the_schedule_bitwise(tmp_path, bn):
    """2 epochs, save_states, a fresh net (deferred init) and Trainer that load_states, 2 more:
    bitwise 4 epochs (NAG, LRSequential warmup + cosine, momentum correction)."""
    batches = _batches(steps=8)

    def make(net):
        return Trainer(net.collect_params(), "nag",
                       {"momentum": 0.9, "wd": 1e-4, "lr_scheduler": _lr_sequential(8)})

    whole = _deferred_net(0, bn, True)
    tw = _gluoncv_style(whole, make, batches)
    first = _deferred_net(0, bn, True)
    f = str(tmp_path / "e2.states")
    _gluoncv_style(first, make, batches[:4], save=f)
    first.save_parameters(str(tmp_path / "e2.params"))
    second = _deferred_net(5, bn, True)
    second.load_parameters(str(tmp_path / "e2.params"))  # GluonCV's --resume-params
    ts = _gluoncv_style(second, make, batches[4:], load=f)
    assert ts.num_update == tw.num_update == 8
    for p, q in zip(whole.collect_params().values(), second.collect_params().values()):
        np.testing.assert_array_equal(p.data().asnumpy(), q.data().asnumpy())


def test_resume_from_gluon_states_continues_the_schedule_bitwise(tmp_path):
    """gluon.Trainer 2 epochs + save_states, then mxlarge.Trainer (gluon's update: the two
    keywords) load_states + 2 epochs: bitwise gluon.Trainer's 4 epochs, warmup not replayed."""
    batches = _batches(steps=8)
    p = {"momentum": 0.9, "wd": 1e-4}

    def gluon_trainer(net):
        return gluon.Trainer(net.collect_params(), "sgd", {**p, "lr_scheduler": _lr_sequential(8)})

    def mxlarge_trainer(net):
        return Trainer(net.collect_params(), "sgd", {**p, "lr_scheduler": _lr_sequential(8)},
                       momentum_correction=False, decay_bn_bias=True)

    whole = _deferred_net(0, True, True)
    _gluoncv_style(whole, gluon_trainer, batches)
    first = _deferred_net(0, True, True)
    f = str(tmp_path / "gluon.states")
    _gluoncv_style(first, gluon_trainer, batches[:4], save=f)
    first.save_parameters(str(tmp_path / "e2.params"))
    second = _deferred_net(5, True, True)
    second.load_parameters(str(tmp_path / "e2.params"))
    ts = _gluoncv_style(second, mxlarge_trainer, batches[4:], load=f)
    assert ts.num_update == 8
    for p_, q in zip(whole.collect_params().values(), second.collect_params().values()):
        np.testing.assert_array_equal(p_.data().asnumpy(), q.data().asnumpy())


def _sched():
    return mx.lr_scheduler.MultiFactorScheduler(step=[2, 4], factor=0.5, base_lr=0.01)


def _adam_family(name, make, steps=6, **kwargs):
    """Weights and per-step LRs of ``make(params, name, optimizer_params)`` on the BN net."""
    net = _net()
    tr = make(net.collect_params(), name, {"learning_rate": 0.01, "wd": 1e-3,
                                           "lr_scheduler": _sched()}, **kwargs)
    lrs = []
    w = _train(net, lambda n, t: (tr.step(n), lrs.append(tr.learning_rate)), _batches(steps=steps))
    return w, lrs, tr, net


@pytest.mark.parametrize("name", ["adam", "lamb", "rmsprop"])
def test_any_mxnet_optimizer_is_gluons_update_with_the_recipes_roles(name):
    """Adam, LAMB (and RMSProp) with an lr_scheduler in one process: with decay_bn_bias=True
    bitwise gluon.Trainer's weights and LR sequence; by default (no decay on BN γ/β and biases)
    bitwise gluon.Trainer's with wd_mult = 0 on the 1-D tensors; reference_batch and warmup
    reshape the LR sequence as for SGD."""
    wa, la, _, _ = _adam_family(name, gluon.Trainer)
    wb, lb, tb, _ = _adam_family(name, Trainer, decay_bn_bias=True)
    assert lb == la == pytest.approx([0.01, 0.01, 0.005, 0.005, 0.0025, 0.0025])
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)
    assert tb.optimizer.momentum == 0.0  # nothing to correct: the moments carry no LR

    def no_decay_on_1d(params, *args):
        for p in params.values():
            if p.grad_req != "null" and len(p.shape) <= 1:
                p.wd_mult = 0.0
        return gluon.Trainer(params, *args)

    wc, _, _, _ = _adam_family(name, no_decay_on_1d)
    wd_, _, _, _ = _adam_family(name, Trainer)
    for x, y in zip(wc, wd_):
        np.testing.assert_array_equal(x, y)
    assert max(float(np.abs(x - y).max()) for x, y in zip(wa, wd_)) > 0

    _, le, _, _ = _adam_family(name, Trainer, reference_batch=4, warmup_steps=2,
                               warmup_lr=0.001)
    # ρ = 8/4 = 2 times η_user, warmed up linearly from 0.001 to ρ·η_user(2) over 2 updates
    assert le == pytest.approx([0.001, 0.0055, 0.01, 0.01, 0.005, 0.005])


def test_adam_states_resume_bitwise_and_gluon_adam_states_are_read(tmp_path):
    """Adam's mean and variance (and the update count its bias correction reads) travel in
    mxlarge's states file: 3 + 3 resumed steps are bitwise the 6 uninterrupted ones; a
    gluon.Trainer Adam states file is read too."""
    batches = _batches(steps=6)
    whole = _net()
    tw = Trainer(whole.collect_params(), "adam", {"learning_rate": 0.01, "wd": 1e-3})
    want = _train(whole, lambda n, t: tw.step(n), batches)

    first = _net()
    tf = Trainer(first.collect_params(), "adam", {"learning_rate": 0.01, "wd": 1e-3})
    _train(first, lambda n, t: tf.step(n), batches[:3])
    first.save_parameters(str(tmp_path / "p"))
    tf.save_states(str(tmp_path / "s"))
    assert {k.split(":")[0] for k in mx.nd.load(str(tmp_path / "s"))} == \
        {"state0", "state1", "num_update"}
    again = _net(seed=5)
    again.load_parameters(str(tmp_path / "p"))
    ta = Trainer(again.collect_params(), "adam", {"learning_rate": 0.01, "wd": 1e-3})
    ta.load_states(str(tmp_path / "s"))
    assert ta.num_update == 3
    got = _train(again, lambda n, t: ta.step(n), batches[3:])
    for x, y in zip(want, got):
        np.testing.assert_array_equal(x, y)

    g = _net()
    gt = gluon.Trainer(g.collect_params(), "adam", {"learning_rate": 0.01})
    _train(g, lambda n, t: gt.step(n), batches[:2])
    gt.save_states(str(tmp_path / "g"))
    m = Trainer(_net().collect_params(), "adam", {"learning_rate": 0.01})
    m.load_states(str(tmp_path / "g"))
    assert m.num_update == 2
    names = sorted(m.names)
    for key, value in m.state_arrays().items():
        kind, i = key.split(":")
        ref = gt._updaters[0].states[names.index(m.names[int(i)])][int(kind[-1])]
        np.testing.assert_array_equal(value.asnumpy(), ref.asnumpy())


@pytest.mark.parametrize("kvstore", ["local", "device", None])
def test_a_non_dist_store_in_a_launched_job_of_several_workers_is_refused(monkeypatch, kvstore):
    """What a launched worker's environment says (DMLC_ROLE=worker, 2 workers) with a store
    that would train a model per worker: refused at construction, naming the store and the
    fix; one worker, or outside a launcher, it is accepted."""
    from mxlarge.errors import InputError

    monkeypatch.setenv("DMLC_ROLE", "worker")
    monkeypatch.setenv("DMLC_NUM_WORKER", "2")
    with pytest.raises(InputError, match=f"kvstore {kvstore!r} in a launched job of 2 workers: "
                       "each worker would train a model of its own; pass "
                       "kvstore='dist_sync'"):
        Trainer(_net().collect_params(), "sgd", kvstore=kvstore)
    monkeypatch.setenv("DMLC_NUM_WORKER", "1")
    Trainer(_net().collect_params(), "sgd", kvstore=kvstore)


def test_a_dist_store_outside_a_launcher_names_the_trainers_fix_not_a_config_key(monkeypatch):
    from mxlarge.errors import InputError

    monkeypatch.delenv("DMLC_ROLE", raising=False)
    for name in ("dist", "dist_sync"):
        with pytest.raises(InputError) as e:
            Trainer(_net().collect_params(), "adam", kvstore=name)
        assert str(e.value).startswith(f"kvstore {name!r} needs a launched job")
        assert "kvstore='local'" in str(e.value) and "dist.kvstore" not in str(e.value)


def test_mxnets_p3_store_with_several_servers_is_refused_before_it_hangs(monkeypatch):
    """DMLC_PS_VAN_TYPE=p3 (MXNet's P3 store) hangs in kv.init with 2 servers
    (docs/mxnet-facts.md): refused in a launched worker's environment before any store
    exists; with one server it is MXNet's to run."""
    from mxlarge.errors import InputError

    monkeypatch.setenv("DMLC_ROLE", "worker")
    monkeypatch.setenv("DMLC_PS_VAN_TYPE", "p3")
    monkeypatch.setenv("DMLC_NUM_SERVER", "2")
    with pytest.raises(InputError, match=r"^DMLC_PS_VAN_TYPE=p3 with several servers: MXNet "
                       r"1\.9\.1's P3 store hangs in kv.init"):
        Trainer(_net().collect_params(), "sgd", kvstore="dist_sync")


def test_the_note_names_momentum_correction_only_when_the_lr_changes(capsys):
    capsys.readouterr()
    Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    assert capsys.readouterr().err == ""  # constant LR, no wd: nothing differs from gluon's
    Trainer(_net().collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
            warmup_steps=3)
    assert "momentum correction" in capsys.readouterr().err
    Trainer(_net().collect_params(), "adam", {"learning_rate": 0.1, "wd": 1e-4},
            warmup_steps=3)
    err = capsys.readouterr().err
    assert err.count("note:") == 1 and "momentum" not in err, err
    assert "decay_bn_bias=True gives gluon.Trainer's update" in err


def test_horovods_keywords_are_mapped_or_refused_with_the_reason():
    """A migrated ``hvd.DistributedTrainer`` line may keep ``compression=`` (a Horovod
    compressor) or ``gradient_predivide_factor=``: the first is refused naming
    ``wire_dtype='float16'``, the second accepted at 1.0 only, each with the reason."""
    class FP16Compressor:  # what hvd.Compression.fp16 is: a class with compress/decompress
        @staticmethod
        def compress(tensor):
            return tensor.astype("float16"), tensor.dtype

    with pytest.raises(ValueError, match=r"compression=FP16Compressor: expected MXNet's "
                       r"gradient-compression dict .* for Horovod's Compression.fp16 "
                       r"\(--fp16-allreduce\) pass wire_dtype='float16'"):
        Trainer(_net().collect_params(), "sgd", compression=FP16Compressor)
    with pytest.raises(ValueError, match="gradient_predivide_factor=2.0: Horovod splits its "
                       "1/size average"):
        Trainer(_net().collect_params(), "sgd", gradient_predivide_factor=2.0)
    Trainer(_net().collect_params(), "sgd", gradient_predivide_factor=1.0)


def test_clip_gradient_is_mxnets_for_adam_and_refused_for_the_sgd_family():
    """Adam clips inside MXNet's kernel after the 1/(k·n) rescale, so ``clip_gradient`` is
    gluon.Trainer's (bitwise, one process); the momentum-SGD family refuses it."""
    batches = _batches(steps=4)
    p = {"learning_rate": 0.01, "clip_gradient": 0.05}
    a, b = _net(), _net()
    ga = gluon.Trainer(a.collect_params(), "adam", dict(p))
    tb = Trainer(b.collect_params(), "adam", dict(p), decay_bn_bias=True)
    for x, y in zip(_train(a, lambda n, t: ga.step(n), batches),
                    _train(b, lambda n, t: tb.step(n), batches)):
        np.testing.assert_array_equal(x, y)
    c = _net()
    tc = Trainer(c.collect_params(), "adam", {"learning_rate": 0.01}, decay_bn_bias=True)
    unclipped = _train(c, lambda n, t: tc.step(n), batches)
    clipped = [v.data().asnumpy() for v in b.collect_params().values()]
    assert any(not np.array_equal(x, y) for x, y in zip(unclipped, clipped))  # it did clip
    with pytest.raises(ValueError, match="clip_gradient is not supported with the "
                       "momentum-SGD family"):
        Trainer(_net().collect_params(), "sgd", {"clip_gradient": 1.0})
