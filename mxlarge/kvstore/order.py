"""The order of a step's exchanges when a link is the bottleneck (P3: Jayarajan et al.,
SysML 2019).

Sent in backward order as backward produces them, the first layers' gradients go last,
so their sums land last and the next forward, which starts with them, waits for the
whole exchange. Here only the first ``lead`` of the pushed bytes go in backward order,
as backward produces them; the rest is held until backward ends and then sent in forward
order with priorities by layer, so the first layers' sums land first and the next
forward overlaps the remaining pulls. Each held array is gated on the gradient written
last (the first parameter's) by a one-element identity that changes no bit, so that
MXNet's engine cannot send it earlier in backward order.

The lead is the share of the pushed bytes a link can send during backward, measured on steps
in backward order (:data:`PROBE_CALLS`): t₀ when the first group's gradient is ready, t₁ when
backward ends, t₂ when the last sum has landed::

    lead = 2 · (t₁ − t₀) / (t₂ − t₀)

The 2: with the servers on the workers' hosts, during backward a host's link carries its
pushes, over the whole exchange also as many bytes of its server's replies. With server
hosts the order stays backward. Each rank takes the median of its probes, every rank the
median of those over the ranks; a lead ≥ 1 (a fast link, a small net) keeps the backward
order. Why the medians, and the launches that measured it: docs/design/sync.md, "The
order of the exchange".
"""
from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

import mxnet as mx

from mxlarge import engine
from mxlarge.errors import InputError

#: The ``allreduce_grads`` calls that measure the lead (the first ones warm the servers'
#: buffers).
PROBE_CALLS = (3, 4, 5)


def lead_share(t0: float, t1: float, t2: float) -> float:
    """``2 · (t₁ − t₀) / (t₂ − t₀)`` (module docstring); ∞ when the exchange took no time."""
    return 2.0 * (t1 - t0) / (t2 - t0) if t2 > t0 else float("inf")


def lead_groups(sizes: Sequence[int], share: float | None) -> int:
    """How many of the groups of ``sizes`` (bytes, in backward order) go in backward
    order: all with no share or a share ≥ 1, else the fewest whose bytes reach ``share``
    of the total."""
    if share is None or share >= 1.0:
        return len(sizes)
    total = sum(sizes)
    sent = 0
    for j, size in enumerate(sizes):
        if sent >= share * total:
            return j
        sent += size
    return len(sizes)


def gate(arrays: Sequence[mx.nd.NDArray], gates: Sequence[mx.nd.NDArray]) -> None:
    """Makes every write after this to ``arrays[d]`` (its exchange) wait for
    ``gates[d]``: its first element is copied onto itself by an op that also reads the
    gate."""
    for a, g in zip(arrays, gates, strict=True):
        head = engine.head(a)
        mx.nd._internal._identity_with_attr_like_rhs(head, engine.head(g), out=head)


def lead_from_env(text: str) -> float:
    """``MXLARGE_LEAD``'s share.

    Raises:
        InputError: not a number ≥ 0.
    """
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not share >= 0.0:
        raise InputError(f"MXLARGE_LEAD={text!r}: expected a share of the gradient bytes >= 0 "
                         "(e.g. 0.2; 1 or more keeps the backward order)")
    return share


class Order:
    """The lead of one store's exchanges (module docstring): measured on the calls
    :data:`PROBE_CALLS`, agreed on the next. ``MXLARGE_LEAD`` (a share ≥ 0) sets it
    instead."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        fixed = os.environ.get("MXLARGE_LEAD")
        self.share: float | None = lead_from_env(fixed) if enabled and fixed else None
        self.fixed = self.share is not None
        self.calls = 0
        self._measured: list[float] = []
        self._threads: list[threading.Thread] = []

    def probing(self) -> bool:
        """Counts a call; whether it is one of those that measure."""
        self.calls += 1
        return self.enabled and not self.fixed and self.calls in PROBE_CALLS

    def measure(self, first: mx.nd.NDArray, last: mx.nd.NDArray,
                landed: Callable[[], Sequence[mx.nd.NDArray]]) -> Callable[[], None]:
        """Probes ``first`` (the first group's gradient) and ``last`` (written when
        backward ends) now, before any exchange writes them
        (:func:`mxlarge.engine.probe`); returns what to call after the exchanges are
        issued: it probes ``landed()`` (each group's gradient, after its sum) and times
        the three in a thread."""
        marks = [engine.probe(first), engine.probe(last)]

        def after() -> None:
            ends = [engine.probe(a) for a in landed()]
            thread = threading.Thread(target=self._time, args=(marks, ends), daemon=True)
            thread.start()
            self._threads.append(thread)
        return after

    def _time(self, marks: list[mx.nd.NDArray], ends: list[mx.nd.NDArray]) -> None:
        stamps = []
        for m in marks:
            m.wait_to_read()
            stamps.append(time.perf_counter())
        for e in ends:
            e.wait_to_read()
        # marks: measure()'s two probes (first, last), so two stamps then now
        self._measured.append(lead_share(*cast(tuple[float, float], stamps), time.perf_counter()))

    def agree(self, median: Callable[[float], float]) -> None:
        """On the call after the probes: their threads joined, and ``median`` (a
        collective, over the ranks) of every rank's median probe becomes the share."""
        if not (self.enabled and not self.fixed and self.calls == PROBE_CALLS[-1] + 1):
            return
        for thread in self._threads:
            thread.join()
        mine = statistics.median(self._measured) if self._measured else float("inf")
        self.share = median(min(mine, 1e6))
