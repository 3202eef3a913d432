"""The gradient noise scale (McCandlish et al.): the estimator against closed forms."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from mxlarge.gns import NoiseScale, unbiased
from mxlarge.loop import TrainLoop
from mxlarge.schedulers import Constant
from mxlarge.trainer import Trainer


def test_unbiased_estimates_closed_form():
    # E|G_B|² = |G|² + tr(Σ)/B exactly -> the estimator inverts it exactly
    g2, tr = 2.0, 30.0
    small, big = g2 + tr / 8, g2 + tr / 64
    assert unbiased(small, 8, big, 64) == pytest.approx((g2, tr))
    ns = NoiseScale(8, 64, decay=0.5)
    for _ in range(3):
        m = ns.update(small, big)
    assert m["gns/b_simple"] == pytest.approx(tr / g2)
    with pytest.raises(ValueError):
        unbiased(1.0, 8, 1.0, 8)


class _Regression:
    """y = x·w* + ε with x ~ N(0, I_d), ε ~ N(0, σ²); at w = w* + r the per-sample gradient of
    ½(x·w − y)² has mean G = r and covariance Σ = |r|² I + r rᵀ + σ² I (Isserlis), so
    B_simple = tr Σ / |G|² = ((d + 1)|r|² + d σ²) / |r|²."""

    def __init__(self, d, n_per_step, steps, sigma, seed=0):
        rng = np.random.RandomState(seed)
        self.w_star = rng.randn(1, d).astype(np.float32)
        self.r = rng.randn(1, d).astype(np.float32) * 0.5
        self.d, self.sigma = d, sigma
        self.batches = []
        for _ in range(steps):
            x = rng.randn(n_per_step, d).astype(np.float32)
            y = x @ self.w_star.T + sigma * rng.randn(n_per_step, 1).astype(np.float32)
            self.batches.append((mx.nd.array(x), mx.nd.array(y)))
        self.steps_per_epoch = steps

    def epoch(self, epoch):
        return iter(self.batches)

    def analytic(self):
        r2 = float((self.r ** 2).sum())
        return ((self.d + 1) * r2 + self.d * self.sigma ** 2) / r2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gns_estimate_within_8_percent_of_closed_form_and_not_of_a_wrong_one(seed):
    """d = 2 and σ = 0.5 make the r·rᵀ term of Σ a large part of tr Σ, so the closed form
    without it, (d|r|² + dσ²)/|r|², is 23-30% lower than the right one for these seeds, while
    1000 steps at a fixed w (EMA decay 0.998) bring the estimate within 4% of the right one
    (measured: -1.8%, -2.1%, -1.2%). The 8% tolerance passes the right formula and fails the
    wrong one (checked by putting the wrong one in ``_Regression.analytic``: all three fail)."""
    k, n, d, sigma = 4, 16, 2, 0.5
    prob = _Regression(d=d, n_per_step=k * n, steps=1000, sigma=sigma, seed=seed)
    net = gluon.nn.Dense(1, use_bias=False, in_units=d)
    net.initialize()
    net.weight.set_data(mx.nd.array(prob.w_star + prob.r))
    trainer = Trainer(net.collect_params(), Constant(0.0), momentum=0.0, weight_decay=0.0,
                      simulate_workers=k)
    ns = NoiseScale(n, k * n, decay=0.998)
    loop = TrainLoop(net=net, trainer=trainer, train_source=prob, loss_fn=gluon.loss.L2Loss(),
                     epochs=1, gns=ns, gns_every=1)
    loop.run()
    est = ns.metrics()["gns/b_simple"]
    r2 = float((prob.r ** 2).sum())
    without_rrT = (d * r2 + d * sigma ** 2) / r2
    assert est == pytest.approx(prob.analytic(), rel=0.08), (est, prob.analytic())
    assert est != pytest.approx(without_rrT, rel=0.08), (est, without_rrT)
