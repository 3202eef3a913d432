"""When MXNet's engine reaches an array: the one helper everything that needs to know
uses.

MXNet's engine is asynchronous: a call returns when its work is queued, not done. A
*probe* of an array is a small copy of its first row, made by an operator that reads the
array. That operator runs once every write of the array issued before it is done.
Waiting for the probe (``probe.wait_to_read()``) waits for exactly those writes, and for
no write issued later.

The operator reads the whole array, never a view of it: on a CPU, a weight is in
MKLDNN's layout after an inference forward pass, and MXNet refuses to copy a view of
such an array (``Check failed: !is_view``). ``slice_axis`` has no MKLDNN kernel, so
MXNet hands it the array in the default layout.

A :class:`Mark` notes the wall clock (``time.time()``) when its probe lands, from a
thread of its own, so the training thread never waits for it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import mxnet as mx


def head(array: mx.nd.NDArray) -> mx.nd.NDArray:
    """A view of the first element of ``array``."""
    return array.reshape((-1,))[0:1]


def probe(array: mx.nd.NDArray) -> mx.nd.NDArray:
    """A copy of the first row of ``array``: ready once every write issued so far is done."""
    return mx.nd.slice_axis(array, axis=0, begin=0, end=1)


def probe_all(arrays: Sequence[mx.nd.NDArray]) -> mx.nd.NDArray:
    """One element ready once every write issued so far to every one of ``arrays`` is
    done.

    One engine operation reads the first elements of all their probes (as float32 when
    their dtypes differ)."""
    heads = [head(probe(a)) for a in arrays]
    if len({h.dtype for h in heads}) > 1:
        heads = [h.astype("float32") for h in heads]
    if len(heads) == 1:
        return heads[0]
    return mx.nd.add_n(*heads)


def probe_after_reads(array: mx.nd.NDArray) -> mx.nd.NDArray:
    """One element ready once every *read* of ``array`` issued so far (a push) is done.

    A multiply by 1 of its first element is a write, which the engine orders after those
    reads; no bit changes."""
    first = head(array)
    first *= 1
    return first.copy()


class Mark:
    """The moment the engine reaches a probe: :attr:`t` (``time.time()``) once it has,
    None before.

    A mark is only ever noted late: its thread waits for the probe, then for the
    interpreter lock. Give it the probe with :func:`mark`, or note a moment the caller
    saw itself.
    """

    __slots__ = ("t", "probe")

    def __init__(self, t: float | None = None, probe: mx.nd.NDArray | None = None) -> None:
        self.t = t
        self.probe = probe

    def note(self, t: float) -> None:
        """Seen reached at ``t``: the earliest sighting stands."""
        if self.t is None or t < self.t:
            self.t = t

    def settle(self) -> None:
        """Waits here for the probe and notes the moment."""
        if self.probe is not None:
            self.probe.wait_to_read()
            self.note(time.time())


def _land(mark: Mark) -> None:
    mark.settle()


def mark(array: mx.nd.NDArray, threads: list[threading.Thread]) -> Mark:
    """A :class:`Mark` of the moment every write of ``array`` issued so far is done,
    noted by a new thread (appended to ``threads``, for the caller to join)."""
    return watch(probe(array), threads)


def watch(ready: mx.nd.NDArray, threads: list[threading.Thread]) -> Mark:
    """A :class:`Mark` of the probe ``ready``, noted by a new thread (appended to
    ``threads``)."""
    found = Mark(probe=ready)
    thread = threading.Thread(target=_land, args=(found,), daemon=True, name="mxlarge-mark")
    thread.start()
    threads.append(thread)
    return found
