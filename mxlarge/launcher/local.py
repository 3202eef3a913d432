"""Run a dist_sync job on this machine: 1 scheduler, n servers, m workers on 127.0.0.1.

This is process supervision only; ps-lite (inside MXNet) is the transport. Every role runs the
same command, as with MXNet's ``tools/launch.py``: a process whose ``DMLC_ROLE`` is
``scheduler`` or ``server`` serves that role inside ``import mxnet`` and exits there.

Loopback binding, as checked against ps-lite in MXNet 1.9.1 (``van.cc``, ``zmq_van.h``):

* the scheduler binds to ``DMLC_PS_ROOT_URI`` (its node *is* the root node);
* a server or worker binds to ``DMLC_NODE_HOST`` if set, else to the address of the interface
  named by ``DMLC_INTERFACE``, else to the first non-loopback interface it finds;
* ps-lite probes for a free port by binding ``INADDR_ANY:0`` and closing again; it never
  listens there.

So ``DMLC_PS_ROOT_URI=127.0.0.1`` plus ``DMLC_NODE_HOST=127.0.0.1`` keeps every listening socket on
loopback; ``DMLC_INTERFACE=lo`` is set as well, as a second line of defence. Ranks are assigned by
the scheduler (sorted by host and port), so a worker's launch index is *not* its kvstore rank.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any

from mxlarge.launcher._supervise import (
    Backend,
    Child,
    Supervisor,
    check_job,
    exit_code_for,
    failure_message,
    supervise,
    termination_signals,
)
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.tuning import local_role_env
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV

LOOPBACK = "127.0.0.1"

# Variables the launcher sets per process. A caller may not override them (the job would not
# form), and inherited values are dropped: e.g. ps-lite itself setenv()s DMLC_RANK, and a stale
# value inherited from an enclosing job changes how some ps-lite versions assign node ids.
OWNED_ENV = frozenset({
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
    "DMLC_NODE_HOST", "DMLC_INTERFACE", "DMLC_RANK", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER",
    "MXLARGE_ROLE", "MXLARGE_LOCAL_RANK", "MXLARGE_JOB_ID", HEARTBEAT_ENV,
})

# A worker that joined the parameter server leaves through ps-lite's exit barrier together with
# the scheduler, which exits in the same moment (measured: within one 0.1 s poll). A scheduler
# still running this long after every worker exited 0 is still waiting for workers to join.
JOIN_GRACE = 3.0


class PortInUseError(OSError):
    """The scheduler port requested for a local job is already taken."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    There is an unavoidable window before the scheduler binds it; if another process takes the
    port meanwhile, the scheduler fails to bind and :func:`run_local` reports that failure.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def ensure_port_free(port: int, host: str = LOOPBACK) -> None:
    """Raise :class:`PortInUseError` if ``host:port`` cannot be bound for listening.

    SO_REUSEADDR is set like ZeroMQ does, so a port held only by TIME_WAIT connections of an
    earlier job counts as free, while any listener (on this address or the wildcard) does not.
    """
    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(
                    f"scheduler port {port} on {host} is not available ({e.strerror}); "
                    f"choose another port, or pass port=None to use a free one"
                ) from e
            raise


def _job_env(env: Mapping[str, str] | None) -> dict[str, str]:
    if env:
        clash = sorted(OWNED_ENV & env.keys())
        if clash:
            raise ValueError(f"env may not set {', '.join(clash)}: the launcher sets these "
                             f"per process")
    base = {k: v for k, v in os.environ.items() if k not in OWNED_ENV}
    # Children write to a pipe; without this, Python block-buffers and lines arrive late (or
    # never, if the process is killed).
    base.setdefault("PYTHONUNBUFFERED", "1")
    base.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # no __pycache__ written into the checkout
    if env:
        base.update(env)
    return base


def _role_env(base: Mapping[str, str], *, role: str, index: int, port: int, workers: int,
              servers: int, job_id: str) -> dict[str, str]:
    env = dict(base)
    env.update({
        "DMLC_ROLE": role,
        "DMLC_PS_ROOT_URI": LOOPBACK,
        "DMLC_PS_ROOT_PORT": str(port),
        "DMLC_NUM_SERVER": str(servers),
        "DMLC_NUM_WORKER": str(workers),
        "DMLC_NODE_HOST": LOOPBACK,
        "DMLC_INTERFACE": "lo",
        "MXLARGE_ROLE": role,
        "MXLARGE_LOCAL_RANK": str(index),
        "MXLARGE_JOB_ID": job_id,
    })
    return env


def run_local(command: Sequence[str], *, workers: int, servers: int, port: int | None = None,
              env: Mapping[str, str] | None = None, grace: float = 10.0,
              output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 30.0,
              stall_timeout: float | None = None, tuning: bool = True) -> Outcome:
    """Run ``command`` as 1 scheduler, ``servers`` servers and ``workers`` workers on loopback.

    Each process gets the ``DMLC_*`` variables of its role, plus ``MXLARGE_ROLE``,
    ``MXLARGE_LOCAL_RANK`` (launch index within the role) and ``MXLARGE_JOB_ID`` (unique per
    call) for logging. Output is streamed line by line to ``output`` as ``[worker 1] ...``.

    The first process to exit non-zero or by a signal fails the job: all others get SIGTERM
    (their whole process group), then SIGKILL after ``grace`` seconds. Once every worker has
    exited 0, servers and scheduler get ``shutdown_timeout`` seconds to exit on their own (the
    rank-0 worker stops them) and are killed after that; the job still counts as a success.
    SIGINT/SIGTERM/SIGHUP to the launcher (main thread only) tear the job down as well. No child
    outlives this call, including when it raises.

    Workers report their progress through heartbeat files (:mod:`mxlarge.protocol.heartbeat`,
    in a temporary directory named by ``MXLARGE_HEARTBEAT_DIR``); a job in which no worker
    advances for the stall timeout is torn down the same way, with exit code 124 and the ranks
    behind named (:mod:`mxlarge.launcher.watchdog`).

    Args:
        command: argv run for every role (no shell).
        workers: number of workers (>= 1).
        servers: number of servers (>= 1; dist_sync needs one).
        port: scheduler port on 127.0.0.1; a free one if ``None``.
        env: extra environment for every process, on top of this process's environment.
        grace: seconds between SIGTERM and SIGKILL during teardown.
        output: text stream for the children's prefixed output.
        shutdown_timeout: seconds servers/scheduler may take to exit after the last worker.
        stall_timeout: seconds without progress that stop the job; ``None`` for the default
            (max(120 s, 20 x the median step time)); 0 disables the watchdog.
        tuning: add :mod:`mxlarge.launcher.tuning`'s settings (malloc, big-array bound, OpenMP
            threads per role) where ``env`` and this process's environment leave them unset.

    Returns:
        The :class:`Outcome`.

    Raises:
        ValueError: on invalid arguments.
        PortInUseError: if ``port`` is given and already in use; nothing has been started.
    """
    command = check_job(command, workers, servers)
    if grace < 0 or shutdown_timeout < 0:
        raise ValueError("grace and shutdown_timeout must be >= 0")
    if stall_timeout is not None and stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 (0 disables), got {stall_timeout}")
    base = _job_env(env)
    ps_verbose = verbose_env(base)  # ps-lite names its port (pslog); not shown unless asked
    base.update(ps_verbose)
    if port is None:
        port = free_port()
    else:
        ensure_port_free(port)

    job_id = uuid.uuid4().hex[:12]
    sup = Supervisor(output, hide_ps_verbose=bool(ps_verbose))
    stop = threading.Event()
    received: list[int] = []
    watchdog = None
    if stall_timeout != 0:
        beats = tempfile.mkdtemp(prefix=f"mxlarge-heartbeat-{job_id}-")
        base[HEARTBEAT_ENV] = beats
        watchdog = Watchdog(beats, workers, stall_timeout,
                            emit=lambda line: sup.sink.emit("launcher", line))
    try:
        with termination_signals(stop, received):
            def start(role: str, index: int) -> None:
                env = _role_env(base, role=role, index=index, port=port, workers=workers,
                                servers=servers, job_id=job_id)
                if tuning:
                    env.update(local_role_env(role, workers, env))
                sup.spawn(role, None if role == "scheduler" else index, command, env=env)

            sup.sink.emit("launcher", f"job {job_id}: scheduler on {LOOPBACK}:{port}, "
                                      f"{servers} server(s), {workers} worker(s)")
            start("scheduler", 0)
            for i in range(servers):
                start("server", i)
            for i in range(workers):
                start("worker", i)
            outcome = supervise(sup, _backend(sup, watchdog, shutdown_timeout), watchdog, stop,
                                received)
            if outcome.reason is not None:
                sup.sink.emit("launcher", f"{outcome.message}; stopping the job")
            else:
                sup.sink.emit("launcher", outcome.message)
            # Still inside the signal block: a second Ctrl-C must not interrupt the cleanup.
            sup.teardown(grace)
        return outcome
    finally:
        sup.close(grace)
        if watchdog is not None:
            shutil.rmtree(watchdog.directory, ignore_errors=True)


def _backend(sup: Supervisor, watchdog: Watchdog | None, shutdown_timeout: float) -> Backend:
    """What the supervision loop needs to know of a job on loopback."""

    def explain(failed: Child) -> Outcome:
        assert failed.status is not None
        step = record = None
        if watchdog is not None:
            watchdog.read(force=True)  # the failed worker's last record
            record = watchdog.record_of_pid(failed.pid) if failed.role == "worker" else None
            step = watchdog.progress() if record is None else record.done
        return Outcome(exit_code_for(failed.status), failure_message(failed), "crashed", step,
                       ProcessFailure(failed.role, record.rank if record else None,
                                      failed.index,
                                      record.host if record else socket.gethostname(),
                                      failed.pid, failed.status,
                                      record.done if record else None, tuple(failed.tail)))

    def terminated(sig: int) -> Outcome:
        return Outcome(128 + sig, f"launcher received {signal.Signals(sig).name}; job torn down")

    def ended(seconds: float) -> Outcome | None:
        n_w = sum(c.role == "worker" for c in sup.children)
        if sup.all_exited():
            n_s = sum(c.role == "server" for c in sup.children)
            return Outcome(0, f"job finished: {n_w} worker(s), {n_s} server(s) and the "
                              f"scheduler exited 0")
        waiting = any(c.role == "scheduler" and c.status is None for c in sup.children)
        if waiting and seconds > min(JOIN_GRACE, shutdown_timeout):
            return Outcome(1, f"no worker joined the parameter server: all {n_w} workers "
                           "exited 0 while the scheduler still waited for them (the "
                           "command never created a dist_sync store: give its Trainer "
                           "kvstore='dist_sync'); servers and scheduler stopped")
        if seconds > shutdown_timeout:
            hung = ", ".join(c.label for c in sup.children if c.status is None)
            return Outcome(0, f"all workers exited 0; {hung} did not exit within "
                           f"{shutdown_timeout:g} s and were stopped")
        return None

    return Backend(explain, terminated, lambda: sup.all_exited("worker"), ended)
