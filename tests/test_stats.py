"""mxlarge.stats against closed forms and hand-computed values."""
from __future__ import annotations

import math

import pytest

from mxlarge import stats


def test_t_interval_matches_the_table_value():
    lo, hi = stats.t_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451051977987 * math.sqrt(2.5) / math.sqrt(5)  # t_{0.975, 4} from tables
    assert lo == pytest.approx(3 - half, abs=1e-9) and hi == pytest.approx(3 + half, abs=1e-9)
    lo99, hi99 = stats.t_interval([1.0, 2.0, 3.0, 4.0, 5.0], level=0.99)
    assert hi99 - 3 == pytest.approx(4.604094871415897 * math.sqrt(2.5 / 5), abs=1e-9)
    assert stats.t_interval([1.0]) is None
    with pytest.raises(ValueError, match="level"):
        stats.t_interval([1.0, 2.0], level=1.0)


def test_welch_two_degrees_of_freedom_closed_form():
    # n = 2 each with equal variances: nu = 2, and F_2(t) = 1/2 + t / (2 sqrt(2 + t^2))
    w = stats.welch([0.0, 2.0], [2.0, 4.0])
    assert w.diff == -2.0 and w.t == pytest.approx(-math.sqrt(2)) and w.df == pytest.approx(2)
    assert w.p == pytest.approx(1 - math.sqrt(2) / 2, abs=1e-12)


def test_welch_one_degree_of_freedom_is_cauchy():
    # one sample without variance: nu = 1, F_1(t) = 1/2 + atan(t) / pi
    w = stats.welch([0.0, 2.0], [5.0, 5.0])
    assert w.t == pytest.approx(-4.0) and w.df == pytest.approx(1.0)
    assert w.p == pytest.approx(1 - 2 * math.atan(4) / math.pi, abs=1e-12)


def test_welch_unequal_sizes_satterthwaite():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 4.0, 6.0]
    va, vb = 2.5 / 5, 4.0 / 3
    w = stats.welch(a, b)
    assert w.t == pytest.approx((3 - 4) / math.sqrt(va + vb))
    assert w.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 4 + vb ** 2 / 2))
    assert 0.4 < w.p < 0.6 and stats.mark(w.p) == "ns"


def test_welch_degenerate_and_too_small():
    assert stats.welch([1.0, 1.0], [1.0, 1.0]).p == 1.0
    assert stats.welch([1.0, 1.0], [2.0, 2.0]).p == 0.0
    assert stats.welch([1.0], [2.0, 3.0]) is None


def test_marks():
    assert [stats.mark(p) for p in (0.001, 0.03, 0.2, None)] == ["**", "*", "ns", "n/a"]


def test_first_reaching_takes_the_earliest_evaluation_at_or_below_target():
    pts = [(300, 3, 0.05, 30.0), (100, 1, 0.2, 10.0), (200, 2, 0.10, 20.0), (400, 4, 0.04, 40.0)]
    assert stats.first_reaching(pts, 0.10) == (200, 2, 20.0)  # equality counts
    assert stats.first_reaching(pts, 0.01) is None


def test_mlperf_drops_fastest_and_slowest():
    r = stats.mlperf_mean([5.0, 1.0, 3.0, 2.0, 4.0])
    assert r.value == 3.0 and r.reached == 5 and r.why == ""
    assert stats.mlperf_mean([10.0, 1.0, 2.0, 3.0, 4.0, 100.0]).value == 4.75  # 2, 3, 4, 10


def test_mlperf_one_miss_is_the_dropped_slowest_two_misses_are_not_reached():
    r = stats.mlperf_mean([1.0, 2.0, 9.0, 4.0, None])
    assert r.value == 5.0 and r.reached == 4  # mean of 2, 4, 9
    r = stats.mlperf_mean([1.0, 2.0, None, 4.0, None])
    assert r.value is None and r.why == "not reached by 2 of 5 runs"
    r = stats.mlperf_mean([1.0, 2.0, 3.0])
    assert r.value is None and r.why == "only 3 runs: MLPerf asks for 5"
