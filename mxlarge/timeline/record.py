"""A worker's recorder of the timeline's steps (:class:`Recorder`).

MXNet's engine is asynchronous: a call returns when its work is queued, not done. So a recorded
moment is a *mark*: a one-element copy of an array, an engine operation that runs once every
earlier write of the array is done, and a thread waiting for that copy notes the wall clock
(``time.time()``) when it lands. A mark is only ever noted late: its copy (and the wait's own
engine operation) may wait for an operation of the same priority that the worker's engine
thread had ready at the same moment (a CPU worker has one such thread), and its thread for the
interpreter lock (the switch interval is :data:`SWITCH` while a window is recorded). Where the
engine orders two marks (a push before its pull, the pulls before the update, an update before
the next forward's end), the earlier one is taken as at most the later one
(:meth:`Recorder.order`). Two waits in the training thread, where a mark would race the next
operation of equal priority, ready at the very same moment: the forward's end before the
backward is issued (:func:`marked_backward`), the previous update's end before the forward is
(:meth:`Recorder.settle`); the rest overlaps as in any step.

In a recorded step a bucket's exchange goes as a push and a pull (one ``pushpull`` otherwise:
its halves are one request that the worker cannot tell apart) with three marks on the array
sent: ``ready`` before the push (its gradients are written: the push may start), ``pushed``
after a one-element multiply by 1 of that array (a write, so the engine runs it once every
earlier read, the push, is done: the servers acknowledged it; on dist_sync they do once every
worker's push of the key is summed, so the push holds the wait for the other ranks; no bit
changes), ``summed`` after the pull (the sum written back). With several devices per worker
the push reads MXNet's merge buffer instead, so ``pushed`` is when the merge was copied; the
pull's end is exact either way.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import mxnet as mx

from mxlarge.timeline import PREFIX, Window

#: The interpreter's switch interval (s) while a window is recorded: a mark's thread needs the
#: interpreter lock to read the clock, and waits up to this long for a busy training thread.
SWITCH = 2e-4
#: Seconds :meth:`Recorder.finish` waits for a mark's thread after the engine is idle.
JOIN_TIMEOUT = 30.0


class Mark:
    """A moment the engine reaches: ``t`` (``time.time()``) once it has, None before;
    ``probe`` the one-element array that exists from then on."""

    __slots__ = ("t", "probe")

    def __init__(self, t: float | None = None, probe: mx.nd.NDArray | None = None) -> None:
        self.t = t
        self.probe = probe

    def note(self, t: float) -> None:
        """Seen reached at ``t`` (by a waiting thread or the training thread): the earliest
        sighting stands."""
        self.t = t if self.t is None else min(self.t, t)


Moment = Mark | float


def _land(probe: mx.nd.NDArray, mark: Mark) -> None:
    probe.wait_to_read()
    mark.note(time.time())


def _at(moments: Sequence[Moment | None]) -> float | None:
    """The latest of ``moments`` (None ones and unlanded marks left out)."""
    times = [m.t if isinstance(m, Mark) else m for m in moments if m is not None]
    return max((t for t in times if t is not None), default=None)


class Recorder:
    """Records the steps of ``window`` on this worker (kvstore rank ``rank`` on ``host``) and
    writes them to ``directory/timeline-worker-<rank>.json`` after the last, once every rank
    is there (``barrier``: the clocks' common moment, :mod:`mxlarge.timeline.trace`).

    The loop and the Trainer call :meth:`begin` at a step; while :attr:`step` is not None the
    store exchanges that step's buckets as push and pull with marks (:meth:`exchange`).
    """

    def __init__(self, window: Window, directory: Path, rank: int, host: str,
                 barrier: Callable[[], None] | None) -> None:
        self.window = window
        self.directory = Path(directory)
        self.rank = rank
        self.host = host
        self.barrier = barrier
        self.step: int | None = None
        self.done = False
        self.previous_update: Mark | None = None  # the last recorded update's end
        self.pulls: list[Mark] = []  # the current step's summed marks
        self.compute_marked = False  # the loop marked this step's forward and backward
        self.returned: float | None = None  # when the last Trainer.step() call returned
        self._spans: list[tuple[str, str, int, list[Moment | None], list[Moment | None],
                                dict[str, Any]]] = []
        self._threads: list[threading.Thread] = []
        self._order: list[tuple[Mark, Mark]] = []  # (a, b): the engine reaches a before b
        self._switch = sys.getswitchinterval()

    def begin(self, step: int) -> bool:
        """Whether ``step`` is recorded; the first call for a step starts it."""
        if self.done or not self.window.covers(step):
            self.step = None
            return False
        if self.step != step:
            if self.step is None and step == self.window.start:
                self._switch = sys.getswitchinterval()
                sys.setswitchinterval(SWITCH)
            self.step, self.pulls, self.compute_marked = step, [], False
        return True

    def mark(self, array: mx.nd.NDArray) -> Mark:
        """The moment every write of ``array`` issued so far is done."""
        probe = array.reshape((-1,))[0:1].copy()
        mark = Mark(probe=probe)
        thread = threading.Thread(target=_land, args=(probe, mark), daemon=True,
                                  name="mxlarge-timeline")
        thread.start()
        self._threads.append(thread)
        return mark

    def mark_all(self, arrays: Sequence[mx.nd.NDArray]) -> Mark:
        """The moment every write of every one of ``arrays`` issued so far is done (one
        engine operation reading their first elements, as float32 when their dtypes differ)."""
        heads = [a.reshape((-1,))[0:1] for a in arrays]
        if len({h.dtype for h in heads}) > 1:
            heads = [h.astype("float32") for h in heads]
        return self.mark(mx.nd.add_n(*heads) if len(heads) > 1 else heads[0])

    def settle(self, mark: Mark | None) -> None:
        """Waits here for ``mark`` (an update's end, before the next forward is issued: the
        forward's first operation would be ready at the very moment the mark's thread's wait
        is) and notes it."""
        if mark is not None and mark.probe is not None:
            mark.probe.wait_to_read()
            mark.note(time.time())

    def order(self, a: Mark | None, b: Mark) -> None:
        """The engine reaches ``a`` before ``b`` (``b`` depends on it): a mark's thread may note
        ``a`` later than ``b``'s notes ``b``, and only ever late, so :meth:`finish` takes
        t_a = min(t_a, t_b)."""
        if a is not None:
            self._order.append((a, b))

    def after_reads(self, array: mx.nd.NDArray) -> Mark:
        """The moment every read of ``array`` issued so far (a push) is done: a multiply by 1
        of its first element, a write the engine orders after them, then its mark."""
        head = array.reshape((-1,))[0:1]
        head *= 1
        return self.mark(head)

    def span(self, name: str, track: str, start: Sequence[Moment | None],
             end: Sequence[Moment | None], **args: Any) -> None:
        """A span of the current step on ``track``, from the latest of ``start`` to the latest
        of ``end`` (resolved once every mark has landed)."""
        if self.step is None:
            return
        self._spans.append((name, track, self.step, list(start), list(end), args))

    def script_step(self, t: int, grads: Callable[[], Sequence[mx.nd.NDArray]],
                    run: Callable[[bool], bool]) -> bool:
        """A script's own ``Trainer.step`` t: ``run(recorded)``, and in a recorded step first
        the script's forward+backward as one span, from the previous step's update (or the
        previous call's return) to every one of ``grads()`` written."""
        recorded = self.begin(t)
        if recorded and not self.compute_marked:
            self.span("forward+backward", "compute", [self.previous_update, self.returned],
                      [self.mark_all(grads())])
        applied = run(recorded)
        self.returned = time.time()
        return applied

    def data(self, began: float, wait: float) -> float:
        """The loop's step: its wait for the batch from ``began`` for ``wait`` s; settles the
        previous update's end; returns the forward's issue (now)."""
        self.compute_marked = True
        self.span("data", "data", [began], [began + wait])
        self.settle(self.previous_update)
        return time.time()

    def compute(self, issued: Moment, forward: Mark, grads: Sequence[mx.nd.NDArray],
                **args: int) -> Mark:
        """A forward's span (from its issue, or the previous update's end, to ``forward``: its
        loss written, marked before the backward was issued) and its backward's (to every one
        of ``grads`` written); returns the backward's end."""
        backward = self.mark_all(grads)
        self.order(forward, backward)
        self.order(self.previous_update, forward)  # the forward reads the updated weights
        self.span("forward", "compute", [issued, self.previous_update], [forward], **args)
        self.span("backward", "compute", [forward], [backward], **args)
        return backward

    def exchange(self, key: int, nbytes: int, sent: Sequence[mx.nd.NDArray],
                 push: Callable[[], None], pull: Callable[[], None]) -> None:
        """One bucket's push and pull (module docstring), with their spans on the bucket's
        track."""
        ready = self.mark(sent[0])
        push()
        pushed = self.after_reads(sent[0])
        pull()
        summed = self.mark(sent[0])
        self.pulls.append(summed)
        self.order(ready, pushed)
        self.order(pushed, summed)
        track = f"bucket {key}"
        self.span("push", track, [ready], [pushed], key=key, bytes=nbytes)
        self.span("pull", track, [pushed], [summed], key=key, bytes=nbytes)

    def update(self, issued: float, end: Mark, applied: bool) -> bool:
        """The current step's update: from its issue (after the pulls) to ``end``; after the
        window's last step, :meth:`finish`. Returns ``applied``."""
        self.span("update" if applied else "update (skipped: overflow)", "update",
                  [issued, *self.pulls], [end])
        for summed in self.pulls:
            self.order(summed, end)
        self.previous_update = end
        if self.step == self.window.last:
            self.finish()
        return applied

    def finish(self) -> None:
        """Waits for every mark, meets the other ranks (``barrier``), notes the clock right
        after (every rank leaves the barrier at once, within its release's skew) and writes
        this rank's file (atomically: a temporary file renamed)."""
        self.step, self.done = None, True
        mx.nd.waitall()
        for thread in self._threads:
            thread.join(JOIN_TIMEOUT)
        sys.setswitchinterval(self._switch)
        for _ in range(len(self._order)):  # until every (a, b) has t_a <= t_b
            changed = False
            for a, b in self._order:
                if a.t is not None and b.t is not None and a.t > b.t:
                    a.t, changed = b.t, True
            if not changed:
                break
        if self.barrier is not None:
            self.barrier()
        ref = time.time()
        spans = []
        for name, track, step, start, end, args in self._spans:
            t0, t1 = _at(start), _at(end)
            if t0 is not None and t1 is not None:
                spans.append([name, track, step, t0, max(t0, t1), args])
        record = {"rank": self.rank, "host": self.host, "pid": os.getpid(), "ref": ref,
                  "start": self.window.start, "steps": self.window.steps, "spans": spans}
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{PREFIX}{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)


def marked_backward(rec: Recorder | None, issued: Moment, loss: mx.nd.NDArray,
                    backward: Callable[[], None], grads: Callable[[], Sequence[mx.nd.NDArray]],
                    **args: int) -> Moment:
    """``backward()``; in a step ``rec`` records, first waits for ``loss`` (the forward's end:
    a mark would be ambiguous, the backward's first operation being ready at the same moment
    on the same engine thread), then the spans of :meth:`Recorder.compute`, whose backward's
    end it returns (else ``issued``)."""
    if rec is None:
        backward()
        return issued
    loss.wait_to_read()
    forward = Mark(time.time())
    backward()
    return rec.compute(issued, forward, grads(), **args)


class Gathers(Protocol):
    """What :func:`recorder` reads of the store
    (:class:`mxlarge.kvstore.collectives.Collectives`)."""

    kv: Any
    distributed: bool
    rank: int


def recorder(window: Window | None, directory: Path | None,
             collectives: Gathers) -> Recorder | None:
    """The recorder of ``window`` for a worker whose launcher gave it ``directory`` (its job's,
    where the heartbeats go); None without a window; refused outside a launched dist job."""
    if window is None:
        return None
    if directory is None or not collectives.distributed:
        raise ValueError(f"timeline_start {window.start}: a timeline is recorded on the "
                         "workers of a launched dist job (mxlarge launch, python -m "
                         "mxlarge.launcher), whose launcher merges their files")
    return Recorder(window, directory, collectives.rank, socket.gethostname(),
                    collectives.kv._barrier)
