r"""Statistics of a study over seeds: intervals, Welch's test, time to target the MLPerf way.

Pure functions over plain numbers (no MXNet, no MLflow). Student's t distribution comes from
``scipy.special`` (``stdtr`` is its CDF, ``stdtrit`` its inverse): SciPy is already installed as a
dependency of scikit-learn and of mnist1d.

* :func:`final_error`: the median of the last 5 epochs' validation error (Goyal et al.).
* :func:`t_interval`: :math:`\bar x \pm t_{(1+c)/2,\,n-1}\, s/\sqrt n` with the sample standard
  deviation :math:`s` (n − 1).
* :func:`welch`: Welch's unequal-variance t-test of two means,

  .. math:: t = \frac{\bar a - \bar b}{\sqrt{s_a^2/n_a + s_b^2/n_b}}, \qquad
            \nu = \frac{(s_a^2/n_a + s_b^2/n_b)^2}
                       {\frac{(s_a^2/n_a)^2}{n_a - 1} + \frac{(s_b^2/n_b)^2}{n_b - 1}},

  two-sided :math:`p = 2\,(1 - F_\nu(|t|))`.
* :func:`first_reaching`: the first evaluation at which the validation error is at or below a
  fixed target (no interpolation between evaluations).
* :func:`mlperf_mean`: MLPerf Training's rule for time to target: at least 5 runs, drop the
  fastest and the slowest, average the rest; a run that never reaches the target is slower than
  any that does, so one such run is the one dropped as slowest, and two or more make the result
  "not reached".
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_MLPERF_RUNS", "MLPerf", "Welch", "final_error", "first_reaching", "mark",
           "mlperf_mean", "t_interval", "welch"]

#: MLPerf Training asks for at least this many runs of a closed-division result (image
#: classification: 5), of which the fastest and the slowest are dropped.
MIN_MLPERF_RUNS = 5


def final_error(val_errors: Sequence[float], last: int = 5) -> float:
    """Goyal et al.'s final error: the median of the last ``last`` epochs' validation error."""
    if not val_errors:
        raise ValueError("no validation errors")
    return float(statistics.median(val_errors[-last:]))


def _t_cdf(t: float, df: float) -> float:
    from scipy.special import stdtr
    return float(stdtr(df, t))


def _t_quantile(p: float, df: float) -> float:
    from scipy.special import stdtrit
    return float(stdtrit(df, p))


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Two-sided ``level`` confidence interval of the mean, ``x̄ ± t·s/√n``; None if n < 2."""
    if not 0 < level < 1:
        raise ValueError(f"level = {level}: expected a number in (0, 1)")
    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    sd = statistics.stdev(values)
    half = _t_quantile((1 + level) / 2, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


@dataclass(frozen=True)
class Welch:
    """Result of :func:`welch`: ``diff`` = mean(a) − mean(b), ``t``, degrees of freedom ``df``
    and the two-sided ``p``."""

    diff: float
    t: float
    df: float
    p: float


def welch(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's two-sided t-test of mean(a) = mean(b); None if either has fewer than 2 values.

    When both samples have zero variance the statistic is undefined: p is 1 for equal means and
    0 otherwise (every draw differs by the same amount).
    """
    if len(a) < 2 or len(b) < 2:
        return None
    ma = statistics.fmean(a)
    mb = statistics.fmean(b)
    va = statistics.variance(a) / len(a)
    vb = statistics.variance(b) / len(b)
    diff = ma - mb
    if va + vb == 0:
        return Welch(diff, math.copysign(math.inf, diff) if diff else 0.0, math.nan,
                     1.0 if diff == 0 else 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return Welch(diff, t, df, 2 * (1 - _t_cdf(abs(t), df)))


def mark(p: float | None) -> str:
    """``**`` for p < 0.01, ``*`` for p < 0.05, ``ns`` otherwise, ``n/a`` without a test."""
    if p is None:
        return "n/a"
    return "**" if p < 0.01 else "*" if p < 0.05 else "ns"


def first_reaching(points: Sequence[tuple[float, float, float, float | None]],
                   target_error: float) -> tuple[float, float, float | None] | None:
    """The first evaluation whose error is <= ``target_error``.

    Args:
        points: ``(step, epoch, val_error, train_seconds)`` per evaluated epoch, in any order;
            ``step`` is the number of updates at the end of that epoch.

    Returns:
        ``(step, epoch, train_seconds)`` of that evaluation, or None if none reaches it.
    """
    for step, epoch, error, seconds in sorted(points, key=lambda p: p[0]):
        if error <= target_error:
            return step, epoch, seconds
    return None


@dataclass(frozen=True)
class MLPerf:
    """Result of :func:`mlperf_mean`.

    Attributes:
        value: mean of the kept runs, None when not computable (see ``why``).
        runs: number of runs given.
        reached: how many of them reached the target.
        why: empty when ``value`` is set, else the reason ("not reached by 2 of 5 runs", "only
            3 runs: MLPerf asks for 5").
    """

    value: float | None
    runs: int
    reached: int
    why: str = ""


def mlperf_mean(times: Sequence[float | None], min_runs: int = MIN_MLPERF_RUNS) -> MLPerf:
    """Drop the fastest and the slowest of ≥ ``min_runs`` times, average the rest.

    ``None`` is a run that never reached the target: it sorts after every finite time, so a
    single one is dropped as the slowest; if a kept run is None the result is None.
    """
    reached = sum(t is not None for t in times)
    if len(times) < min_runs:
        return MLPerf(None, len(times), reached,
                      f"only {len(times)} run{'' if len(times) == 1 else 's'}: MLPerf asks for "
                      f"{min_runs}")
    ordered = sorted(times, key=lambda t: (t is None, t if t is not None else 0.0))
    kept = ordered[1:-1]
    if any(t is None for t in kept):
        return MLPerf(None, len(times), reached,
                      f"not reached by {len(times) - reached} of {len(times)} runs")
    return MLPerf(statistics.fmean([t for t in kept if t is not None]), len(times), reached)
