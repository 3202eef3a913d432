"""The exchange order of several hosts (mxlarge.kvstore.order): the lead's closed form, the
split of the groups, and the gate changing no bit.

In real jobs: tests/e2e/test_dist.py (bitwise the same weights with 30% and none of the bytes
in backward order) and tests/e2e/test_own_script.py (measured once, the same on every rank).
"""
import mxnet as mx
import numpy as np
import pytest

from mxlarge.errors import InputError
from mxlarge.kvstore.order import PROBE_CALLS, Order, gate, lead_groups, lead_share


def test_lead_is_twice_the_share_of_the_exchange_that_overlaps_backward():
    # backward 94 ms of a 1168 ms exchange
    assert lead_share(10.0, 10.094, 11.168) == pytest.approx(2 * 0.094 / 1.168)
    assert lead_share(0.0, 1.0, 4.0) == 0.5
    assert lead_share(5.0, 5.0, 5.0) == float("inf")  # no exchange time: backward order


def test_groups_in_backward_order_are_the_fewest_that_reach_the_lead():
    sizes = [10, 20, 30, 40]
    assert lead_groups(sizes, None) == 4
    assert lead_groups(sizes, 1.0) == lead_groups(sizes, 7.0) == 4
    assert lead_groups(sizes, 0.0) == 0
    assert lead_groups(sizes, 0.1) == 1  # 10 of 100 bytes reach 10%
    assert lead_groups(sizes, 0.11) == 2
    assert lead_groups(sizes, 0.6) == 3
    assert lead_groups(sizes, 0.61) == 4


def test_the_gate_changes_no_bit_of_the_gated_array():
    bits = np.array([0x7FC00001, 0x80000000, 0x00000001, 0x3F800000], np.uint32)
    a = mx.nd.array(bits.view(np.float32).reshape(2, 2), dtype="float32")
    g = mx.nd.ones((3,))
    gate([a], [g])
    assert (a.asnumpy().view(np.uint32).ravel() == bits).all()


def test_the_probes_are_three_calls_and_the_lead_fixed_by_the_environment(monkeypatch):
    monkeypatch.delenv("MXLARGE_LEAD", raising=False)
    order = Order(True)
    n = PROBE_CALLS[-1] + 2
    assert [order.probing() for _ in range(n)] == [c in (3, 4, 5) for c in range(1, n + 1)]
    assert not any(Order(False).probing() for _ in range(n))
    monkeypatch.setenv("MXLARGE_LEAD", "0.3")
    fixed = Order(True)
    assert fixed.share == 0.3 and not any(fixed.probing() for _ in range(n))
    assert Order(False).share is None  # one host: backward order whatever it says
    for bad in ("abc", "-0.1", "nan"):
        monkeypatch.setenv("MXLARGE_LEAD", bad)
        with pytest.raises(InputError, match=f"MXLARGE_LEAD='{bad}': expected a share"):
            Order(True)


def test_the_probes_time_real_engine_work_and_agree_on_their_median(monkeypatch):
    monkeypatch.delenv("MXLARGE_LEAD", raising=False)
    order = Order(True)
    x = mx.nd.random.uniform(shape=(256, 256))
    seen: list[float] = []
    for call in range(1, PROBE_CALLS[-1] + 2):
        if order.probing():
            first = mx.nd.dot(x, x)
            last = mx.nd.dot(first, x)
            order.measure(first, last, lambda last=last: [mx.nd.dot(last, x)])()
        order.agree(lambda v: seen.append(v) or v / 2)
        assert (order.share is None) == (call <= PROBE_CALLS[-1])
    assert len(order._measured) == 3 and all(0.0 <= v <= 2.0 for v in order._measured)
    assert seen == [sorted(order._measured)[1]]
    assert order.share == seen[0] / 2
