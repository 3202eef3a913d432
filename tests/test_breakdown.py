"""mxlarge.breakdown: the pure parts against closed forms; a launched job's run carries the
per-rank breakdown (tests/e2e/test_breakdown.py)."""
from __future__ import annotations

import pytest

from mxlarge import breakdown as B
from mxlarge.protocol.heartbeat import SIZE, Record


def sample(at: int, data=0.001, compute=0.02, exchange=0.005, update=0.002, end=1.0e9):
    return B.Sample(at, data, compute, exchange, update, end)


def test_sampled_steps_are_the_same_numbers_on_every_rank():
    assert [t for t in range(35) if B.sampled(t)] == [0, 10, 20, 30]


def test_a_step_is_the_sum_of_its_parts_and_medians_are_in_ms():
    s = sample(0)
    assert s.step == pytest.approx(0.028)
    m = B.medians_ms([sample(0, compute=0.010), sample(10, compute=0.030),
                      sample(20, compute=0.020)])
    assert m == {"data": 1.0, "compute": 20.0, "exchange": 5.0, "update": 2.0, "step": 28.0}


def test_the_window_keeps_the_last_samples_and_fits_a_heartbeat_record():
    w = B.Window(size=3)
    for t in range(5):
        w.add(sample(10 * t, compute=0.001 * (t + 1), end=1.7e9 + t))
    rec = w.record()
    assert rec["n"] == 3.0 and rec["at"] == 40.0 and rec["end"] == 1.7e9 + 4
    assert rec["compute"] == 4.0  # median of 3, 4, 5 ms
    r = Record(127, "h" * 40, 4194304, 10 ** 9, 10 ** 9, 10 ** 9, "evaluating", 10 ** 9,
               {k: 99999.9 for k in rec})
    assert len(r.encode()) == SIZE and Record.decode(r.encode()) == r


def test_summary_names_the_slowest_rank_its_spread_and_the_wait():
    ranks = [{"data": 1, "compute": 20, "exchange": 30, "update": 2, "step": 53},
             {"data": 1, "compute": 40, "exchange": 8, "update": 2, "step": 51},
             {"data": 1, "compute": 20, "exchange": 29, "update": 2, "step": 52}]
    s = B.summary(ranks)
    assert s["slowest_rank"] == 1.0
    assert s["spread"] == pytest.approx(2.0)
    assert s["wait_share"] == pytest.approx(29 / 52)
