"""What dmlc_tracker (shipped in the MXNet 1.9.1 wheel) needs to run here, while a
submission runs.

dmlc_tracker calls ``Thread.isAlive()`` (removed in Python 3.9: ``tracker.submit`` would
crash right after starting the scheduler and leave it orphaned) and
``Thread.setDaemon()`` (deprecated since 3.10): :func:`tracker_compat` aliases the first
and silences the second, and restores both after. Its mpi and slurm backends never pass
the scheduler address on, and its guess leaks a socket: :func:`scheduler_address` makes
``tracker.submit`` use the one we chose (:func:`guess_host_ip`, same logic without the
leak).

Its backends start every process with ``subprocess.check_call`` in daemon threads and
never look at the result; :func:`patched_subprocess` swaps the ``subprocess`` name in
its modules for the launcher's shim (:mod:`mxlarge.launcher.backends.dmlc`) for the time
of a submission. Why: "Compatibility with Python 3.11" in ``docs/design/launcher.md``.
"""
from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

_compat_lock = threading.Lock()
_compat_depth = 0
_compat_saved: dict[str, Any] = {}
_MISSING = object()


def _set_daemon(self: threading.Thread, daemonic: bool) -> None:
    self.daemon = daemonic


@contextlib.contextmanager
def tracker_compat() -> Iterator[None]:
    """Let dmlc_tracker 1.9.1 run on Python >= 3.9 while the block runs.

    Adds ``threading.Thread.isAlive`` (an alias of ``is_alive``) and replaces the
    deprecated ``setDaemon`` by a silent equivalent. Reentrant and thread-safe; the
    original class attributes are restored when the outermost block exits.
    """
    global _compat_depth
    with _compat_lock:
        if _compat_depth == 0:
            for name in ("isAlive", "setDaemon"):
                _compat_saved[name] = threading.Thread.__dict__.get(name, _MISSING)
            # adding the alias Python 3.9 removed is the point (dmlc's tracker calls it)
            threading.Thread.isAlive = threading.Thread.is_alive  # type: ignore[attr-defined]
            # replacing the deprecated setDaemon is the point (dmlc's tracker still calls it)
            threading.Thread.setDaemon = _set_daemon  # type: ignore[method-assign, deprecated]
        _compat_depth += 1
    try:
        yield
    finally:
        with _compat_lock:
            _compat_depth -= 1
            if _compat_depth == 0:
                for name, old in _compat_saved.items():
                    if old is _MISSING:
                        delattr(threading.Thread, name)
                    else:
                        setattr(threading.Thread, name, old)
                _compat_saved.clear()


def guess_host_ip() -> str:
    """The scheduler address dmlc_tracker would pick (``get_host_ip('auto')``).

    Same logic (the address of this host's FQDN, or, if that is a 127.x address, the one
    of the interface that routes outward), minus the UDP socket dmlc's version never
    closes.
    """
    try:
        ip = socket.gethostbyname(socket.getfqdn())
    except socket.gaierror:
        ip = socket.gethostbyname(socket.gethostname())
    if ip.startswith("127."):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: UDP connect only routes
            ip = str(s.getsockname()[0])
    return ip


@contextlib.contextmanager
def scheduler_address(tracker: ModuleType, host_ip: str) -> Iterator[None]:
    """Make ``tracker.submit`` use ``host_ip`` even when the backend does not pass it.

    dmlc's mpi and slurm backends call ``tracker.submit`` without ``hostIP``, so
    ``--host-ip`` is silently ignored there and the scheduler address is always guessed.
    """
    original = tracker.submit

    def submit(nworker: int, nserver: int, fun_submit: Any, hostIP: str | None = "auto",
               pscmd: str | None = None) -> Any:
        if hostIP in (None, "auto", "ip"):
            hostIP = host_ip
        return original(nworker, nserver, fun_submit, hostIP=hostIP, pscmd=pscmd)

    # typeshed's ModuleType reads any attribute but writes none: patching dmlc's tracker
    tracker.submit = submit  # type: ignore[attr-defined]
    try:
        yield
    finally:
        tracker.submit = original  # type: ignore[attr-defined]


@contextlib.contextmanager
def patched_subprocess(modules: Sequence[ModuleType], shim: Any) -> Iterator[None]:
    """``modules``' ``subprocess`` is ``shim`` while the block runs."""
    saved = [(m, m.subprocess) for m in modules]
    try:
        for m in modules:
            # typeshed's ModuleType reads any attribute but writes none
            m.subprocess = shim  # type: ignore[attr-defined]
        yield
    finally:
        for m, original in saved:
            m.subprocess = original  # type: ignore[attr-defined]  # as above
