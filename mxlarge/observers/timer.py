"""The per-rank step breakdown as a step observer: sampled steps timed part by part.

MXNet's engine is asynchronous, so a clock read around a call measures when the call was
issued, not when its work ran. Only *sampled* steps (:func:`mxlarge.breakdown.sampled`:
one in :data:`~mxlarge.breakdown.EVERY`, the same step numbers on every rank) are timed,
with an engine sync between the parts. A sampled step loses its overlap, so the cost is
about 1/EVERY of what overlap saves (``breakdown_cost`` in ``make bench``).

The parts of a sampled step (:class:`~mxlarge.breakdown.Sample`):

* ``data``: the loop's wait for the batch (0 for a script's step);
* ``compute``: forward and backward. In the loop, from the step's begin (synced) to the end of
  its backward (synced; with simulated workers after each micro-batch too, ``micro``). In a
  script's step, from the end of the previous step (synced) to the begin of this one: the
  script's forward, backward and whatever else it does between its steps;
* ``exchange``: until the summed gradients are written (the servers, and through them every
  other rank). The sums one server holds alone are waited for first, a different server each
  sampled step in turn (``server``, ``held``): no other server's sums hide how long that
  one takes (the launcher compares servers by it, :mod:`mxlarge.launcher.servers`);
* ``update``: until the update is done (synced).

A marked step (``step.marked``: a timeline records it) is never timed: it takes no
engine sync. Neither is the process's first step, whose time is the warm-up's.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mxnet as mx

from mxlarge.breakdown import RecentSamples, Sample, sampled
from mxlarge.observers import TIME, Step, StepObserver

if TYPE_CHECKING:
    from mxlarge.kvstore.fusion import Holders


class StepTimer(StepObserver):
    """Times sampled steps (module docstring); a timed step carries its
    :class:`~mxlarge.breakdown.Sample` (``step.sample``) and the medians of the recent
    ones (``step.parts``) to the observers after it.

    Args:
        sync: waits until the engine is idle (``mx.nd.waitall``).
        holders: which server sums which gradients (positions in the exchanged list), None
            without servers (:meth:`mxlarge.kvstore.sync.SyncStore.holders`).
    """

    stage = TIME

    def __init__(self, sync: Callable[[], None] = mx.nd.waitall,
                 holders: Callable[[], Holders | None] = lambda: None) -> None:
        self.sync = sync
        self.holders = holders
        self._turn = 0  # which server's sums the next sampled step waits for first
        self._server = (-1, 0.0)  # this step's: (server, seconds until its sums)
        self.window = RecentSamples()
        self.first: int | None = None  # the process's first step
        self._script_end: tuple[int, float] | None = None  # (next step, when this one ended)
        self._timing = False
        self._from = 0.0  # where the step's compute began
        self._begun = 0.0  # when the step began, after its sync
        self._ends: list[float] = []  # each micro-batch's backward end
        self._exchange_from = 0.0
        self._exchange_to = 0.0
        self._exchange_end = 0.0  # time.time() when the sums were written

    def step_begun(self, step: Step) -> None:
        if self.first is None:
            self.first = step.t
        script_end = self._script_end
        self._script_end = None
        if step.data is None:
            ready = script_end is not None and script_end[0] == step.t
        else:
            ready = True
        self._timing = (ready and sampled(step.t) and not step.marked
                        and step.t != self.first)
        if not self._timing:
            return
        self.sync()  # the previous step's work is not this step's
        self._begun = time.perf_counter()
        if step.data is None:
            self._from = script_end[1]  # type: ignore[index]  # ready, so not None
        else:
            self._from = self._begun
        self._ends = []

    def backward_done(self, step: Step, grads: Sequence[Any], micro: int | None) -> None:
        if self._timing and micro is not None:
            self.sync()
            self._ends.append(time.perf_counter())

    def exchange_begun(self, step: Step, grads: Sequence[Any]) -> None:
        if not self._timing:
            return
        if step.data is not None:
            self.sync()  # the loop's forward and backward are done
        self._exchange_from = time.perf_counter()

    def exchange_done(self, step: Step, grads: Sequence[Any]) -> None:
        if not self._timing:
            return
        self._server = self._first_server(grads)
        for g in grads:
            g.wait_to_read()
        self._exchange_to = time.perf_counter()
        self._exchange_end = time.time()

    def update_done(self, step: Step, applied: bool, weights: Sequence[Any]) -> None:
        if self._timing:
            self._timing = False
            self.sync()
            ended = time.perf_counter()
            starts = (self._begun, *self._ends)
            micro = tuple(b - a for a, b in zip(starts, self._ends))
            data = step.data.seconds if step.data is not None else 0.0
            sample = Sample(step.t, data, self._exchange_from - self._from,
                            self._exchange_to - self._exchange_from, ended - self._exchange_to,
                            self._exchange_end, micro, *self._server)
            self.window.add(sample)
            step.sample = sample
            step.parts = self.window.record()
            held = self.holders()
            if held is not None:
                step.servers = self.window.servers(held.share)
        elif step.data is None and not step.marked and sampled(step.t + 1):
            # a script's step before a sampled one: its end is where the next one's
            # compute begins
            self.sync()
            self._script_end = (step.t + 1, time.perf_counter())

    def _first_server(self, grads: Sequence[Any]) -> tuple[int, float]:
        """Waits for the sums of the next server in turn that holds some alone; returns
        it and the seconds since the exchange began ((-1, 0) without one)."""
        held = self.holders()
        if held is None:
            return -1, 0.0
        turns = [s for s, alone in enumerate(held.alone) if alone]
        if not turns:
            return -1, 0.0
        server = turns[self._turn % len(turns)]
        self._turn += 1
        for k in held.alone[server]:
            grads[k].wait_to_read()
        return server, time.perf_counter() - self._exchange_from
