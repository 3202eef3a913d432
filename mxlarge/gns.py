"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch
Training", App. A.1), measured almost for free from data-parallel training.

Each worker's own normalised gradient G_s is a gradient over a small batch B_s (one worker's or
device's n images); the aggregated gradient G_b is over the global batch B_b. Since
E|G_B|² = |G|² + tr(Σ)/B, two batch sizes give unbiased estimates::

    |G|²  ≈ (B_b·|G_b|² − B_s·|G_s|²) / (B_b − B_s)
    tr(Σ) ≈ (|G_s|² − |G_b|²) / (1/B_s − 1/B_b)

Both are noisy, so separate exponential moving averages are kept and
B_simple = EMA[tr(Σ)] / EMA[|G|²]. The critical batch size is of that order: far above it, more
workers buy little per step.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def unbiased(sq_small: float, b_small: int, sq_big: float, b_big: int) -> tuple[float, float]:
    """(|G|², tr Σ) from mean |G_s|² at batch ``b_small`` and |G_b|² at batch ``b_big``."""
    if not b_big > b_small >= 1:
        raise ValueError(f"need b_big > b_small >= 1, got {b_big}, {b_small}")
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace


@dataclass
class NoiseScale:
    """Exponential moving averages of |G|² and tr(Σ), and B_simple from them.

    Attributes:
        decay: EMA factor β in x̄ ← β·x̄ + (1 − β)·x (bias-corrected by 1 − β^count).
    """

    b_small: int
    b_big: int
    decay: float = 0.9
    g2: float = 0.0
    trace: float = 0.0
    count: int = 0

    def update(self, sq_small: float, sq_big: float) -> dict[str, float]:
        g2, trace = unbiased(sq_small, self.b_small, sq_big, self.b_big)
        self.g2 = self.decay * self.g2 + (1 - self.decay) * g2
        self.trace = self.decay * self.trace + (1 - self.decay) * trace
        self.count += 1
        return self.metrics()

    def metrics(self) -> dict[str, float]:
        corr = 1 - self.decay ** self.count
        g2 = self.g2 / corr
        trace = self.trace / corr
        out = {"gns/g2": g2, "gns/trace": trace}
        # Early on the unbiased |G|² estimate can be <= 0: no meaningful B_simple yet (MLflow
        # would store an infinity as the largest float).
        if g2 > 0 and trace > 0:
            out["gns/b_simple"] = trace / g2
        return out


def sum_sq(grads: Sequence[Any], minus: Sequence[Any] | None = None) -> float:
    """Σ‖g‖² over ``grads`` (of g − minus, if given), with MXNet's ``multi_sum_sq`` in groups of
    32 arrays. Synchronises."""
    import mxnet as mx  # here: the noise-scale arithmetic above is plain Python

    if minus is not None:
        grads = [g - m for g, m in zip(grads, minus)]
    total = 0.0
    for lo in range(0, len(grads), 32):
        chunk = grads[lo:lo + 32]
        total += float(mx.nd.multi_sum_sq(*chunk, num_arrays=len(chunk)).sum().asscalar())
    return total
