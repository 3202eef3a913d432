"""The observers a worker's Trainer makes for itself, from what its launcher gave it."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Protocol

from mxlarge.observers import StepObserver
from mxlarge.observers.heartbeat import HeartbeatObserver
from mxlarge.observers.timer import StepTimer
from mxlarge.protocol.session import SESSION
from mxlarge.timeline import TimelineWindow
from mxlarge.timeline.record import Recorder


class StoreFacts(Protocol):
    """What the observers need of the store
    (:class:`mxlarge.kvstore.collectives.Collectives`)."""

    kv: Any
    distributed: bool
    rank: int


def worker_observers(store: StoreFacts, heartbeat: Path | None, reports: Path | None,
                     timeline: TimelineWindow | None,
                     breakdown: bool | None) -> list[StepObserver]:
    """A worker's own observers: the timeline's :class:`Recorder` for ``timeline``, a
    :class:`StepTimer` when ``breakdown`` (None: in a dist worker with a ``heartbeat``
    directory), and a :class:`HeartbeatObserver` writing to ``heartbeat`` in a dist
    worker.

    Raises:
        ValueError: a timeline outside a launched dist job (no ``reports`` directory).
    """
    out: list[StepObserver] = []
    if timeline is not None:
        if reports is None or not store.distributed:
            raise ValueError(f"timeline_start {timeline.start}: a timeline is recorded on the "
                             "workers of a launched dist job (mxlarge launch, python -m "
                             "mxlarge.launcher), whose launcher merges their files")
        out.append(Recorder(timeline, reports, store.rank, socket.gethostname(),
                            store.kv._barrier))
    beats = heartbeat is not None and store.distributed
    if breakdown or (breakdown is None and beats):
        out.append(StepTimer())
    if beats:
        out.append(HeartbeatObserver(SESSION.beat(heartbeat, store.rank)))
    return out
