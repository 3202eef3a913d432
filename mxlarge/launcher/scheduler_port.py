"""The scheduler-port claim: two jobs launched from one host at once get two ports.

dmlc's ``PSTracker`` takes the first port from 9091 up that it can bind, closes it, and
starts the scheduler, which binds it seconds later (after ``import mxnet``): a second
job's tracker meanwhile finds the same port free, and its scheduler dies with ``bind
failed``. While a job's tracker picks its port and until its scheduler listens there,
the launcher holds a lock file of this user's on this machine (:data:`PORT_LOCK`), so
the next tracker finds the port taken.

Whether the scheduler listens is read from ``/proc/net/tcp{,6}`` (:func:`listening`), so
nothing races the scheduler for the port. Importing this module does not import MXNet.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType

#: Held while a tracker picks its scheduler port and until the scheduler listens on it.
PORT_LOCK = Path(tempfile.gettempdir()) / f"mxlarge-{os.getuid()}-scheduler-port.lock"
#: Longest wait for a starting scheduler to listen (it imports MXNet first).
SCHEDULER_LISTEN_TIMEOUT = 60.0


def listening(port: int) -> bool:
    """Whether a TCP socket of this network namespace listens on ``port`` (any address),
    read from ``/proc/net/tcp{,6}`` (state 0A), so nothing races the scheduler for the
    port."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[3] == "0A" and \
                    int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


@contextlib.contextmanager
def claimed_scheduler_port(tracker: ModuleType) -> Iterator[None]:
    """Make ``tracker.PSTracker`` hold :data:`PORT_LOCK` from choosing its port until
    its scheduler listens there (or has ended, or :data:`SCHEDULER_LISTEN_TIMEOUT`
    passed)."""
    import fcntl

    original = tracker.PSTracker

    # original is a class of dmlc's untyped module: a value of type Any to mypy
    class Claimed(original):  # type: ignore[misc, valid-type]
        def __init__(self, hostIP: str, cmd: str | None, port: int = 9091,  # noqa: N803
                     port_end: int = 9999, envs: Mapping[str, str] | None = None) -> None:
            with open(PORT_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                super().__init__(hostIP, cmd, port, port_end, envs)
                if cmd is None:
                    return
                deadline = time.monotonic() + SCHEDULER_LISTEN_TIMEOUT
                while self.thread.is_alive() and not listening(self.port) and \
                        time.monotonic() < deadline:
                    time.sleep(0.05)

    # typeshed's ModuleType reads any attribute but writes none: patching dmlc's tracker
    tracker.PSTracker = Claimed  # type: ignore[attr-defined]
    try:
        yield
    finally:
        tracker.PSTracker = original  # type: ignore[attr-defined]
