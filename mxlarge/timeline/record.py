"""A worker's recorder of the timeline's steps: :class:`Recorder`, a step observer.

MXNet's engine is asynchronous: a call returns when its work is queued, not done. So a
recorded moment is a *mark* (:mod:`mxlarge.engine`): a one-element copy of an array,
which runs once every earlier write of the array is done, and a thread that notes the
wall clock when it lands. A mark is only ever noted late. Its copy may wait for an
operation of the same priority that the worker's engine thread had ready at the same
moment (a CPU worker has one such thread). Its thread may wait for the interpreter lock
(the switch interval is :data:`SWITCH` while a window is recorded). Where the engine
orders two marks (a push before its pull, the pulls before the update, an update before
the next forward's end), the earlier one is taken as at most the later one
(:meth:`Recorder.order`).

Two waits happen in the training thread, where a mark would race the next operation of
equal priority, ready at the very same moment:

* the forward's end, before the backward is issued (``forward_done``);
* the previous update's end, before the loop's forward is issued (``step_begun``).

The rest overlaps as in any step.

A recorded step is *marked* (``step.marked``), so each bucket goes as a push and a pull,
with three marks on the array sent:

* ``ready`` before the push: its gradients are written, the push may start;
* ``pushed`` after the push: a one-element multiply by 1 of the array, a write, which the
  engine runs once every earlier read (the push) is done. That is when the servers acknowledged
  it. On dist_sync they do once every worker's push of the key is summed, so the push holds the
  wait for the other ranks. No bit changes;
* ``summed`` after the pull: the sum is written back.

With several devices per worker the push reads MXNet's merge buffer instead, so
``pushed`` is when the merge was copied; the pull's end is exact either way.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mxnet as mx

from mxlarge import engine
from mxlarge.engine import Mark
from mxlarge.observers import MARK, Step, StepObserver
from mxlarge.timeline import PREFIX, TimelineWindow

#: The interpreter's switch interval (s) while a window is recorded: a mark's thread
#: needs the interpreter lock to read the clock, and waits up to this long for a busy
#: training thread.
SWITCH = 2e-4
#: Seconds :meth:`Recorder.finish` waits for a mark's thread after the engine is idle.
JOIN_TIMEOUT = 30.0

Moment = Mark | float


def _at(moments: Sequence[Moment | None]) -> float | None:
    """The latest of ``moments`` (None ones and unlanded marks left out)."""
    times = []
    for m in moments:
        t = m.t if isinstance(m, Mark) else m
        if t is not None:
            times.append(t)
    return max(times, default=None)


class Recorder(StepObserver):
    """Records the steps of ``window`` on this worker (kvstore rank ``rank`` on
    ``host``). After the last one it writes them to
    ``directory/timeline-worker-<rank>.json``, once every rank is there (``barrier``:
    the clocks' common moment, :mod:`mxlarge.timeline.trace`)."""

    stage = MARK

    def __init__(self, window: TimelineWindow, directory: Path, rank: int, host: str,
                 barrier: Callable[[], None] | None) -> None:
        self.window = window
        self.directory = Path(directory)
        self.rank = rank
        self.host = host
        self.barrier = barrier
        self.step: int | None = None  # the step being recorded
        self.done = False
        self.previous_update: Mark | None = None  # the last recorded update's end
        self.returned: float | None = None  # when the last update was issued
        self._loop = False  # the loop drives the step: it reports its forward and backward
        self._issued: Moment = 0.0  # where the next forward began
        self._forward: Mark | None = None
        self._update_issued = 0.0
        self._ready: dict[int, Mark] = {}  # a bucket's marks, by key, until its pull
        self._pushed: dict[int, Mark] = {}
        self._bytes: dict[int, int] = {}
        self._pulls: list[Mark] = []  # the current step's summed marks
        self._spans: list[tuple[str, str, int, list[Moment | None], list[Moment | None],
                                dict[str, Any]]] = []
        self._threads: list[threading.Thread] = []
        self._order: list[tuple[Mark, Mark]] = []  # (a, b): the engine reaches a before b
        self._switch = sys.getswitchinterval()

    def _mine(self, step: Step) -> bool:
        return self.step is not None and self.step == step.t

    # -- the step's events -------------------------------------------------------------
    def step_begun(self, step: Step) -> None:
        if self.done or not self.window.covers(step.t):
            self.step = None
            return
        if self.step is None and step.t == self.window.start:
            self._switch = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH)
        self.step = step.t
        self._pulls = []
        self._loop = step.data is not None
        step.marked = True
        if step.data is not None:
            began = step.data.began
            self.span("data", "data", [began], [began + step.data.seconds])
            if self.previous_update is not None:
                self.previous_update.settle()
            self._issued = time.time()

    def forward_done(self, step: Step, loss: Any, micro: int | None) -> None:
        if not self._mine(step):
            return
        loss.wait_to_read()
        self._forward = Mark(time.time())

    def backward_done(self, step: Step, grads: Sequence[Any], micro: int | None) -> None:
        if not self._mine(step):
            return
        args = {} if micro is None else {"micro": micro}
        forward = self._forward
        backward = self.mark_all(grads)
        self.order(forward, backward)
        self.order(self.previous_update, forward)  # the forward reads the updated weights
        self.span("forward", "compute", [self._issued, self.previous_update], [forward],
                  **args)
        self.span("backward", "compute", [forward], [backward], **args)
        self._issued = backward

    def exchange_begun(self, step: Step, grads: Sequence[Any]) -> None:
        if self._mine(step) and not self._loop:
            # a script's step: its forward and backward as one span, from the previous
            # step's update (or the previous step's end) to every gradient written
            self.span("forward+backward", "compute", [self.previous_update, self.returned],
                      [self.mark_all(grads)])

    def bucket_push(self, step: Step, key: int, nbytes: int, sent: Sequence[Any]) -> None:
        if self._mine(step):
            self._ready[key] = self.mark(sent[0])
            self._bytes[key] = nbytes

    def bucket_pushed(self, step: Step, key: int, sent: Sequence[Any]) -> None:
        if self._mine(step):
            self._pushed[key] = engine.watch(engine.probe_after_reads(sent[0]), self._threads)

    def bucket_pulled(self, step: Step, key: int, sent: Sequence[Any]) -> None:
        if not self._mine(step):
            return
        ready = self._ready.pop(key)
        pushed = self._pushed.pop(key)
        summed = self.mark(sent[0])
        self._pulls.append(summed)
        self.order(ready, pushed)
        self.order(pushed, summed)
        track = f"bucket {key}"
        nbytes = self._bytes.pop(key)
        self.span("push", track, [ready], [pushed], key=key, bytes=nbytes)
        self.span("pull", track, [pushed], [summed], key=key, bytes=nbytes)

    def update_begun(self, step: Step) -> None:
        if self._mine(step):
            self._update_issued = time.time()

    def update_done(self, step: Step, applied: bool, weights: Sequence[Any]) -> None:
        if not self._mine(step):
            self.returned = time.time()  # where a script's next forward may begin
            return
        if applied:
            end = self.mark_all(weights)
            name = "update"
        else:
            end = Mark(time.time())
            name = "update (skipped: overflow)"
        self.span(name, "update", [self._update_issued, *self._pulls], [end])
        for summed in self._pulls:
            self.order(summed, end)
        self.previous_update = end
        self.returned = time.time()
        if self.step == self.window.last:
            self.finish()

    # -- marks and spans ---------------------------------------------------------------
    def mark(self, array: mx.nd.NDArray) -> Mark:
        """The moment every write of ``array`` issued so far is done."""
        return engine.mark(array, self._threads)

    def mark_all(self, arrays: Sequence[mx.nd.NDArray]) -> Mark:
        """The moment every write of every one of ``arrays`` issued so far is done."""
        return engine.watch(engine.probe_all(arrays), self._threads)

    def order(self, a: Mark | None, b: Mark | None) -> None:
        """The engine reaches ``a`` before ``b`` (``b`` depends on it). A mark's thread
        may note ``a`` later than ``b``'s notes ``b``, and only ever late, so
        :meth:`finish` takes t_a = min(t_a, t_b)."""
        if a is not None and b is not None:
            self._order.append((a, b))

    def span(self, name: str, track: str, start: Sequence[Moment | None],
             end: Sequence[Moment | None], **args: Any) -> None:
        """A span of the current step on ``track``, from the latest of ``start`` to the
        latest of ``end`` (resolved once every mark has landed)."""
        if self.step is None:
            return
        self._spans.append((name, track, self.step, list(start), list(end), args))

    def finish(self) -> None:
        """Waits for every mark, meets the other ranks (``barrier``), notes the clock
        right after (every rank leaves the barrier at once, within its release's skew)
        and writes this rank's file (atomically: a temporary file renamed)."""
        self.step = None
        self.done = True
        mx.nd.waitall()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        sys.setswitchinterval(self._switch)
        self._apply_order()
        if self.barrier is not None:
            self.barrier()
        ref = time.time()
        spans = []
        for name, track, step, start, end, args in self._spans:
            t0 = _at(start)
            t1 = _at(end)
            if t0 is not None and t1 is not None:
                spans.append([name, track, step, t0, max(t0, t1), args])
        record = {"rank": self.rank, "host": self.host, "pid": os.getpid(), "ref": ref,
                  "start": self.window.start, "steps": self.window.steps, "spans": spans}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{PREFIX}{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)

    def _apply_order(self) -> None:
        """Until every ordered pair (a, b) has t_a <= t_b."""
        for _ in range(len(self._order)):
            changed = False
            for a, b in self._order:
                if a.t is not None and b.t is not None and a.t > b.t:
                    a.t = b.t
                    changed = True
            if not changed:
                return

