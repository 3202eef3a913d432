"""The observers a worker's Trainer makes for itself, from what its launcher gave it."""
from __future__ import annotations

import socket
from collections.abc import Callable
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

    @property
    def kv(self) -> Any: ...

    @property
    def distributed(self) -> bool: ...

    @property
    def rank(self) -> int: ...


def worker_observers(store: StoreFacts, heartbeat: Path | None, reports: Path | None,
                     timeline: TimelineWindow | None, breakdown: bool | None,
                     tracked: Any = None,
                     holders: Callable[[], Any] = lambda: None) -> list[StepObserver]:
    """A worker's own observers: the timeline's :class:`Recorder` for ``timeline``, a
    :class:`StepTimer` when ``breakdown`` (None: in a dist worker with a ``heartbeat``
    directory; ``holders``: which server sums what, :class:`StepTimer`), a
    :class:`HeartbeatObserver` writing to ``heartbeat`` in a dist worker, and on rank 0
    of a dist job whose launcher opened an MLflow run, a
    :class:`~mxlarge.tracking.script.ScriptRun` reading the Trainer ``tracked`` (None: no
    run; :mod:`mxlarge.tracking.script` says what the other ranks do).

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
        out.append(StepTimer(holders=holders))
    if beats:
        assert heartbeat is not None  # beats
        out.append(HeartbeatObserver(SESSION.beat(heartbeat, store.rank)))
    if tracked is not None and store.distributed:
        out.extend(_script_run(store.rank, tracked))
    return out


def _script_run(rank: int, trainer: Any) -> list[StepObserver]:
    """The launcher's run, if it opened one: rank 0 logs into it, the others go quiet."""
    from mxlarge.tracking import script  # MLflow is imported only when it is used

    run = script.launched_run()
    if run is None:
        return []
    if rank != 0:
        script.quiet()
        return []
    return [script.ScriptRun(run, trainer)]
