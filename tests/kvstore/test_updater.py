"""The custom updater against independent NumPy implementations of Goyal et al.'s equations."""
import pickle

import mxnet as mx
import numpy as np
import pytest

from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.schedulers import goyal

SHAPES = [(4, 3), (5,), (2, 3, 3), (7,)]  # two "weights" (ndim > 1), two 1-D tensors
NO_DECAY = (1, 3)
STEPS = 24
# Warmup of 8 steps from 0.1 to 0.8, drops at 14 and 20: the LR changes on most steps.
SCHED = goyal(peak_lr=0.8, warmup_lr=0.1, warmup_steps=8, decay_steps=(14, 20))


def _problem(seed=0):
    rng = np.random.RandomState(seed)
    w0 = [rng.randn(*s).astype(np.float32) for s in SHAPES]
    grads = [[rng.randn(*s).astype(np.float32) * 3 for s in SHAPES] for _ in range(STEPS)]
    return w0, grads


def _run_mx(opt, w0, grads, rescale):
    weights = [mx.nd.array(w) for w in w0]
    states = [opt.create_state(i, w) for i, w in enumerate(weights)]
    for t in range(STEPS):
        g = [mx.nd.array(x) for x in grads[t]]
        opt.apply(t, list(range(len(weights))), weights, g, states, rescale)
    return [w.asnumpy() for w in weights], states


def _eq9(w0, grads, m, wd, rescale, nesterov=False):
    """Goyal eq. (9) in float64: u ← m·u + (r·g + λw); w ← w − η·u."""
    w = [x.astype(np.float64) for x in w0]
    u = [np.zeros_like(x) for x in w]
    for t in range(STEPS):
        lr = SCHED(t)
        for i in range(len(w)):
            lam = 0.0 if i in NO_DECAY else wd
            d = rescale * grads[t][i] + lam * w[i]
            u[i] = m * u[i] + d
            w[i] = w[i] - lr * ((d + m * u[i]) if nesterov else u[i])
    return w


def _eq10(w0, grads, m, wd, rescale):
    """eq. (10), what stock MXNet SGD does: v ← m·v − η·(r·g + λw); w ← w + v."""
    w = [x.astype(np.float64) for x in w0]
    v = [np.zeros_like(x) for x in w]
    for t in range(STEPS):
        lr = SCHED(t)
        for i in range(len(w)):
            lam = 0.0 if i in NO_DECAY else wd
            v[i] = m * v[i] - lr * (rescale * grads[t][i] + lam * w[i])
            w[i] = w[i] + v[i]
    return w


def _maxdiff(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def test_updater_equals_eq9_through_warmup_and_decay():
    w0, grads = _problem()
    opt = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-2, no_decay=NO_DECAY)
    got, _ = _run_mx(opt, w0, grads, rescale=1 / 32)
    assert _maxdiff(got, _eq9(w0, grads, 0.9, 1e-2, 1 / 32)) <= 1e-6
    # Without correction the same kernel follows eq. (10), measurably away from eq. (9).
    plain = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-2, no_decay=NO_DECAY,
                          momentum_correction=False)
    got10, _ = _run_mx(plain, w0, grads, rescale=1 / 32)
    assert _maxdiff(got10, _eq10(w0, grads, 0.9, 1e-2, 1 / 32)) <= 1e-6
    assert _maxdiff(got10, _eq9(w0, grads, 0.9, 1e-2, 1 / 32)) > 1e-2


def test_stock_mxnet_sgd_is_eq10_and_not_eq9():
    """Pins the fact the updater exists for: MXNet's SGD with a schedule never corrects."""
    w0, grads = _problem(1)

    class _Sched(mx.lr_scheduler.LRScheduler):
        def __call__(self, num_update):
            return SCHED(num_update - 1)  # MXNet's first update asks for num_update = 1

    opt = mx.optimizer.SGD(momentum=0.9, wd=1e-2, rescale_grad=1 / 32, lr_scheduler=_Sched(),
                           learning_rate=SCHED(0))
    opt.set_wd_mult({})
    weights = [mx.nd.array(w) for w in w0]
    states = [opt.create_state(i, w) for i, w in enumerate(weights)]
    for t in range(STEPS):
        for i, w in enumerate(weights):
            if i in NO_DECAY:
                opt.wd_mult[i] = 0.0
            opt.update(i, w, mx.nd.array(grads[t][i]), states[i])
    got = [w.asnumpy() for w in weights]
    assert _maxdiff(got, _eq10(w0, grads, 0.9, 1e-2, 1 / 32)) <= 1e-6
    assert _maxdiff(got, _eq9(w0, grads, 0.9, 1e-2, 1 / 32)) > 1e-2


def test_nesterov_with_correction_equals_eq9():
    w0, grads = _problem(2)
    opt = LargeBatchSGD(SCHED, momentum=0.9, nesterov=True, wd=1e-2, no_decay=NO_DECAY)
    got, _ = _run_mx(opt, w0, grads, rescale=1 / 8)
    # float32 kernel vs float64 reference; weights grow to ~10 here
    assert _maxdiff(got, _eq9(w0, grads, 0.9, 1e-2, 1 / 8, nesterov=True)) <= 1e-5


def test_lars_matches_numpy_trust_ratio():
    w0, grads = _problem(3)
    eta, wd, m, r = 0.02, 1e-3, 0.9, 1 / 16
    opt = LargeBatchSGD(SCHED, momentum=m, wd=wd, no_decay=NO_DECAY, lars=True, lars_eta=eta)
    got, _ = _run_mx(opt, w0, grads, rescale=r)
    w = [x.astype(np.float64) for x in w0]
    u = [np.zeros_like(x) for x in w]
    for t in range(STEPS):
        lr = SCHED(t)
        for i in range(len(w)):
            lam = 0.0 if i in NO_DECAY else wd
            lr_i = lr
            if i not in NO_DECAY:
                wn, gn = np.linalg.norm(w[i]), np.linalg.norm(r * grads[t][i])
                lr_i = lr * eta * wn / (gn + lam * wn)
            # the velocity carries lr_i (eq. 10) with the global-LR momentum correction
            ratio = SCHED(t) / SCHED(t - 1) if t else 1.0
            u[i] = m * ratio * u[i] - lr_i * (r * grads[t][i] + lam * w[i])
            w[i] = w[i] + u[i]
    assert _maxdiff(got, w) <= 1e-5


def test_mxnet_update_entry_uses_step_count_minus_one():
    """Run through MXNet's own per-call ``update`` (as gluon.Trainer would): same as apply()."""
    w0, grads = _problem(4)
    opt = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-2, no_decay=NO_DECAY, rescale_grad=1 / 32)
    weights = [mx.nd.array(w) for w in w0]
    states = [opt.create_state(i, w) for i, w in enumerate(weights)]
    for t in range(STEPS):
        for i, w in enumerate(weights):
            opt.update(i, w, mx.nd.array(grads[t][i]), states[i])
    assert _maxdiff([w.asnumpy() for w in weights], _eq9(w0, grads, 0.9, 1e-2, 1 / 32)) <= 1e-6


def test_no_decay_roles_under_pure_weight_decay():
    """With zero gradient only decay acts: no-decay tensors stay, the others shrink by 1 − ηλ."""
    w0 = [np.ones(s, np.float32) for s in SHAPES]
    opt = LargeBatchSGD(SCHED, momentum=0.0, wd=0.05, no_decay=NO_DECAY)
    weights = [mx.nd.array(w) for w in w0]
    zeros = [mx.nd.zeros(s) for s in SHAPES]
    opt.apply(0, [0, 1, 2, 3], weights, zeros, [None] * 4, 1.0)
    for i, w in enumerate(weights):
        expected = 1.0 if i in NO_DECAY else 1.0 - SCHED(0) * 0.05
        np.testing.assert_allclose(w.asnumpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("proto", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_updater_pickles(proto):
    opt = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-4, no_decay=(1, 3), lars=True)
    data = pickle.dumps(opt, protocol=proto)
    if proto == 0:
        data.decode("utf-8")  # MXNet sends protocol-0 pickles to servers as UTF-8 text
    back = pickle.loads(data)
    assert back.schedule == SCHED
    assert [back.momentum_at(t) for t in range(STEPS)] == [opt.momentum_at(t) for t in range(STEPS)]
    assert back.no_decay == (1, 3) and back.lars


def test_lars_with_nesterov_refused():
    with pytest.raises(ValueError, match="Nesterov"):
        LargeBatchSGD(SCHED, nesterov=True, lars=True)


def test_mxnet_lr_accessors_are_refused_not_answered_from_a_stale_lr():
    """``trainer.optimizer.learning_rate``/``set_learning_rate`` would read or set MXNet's stored
    LR, which the schedule-driven update never uses: refused with where to look instead."""
    import pytest

    from mxlarge.kvstore.updater import LargeBatchSGD
    from mxlarge.schedulers import Linear

    opt = LargeBatchSGD(Linear(0.1, 1.0, 10))
    assert opt.lr_at(5) == pytest.approx(0.55)
    with pytest.raises(AttributeError, match="trainer.learning_rate"):
        _ = opt.learning_rate
    with pytest.raises(AttributeError, match=r"trainer.set_learning_rate\(lr\)"):
        opt.set_learning_rate(0.5)


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_cpu_kernel_split_is_bitwise_the_multi_tensor_update(monkeypatch, momentum):
    """On CPU, tensors of ALONE elements or more get a single-tensor kernel of their own (faster
    there) and the rest share multi-tensor calls: bitwise the all-multi-tensor update, through
    a changing LR (momentum correction) and mixed decay roles."""
    import mxlarge.kvstore.updater as updater

    rng = np.random.RandomState(3)
    shapes = [(130, 130), (3,), (64, 32, 3, 3), (200,), (1 << 14,), (5, 5)]
    w0 = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads = [[rng.randn(*s).astype(np.float32) for s in shapes] for _ in range(6)]

    def run(alone: int) -> list[np.ndarray]:
        monkeypatch.setattr(updater, "ALONE", alone)
        opt = LargeBatchSGD(SCHED, momentum=momentum, wd=1e-2, no_decay=(1, 3))
        weights = [mx.nd.array(w) for w in w0]
        states = [opt.create_state(i, w) for i, w in enumerate(weights)]
        for t, g in enumerate(grads):
            opt.apply(t, list(range(len(shapes))), weights, [mx.nd.array(x) for x in g],
                      states, 1 / 16)
        return [w.asnumpy() for w in weights] + [s.asnumpy() for s in states if s is not None]

    split = run(updater.ALONE)  # with momentum: three tensors alone, three shared
    assert sum(int(np.prod(s)) >= updater.ALONE for s in shapes) == 3
    multi = run(1 << 40)
    single = run(0)
    for a, b, c in zip(split, multi, single, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert not np.array_equal(split[0], w0[0])  # the update did something


@pytest.mark.parametrize("nesterov", [False, True])
def test_multi_precision_master_copies_follow_the_float32_update(nesterov):
    """float16 weights with multi_precision: the float32 master copies follow exactly the
    float32 update (momentum correction through warmup and decays, per-role decay) on the same
    gradients, and each float16 weight is its master copy rounded."""
    w0, grads = _problem(2)
    w0 = [w.astype(np.float16).astype(np.float32) for w in w0]  # representable in float16
    grads = [[g.astype(np.float16) for g in step] for step in grads]
    ref = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-2, no_decay=NO_DECAY, nesterov=nesterov)
    mp = LargeBatchSGD(SCHED, momentum=0.9, wd=1e-2, no_decay=NO_DECAY, nesterov=nesterov,
                       multi_precision=True)
    w32 = [mx.nd.array(w) for w in w0]
    w16 = [mx.nd.array(w, dtype="float16") for w in w0]
    s32 = [ref.create_state(i, w) for i, w in enumerate(w32)]
    s16 = [mp.create_state_multi_precision(i, w) for i, w in enumerate(w16)]
    assert all(isinstance(s, tuple) and s[1].dtype == np.float32 for s in s16)
    idx = list(range(len(w0)))
    for t in range(STEPS):
        ref.apply(t, idx, w32, [mx.nd.array(g.astype(np.float32)) for g in grads[t]], s32,
                  1 / 32)
        mp.apply(t, idx, w16, [mx.nd.array(g, dtype="float16") for g in grads[t]], s16, 1 / 32)
    for a, (_, master), w in zip(w32, s16, w16):
        np.testing.assert_allclose(master.asnumpy(), a.asnumpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(w.asnumpy(), master.asnumpy().astype(np.float16))
