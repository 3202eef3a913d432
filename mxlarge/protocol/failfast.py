"""Worker-side helpers: make a failing dist_sync worker actually exit.

Measured with MXNet 1.9.1: when a worker's Python code raises (or calls ``sys.exit(n)``), the
interpreter shuts down normally, and the ``dist_sync`` kvstore's destructor enters ps-lite's exit
barrier, which waits for every other worker. Those are typically blocked in a push/pull waiting
for the failed worker's contribution, so the job deadlocks and the process never exits: no
launcher (ours, mpirun, srun) can see the failure. Even when the others are not blocked, the
non-zero exit status only appears once they have all finished.

The cure is to leave without the interpreter's shutdown sequence (``os._exit``) on the failure
path. A clean ``return``/exit 0 must keep the normal path: the barrier is also where the rank-0
worker stops the servers.

Usage in a worker's entry point (after ``import mxnet``)::

    from mxlarge.protocol.failfast import fail_fast
    with fail_fast():
        train()

Code that must run before such an exit (e.g. marking an MLflow run FAILED) belongs in an
``except`` inside the block: atexit handlers and finalizers do not run.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import NoReturn

#: Called before :func:`exit_now` leaves (errors ignored): ``mxlarge.Trainer`` adds
#: :func:`mxlarge.protocol.heartbeat.settle`, so the last heartbeat record names the step.
BEFORE_EXIT: list[Callable[[], None]] = []


def exit_now(code: int) -> NoReturn:
    """Run :data:`BEFORE_EXIT`, flush stdio and logging, then ``os._exit(code)``: no
    atexit, no kvstore exit barrier."""
    for fn in BEFORE_EXIT:
        with contextlib.suppress(Exception):
            fn()
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    # sys.exit("message") prints the message and exits with 1.
    print(exc.code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Turn any exception, or ``sys.exit(n)`` with n != 0, inside the block into an immediate exit.

    An exception's traceback is printed to stderr, then the process exits with status 1
    (130 for KeyboardInterrupt). ``sys.exit(0)`` and normal completion are left alone.
    """
    try:
        yield
    except SystemExit as e:
        code = _code_of(e)
        if code == 0:
            raise
        exit_now(code)
    except KeyboardInterrupt:
        traceback.print_exc()
        exit_now(130)
    except BaseException:  # noqa: BLE001 - any uncaught error must end the process
        traceback.print_exc()
        exit_now(1)


def install_fail_fast() -> None:
    """Make uncaught exceptions in the main thread exit at once (a ``sys.excepthook``).

    For code that cannot be wrapped in :func:`fail_fast`. It does not see ``sys.exit(n)``
    (SystemExit never reaches the hook) and is idempotent.
    """
    if getattr(sys.excepthook, "_mxlarge_fail_fast", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):  # type: ignore[no-untyped-def]
        with contextlib.suppress(Exception):
            previous(exc_type, exc, tb)
        exit_now(130 if issubclass(exc_type, KeyboardInterrupt) else 1)

    hook._mxlarge_fail_fast = True  # type: ignore[attr-defined]
    sys.excepthook = hook
