"""MXNet's own ``tools/launch.py``, runnable on Python 3.11.

``python -m mxlarge.launcher.mxnet_launch -n 2 -s 1 --launcher local mxlarge train CFG``
runs the unmodified launch.py from the installed wheel inside :func:`tracker_compat`
(without it the tracker crashes on ``Thread.isAlive`` after starting the scheduler and
leaves it orphaned) and :func:`claimed_scheduler_port` (two jobs started at once from
one host would take the same scheduler port). The command is the same ``mxlarge train``
as everywhere: its scheduler and server roles start inside ``import mxnet``.

``--launcher local`` keeps every process on loopback. dmlc's local backend calls
``tracker.submit`` without an address, so the scheduler would bind (and advertise) the
address of this host's FQDN or of its outward interface, reachable from the network;
here the tracker is given 127.0.0.1 instead, and servers/workers get
``DMLC_NODE_HOST=127.0.0.1`` and ``DMLC_INTERFACE=lo`` unless set. Other launchers
(``ssh``, ``mpi``) keep launch.py's own address choice: the scheduler on the address of
this host's name.

Under ``--launcher local`` every process dmlc starts (the scheduler, the servers, the
workers) runs under the launcher's :class:`~mxlarge.launcher.supervisor.Supervisor`:
dmlc's ``subprocess`` is a shim for the time of the submission (:class:`_LocalShim`), so
each line is labelled ``[worker r]``/``[server r]``/``[scheduler]`` (r: the kvstore rank
once ps-lite assigned it, with dmlc's launch index where it differs:
:func:`~mxlarge.launcher.child.process_label`), the first process to fail ends the
job with its exit status (dmlc's local backend retries, logs and returns 0), and nothing
outlives the command. ``mxlarge launch`` is still the recommended front end (stall
watchdog, restarts, MLflow).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import runpy
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mxlarge.launcher.backends.local import LOOPBACK
from mxlarge.launcher.child import Child, exit_code_for, failure_message
from mxlarge.launcher.dmlc_compat import patched_subprocess, scheduler_address, tracker_compat
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.scheduler_port import claimed_scheduler_port
from mxlarge.launcher.supervisor import Supervisor, supervise

#: Seconds the processes get between SIGTERM and SIGKILL at teardown.
GRACE = 5.0
#: Seconds the servers and workers may take to exit once the scheduler has.
SHUTDOWN_TIMEOUT = 30.0


def launch_py() -> Path:
    """Path of ``tools/launch.py`` inside the installed mxnet wheel (mxnet is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mxnet is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tools" / "launch.py"


def launcher_of(argv: list[str]) -> str:
    """The ``--launcher`` launch.py will use (its default is ``ssh``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--launcher", default="ssh")
    known, _ = p.parse_known_args(argv)
    return str(known.launcher)


class _LocalShim:
    """dmlc's ``subprocess`` during a local submission: each ``call``/``check_call``
    (one per process, in dmlc's threads) runs under the supervisor and returns its
    status; ``verbose`` (ps-lite's level-1 lines, which name each process's kvstore
    rank) goes into its environment."""

    def __init__(self, sup: Supervisor, verbose: Mapping[str, str]) -> None:
        self._sup = sup
        self._verbose = verbose
        self._servers = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def _label(self, env: Mapping[str, str] | None) -> tuple[str, int | None]:
        role = (env or {}).get("DMLC_ROLE", "process")
        if role == "worker":
            return role, int((env or {}).get("DMLC_TASK_ID", 0))
        if role == "server":
            with self._lock:
                self._servers += 1
                return role, self._servers - 1
        return role, None

    def call(self, args: Any, *, env: Mapping[str, str] | None = None, shell: bool = False,
             executable: str | None = None, **kwargs: Any) -> int:
        role, index = self._label(env)
        try:
            child = self._sup.spawn(role, index, args, env={**(env or os.environ),
                                                            **self._verbose},
                                    shell=shell, executable=executable)
        except RuntimeError:
            return 0  # teardown has begun
        child.wait_exit()
        # 0 to dmlc, whatever happened: it would retry a failed worker or print a
        # traceback; the supervision loop has seen the exit and acts on it
        return 0

    check_call = call


@dataclasses.dataclass(frozen=True)
class _LaunchPyRun:
    """launch.py's local job as the supervision loop asks it
    (:class:`~mxlarge.launcher.supervisor.Supervised`): ``returned`` is set once
    launch.py returned."""

    sup: Supervisor
    returned: threading.Event

    def explain(self, child: Child) -> Outcome:
        assert child.status is not None
        child.join_pump(timeout=1.0)
        return Outcome(exit_code_for(child.status), failure_message(child))

    def terminated(self, sig: int) -> Outcome:
        return Outcome(128 + sig, "job torn down")

    def ending(self) -> bool:
        return self.returned.is_set()

    def ended(self, seconds: float) -> Outcome | None:
        if self.sup.all_exited():
            return Outcome(0, "")
        if seconds > SHUTDOWN_TIMEOUT:
            hung = ", ".join(c.label for c in self.sup.children if c.status is None)
            return Outcome(1, f"{hung} still running {SHUTDOWN_TIMEOUT:g} s after the "
                              "scheduler exited")
        return None


def _run_local(path: Path, tracker: Any) -> int:
    """launch.py's local submission under the supervisor (module docstring): its exit
    status.

    launch.py runs in the main thread (it installs a SIGINT handler, which only the main
    thread may), the supervision loop beside it; a failure's teardown ends the
    scheduler, so ``tracker.submit`` and launch.py return."""
    import signal

    import dmlc_tracker.local as local

    verbose = verbose_env(os.environ)  # the ranks, in lines not shown (pslog)
    sup = Supervisor(sys.stdout, hide_ps_verbose=bool(verbose))
    returned = threading.Event()
    stop = threading.Event()
    received: list[int] = []
    outcomes: list[Outcome] = []

    def watch() -> None:
        outcome = supervise(sup, _LaunchPyRun(sup, returned), None, stop, received)
        if outcome.message:
            sup.sink.emit("launcher", outcome.message + ("; stopping the job"
                                                         if outcome.exit_code else ""))
        sup.teardown(GRACE)
        outcomes.append(outcome)

    watcher = threading.Thread(target=watch, name="supervise", daemon=True)
    try:
        with patched_subprocess([local, tracker], _LocalShim(sup, verbose)):
            watcher.start()
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as e:  # launch.py's SIGINT handler (or its argument errors)
                if not sup.children:
                    return int(e.code or 0) if not isinstance(e.code, str) else 2
                received.append(signal.SIGINT)
                stop.set()
            finally:
                returned.set()
            watcher.join()
    finally:
        stop.set()
        sup.close(GRACE)
    return outcomes[0].exit_code if outcomes else 1


def main(argv: list[str] | None = None) -> int:
    """Run launch.py with ``argv``: under ``--launcher local`` the job's exit status
    (module docstring); else 0 when it returns (it exits itself on errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    local = launcher_of(argv) == "local"
    if local:
        os.environ.setdefault("DMLC_NODE_HOST", LOOPBACK)
        os.environ.setdefault("DMLC_INTERFACE", "lo")
    path = launch_py()
    sys.argv = [str(path), *argv]
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker_compat())
        from dmlc_tracker import tracker
        stack.enter_context(claimed_scheduler_port(tracker))
        if local:
            stack.enter_context(scheduler_address(tracker, LOOPBACK))
            return _run_local(path, tracker)
        runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
