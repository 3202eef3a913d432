"""The order of a step's exchanges when a link is the bottleneck (P3: Jayarajan et al., SysML 2019).

Sent in backward order as backward produces them, the first layers' gradients go last, so
their sums land last and the next forward, which starts with them, waits for the whole
exchange. Here only the first ``lead`` of the pushed bytes go in backward order, as backward
produces them; the rest is held until backward ends and then sent in forward order with
priorities by layer, so the first layers' sums land first and the next forward overlaps the
remaining pulls. Each held array is gated on the gradient written last (the first
parameter's) by a one-element identity that changes no bit, so that MXNet's engine cannot
send it earlier in backward order.

The lead is the share of the pushed bytes a link can send during backward, measured on one
step in backward order (:data:`PROBE_CALL`): t₀ when the first group's gradient is ready, t₁
when backward ends, t₂ when the last sum has landed::

    lead = φ · (t₁ − t₀) / (t₂ − t₀)

φ = 2 with the servers on the workers' hosts: during backward a host's link carries its
pushes, over the whole exchange also as many bytes of its server's replies; φ = 1 with server
hosts (pushes and replies on the link's two directions). Every rank uses the mean of the
ranks' leads (one collective on the call after the probe). A lead ≥ 1 (a fast link, a small
net) keeps the backward order. Trial at 1 Gbit/s, ResNet-50, 3 co-located hosts
(docs/performance.md): a lead of 16 MB of 102 MB took 3.5% off the step, 8 MB and 32 MB
less; the formula gives 0.16 there.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

import mxnet as mx

#: The ``allreduce_grads`` call that measures the lead (the first ones warm the servers' buffers).
PROBE_CALL = 3


def lead_share(t0: float, t1: float, t2: float, phi: float) -> float:
    """``φ · (t₁ − t₀) / (t₂ − t₀)`` (module docstring); ∞ when the exchange took no time."""
    return phi * (t1 - t0) / (t2 - t0) if t2 > t0 else float("inf")


def lead_groups(sizes: Sequence[int], share: float | None) -> int:
    """How many of the groups of ``sizes`` (bytes, in backward order) go in backward order: all
    with no share or a share ≥ 1, else the fewest whose bytes reach ``share`` of the total."""
    if share is None or share >= 1.0:
        return len(sizes)
    total, sent = sum(sizes), 0
    for j, size in enumerate(sizes):
        if sent >= share * total:
            return j
        sent += size
    return len(sizes)


def gate(arrays: Sequence[mx.nd.NDArray], gates: Sequence[mx.nd.NDArray]) -> None:
    """Makes every write after this to ``arrays[d]`` (its exchange) wait for ``gates[d]``: its
    first element is copied onto itself by an op that also reads the gate."""
    for a, g in zip(arrays, gates, strict=True):
        head = a.reshape((-1,))[0:1]
        mx.nd._internal._identity_with_attr_like_rhs(head, g.reshape((-1,))[0:1], out=head)


class Order:
    """The lead of one store's exchanges (module docstring): measured on call
    :data:`PROBE_CALL`, agreed on the next. ``MXLARGE_LEAD`` (a share ≥ 0) sets it instead."""

    def __init__(self, enabled: bool, phi: float):
        self.enabled = enabled
        self.phi = phi
        fixed = os.environ.get("MXLARGE_LEAD")
        self.share: float | None = float(fixed) if enabled and fixed else None
        self.fixed = self.share is not None
        self.calls = 0
        self._measured: list[float] = []
        self._thread: threading.Thread | None = None

    def probing(self) -> bool:
        """Counts a call; whether it is the one that measures."""
        self.calls += 1
        return self.enabled and not self.fixed and self.calls == PROBE_CALL

    def measure(self, first: mx.nd.NDArray, last: mx.nd.NDArray,
                landed: Callable[[], Sequence[mx.nd.NDArray]]) -> Callable[[], None]:
        """Copies the heads of ``first`` (the first group's gradient) and ``last`` (written when
        backward ends) now, before any exchange writes them; returns what to call after the
        exchanges are issued: it copies the heads of ``landed()`` (each group's gradient, after
        its sum) and times the three in a thread."""
        marks = [first.reshape((-1,))[0:1].copy(), last.reshape((-1,))[0:1].copy()]

        def after() -> None:
            ends = [a.reshape((-1,))[0:1].copy() for a in landed()]
            self._thread = threading.Thread(target=self._time, args=(marks, ends), daemon=True)
            self._thread.start()
        return after

    def _time(self, marks: list[mx.nd.NDArray], ends: list[mx.nd.NDArray]) -> None:
        stamps = []
        for m in marks:
            m.wait_to_read()
            stamps.append(time.perf_counter())
        for e in ends:
            e.wait_to_read()
        self._measured = [lead_share(*stamps, time.perf_counter(), self.phi)]

    def agree(self, mean: Callable[[float], float]) -> None:
        """On the call after the probe: the probe's thread joined, and every rank's share
        replaced by ``mean`` of them (a collective)."""
        if not (self.enabled and not self.fixed and self.calls == PROBE_CALL + 1):
            return
        if self._thread is not None:
            self._thread.join()
        mine = self._measured[0] if self._measured else float("inf")
        self.share = mean(min(mine, 1e6))
