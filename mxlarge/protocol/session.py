"""The worker session: one per process, the owner of its life as a dist_sync worker.

It owns the three things that decide how a worker ends: **fail fast** (an uncaught error, or
``sys.exit(n)`` with n ≠ 0, leaves at once with ``os._exit``: a normal exit would wait in
ps-lite's exit barrier for peers that wait in push/pull for this worker), **the heartbeat** (the
progress records of :mod:`mxlarge.protocol.heartbeat`; a failing worker settles its record
first, so it names the step it failed at), and **leaving together** (at a clean exit the
store's queued operations run and every worker passes a barrier before MXNet's shutdown, which
would skip them; then the records say finished). Why each is needed: docs/design/session.md.

:data:`SESSION` is this process's; the Trainer and the store tell it what they start
(:meth:`WorkerSession.beat`, :meth:`WorkerSession.leave_together`), nothing else holds
them. Importing this module does not import MXNet.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from mxlarge.protocol.heartbeat import INTERVAL, SETTLE, HeartbeatWriter


def _code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message") prints it and exits with 1
    return 1


class WorkerSession:
    """Fail-fast, heartbeats and leaving together for one process (module docstring)."""

    def __init__(self) -> None:
        self._beats: weakref.WeakSet[HeartbeatWriter] = weakref.WeakSet()  # their threads hold them
        self._stores: list[weakref.ref[Any]] = []  # the dist store (one: kvstore.sync.create)
        self._wait_all: Callable[[], None] | None = None

    # -- fail fast ---------------------------------------------------------------------
    def exit_now(self, code: int) -> NoReturn:
        """Settle the heartbeats (at most :data:`~mxlarge.protocol.heartbeat.SETTLE` s),
        flush stdio and logging, then ``os._exit(code)``: no atexit, no kvstore exit
        barrier."""
        with contextlib.suppress(Exception):
            self.settle()
        with contextlib.suppress(Exception):
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    @contextlib.contextmanager
    def fail_fast(self) -> Iterator[None]:
        """Any exception, or ``sys.exit(n)`` with n ≠ 0, inside the block exits at once:
        the traceback on stderr, status 1 (130 for KeyboardInterrupt, n for
        ``sys.exit(n)``); ``sys.exit(0)`` and normal completion are left alone."""
        try:
            yield
        except SystemExit as e:
            code = _code_of(e)
            if code == 0:
                raise
            self.exit_now(code)
        except KeyboardInterrupt:
            traceback.print_exc()
            self.exit_now(130)
        except BaseException:  # noqa: BLE001 - any uncaught error must end the process
            traceback.print_exc()
            self.exit_now(1)

    def install_fail_fast(self) -> None:
        """Uncaught exceptions in the main thread exit at once (a ``sys.excepthook``),
        for code that cannot be wrapped in :meth:`fail_fast`; ``sys.exit(n)`` never
        reaches the hook. Idempotent."""
        if getattr(sys.excepthook, "_mxlarge_fail_fast", False):
            return
        previous = sys.excepthook

        def hook(exc_type: type[BaseException], exc: BaseException,
                 tb: TracebackType | None) -> None:
            with contextlib.suppress(Exception):
                previous(exc_type, exc, tb)
            self.exit_now(130 if issubclass(exc_type, KeyboardInterrupt) else 1)

        # a marker on the function (idempotence above); functions take attributes at runtime
        hook._mxlarge_fail_fast = True  # type: ignore[attr-defined]
        sys.excepthook = hook

    # -- heartbeats --------------------------------------------------------------------
    def beat(self, directory: str | Path, rank: int,
             interval: float = INTERVAL) -> HeartbeatWriter:
        """A new :class:`~mxlarge.protocol.heartbeat.HeartbeatWriter` for kvstore rank
        ``rank``, settled on a failure and finished at a clean exit by this session."""
        beat = HeartbeatWriter(directory, rank, interval)
        self._beats.add(beat)
        return beat

    def settle(self, timeout: float = SETTLE) -> None:
        """Every heartbeat's watcher confirms the updates handed to it, within
        ``timeout`` s in all (a stuck job: it gives up)."""
        deadline = time.monotonic() + timeout
        for beat in list(self._beats):
            beat.settle(max(0.0, deadline - time.monotonic()))

    def finish(self) -> None:
        """Every heartbeat says finished (after the last barrier: the work is done)."""
        for beat in list(self._beats):
            beat.finish()

    # -- leaving together --------------------------------------------------------------
    def leave_together(self, kv: Any, wait_all: Callable[[], None]) -> None:
        """At a clean exit, before MXNet's own shutdown: ``wait_all()`` (this worker's
        pushes sent, its pulls answered), a barrier of every worker on ``kv``, then
        :meth:`finish`. Also installs fail-fast (an error must not reach that barrier).
        Idempotent per store."""
        self.install_fail_fast()
        if any(ref() is kv for ref in self._stores):
            return
        if not self._stores:
            # atexit runs the last registered first: this runs before MXNet's handler,
            # which was registered when mxnet was imported (before any store existed)
            atexit.register(self._leave)
        self._stores.append(weakref.ref(kv))
        self._wait_all = wait_all

    def dist_store(self) -> Any | None:
        """The dist store this process leaves with, if it has one."""
        for ref in self._stores:
            if (kv := ref()) is not None:
                return kv
        return None

    def _leave(self) -> None:
        if any(beat.stopped for beat in list(self._beats)):
            # rank 0 stopped at the launcher's word: the others wait in their next exchange,
            # never at this barrier; the launcher tears them down once this process is gone
            self.exit_now(130)
        if self._wait_all is not None:
            self._wait_all()
        for ref in self._stores:
            kv = ref()
            if kv is not None:  # a store already freed has been through its own exit barrier
                kv._barrier()
        self.finish()


#: This process's session.
SESSION = WorkerSession()
