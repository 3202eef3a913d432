"""The local backend: 1 scheduler, n servers and m workers on 127.0.0.1, started and
supervised by the launcher itself (:class:`LocalBackend`, :class:`LocalRun`).

ps-lite (inside MXNet) is the transport; this is process supervision only. Every role
runs the same command, as with MXNet's ``tools/launch.py``: a process whose
``DMLC_ROLE`` is ``scheduler`` or ``server`` serves that role inside ``import mxnet``
and exits there. Every process listens on loopback only (``DMLC_PS_ROOT_URI``,
``DMLC_NODE_HOST``, ``DMLC_INTERFACE``: how ps-lite binds is in
``docs/design/launcher.md``, Loopback), so there is no packet filter to install; ranks
are assigned by the scheduler, so a worker's launch index is *not* its kvstore rank. An
elastic job's "hosts" are its worker processes, ``worker-<i>``; :func:`local_probe`
takes as lost for good the names listed in a file (``--local-lost FILE``).
"""
from __future__ import annotations

import dataclasses
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
from pathlib import Path
from typing import IO, Any

from mxlarge.launcher.backends.base import LaunchBackend, Spec
from mxlarge.launcher.child import Child, exit_code_for, failure_message
from mxlarge.launcher.firewall import LOOPBACK_ONLY
from mxlarge.launcher.hostfile import HostEntry
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.reports import Drawn, WorkerReports
from mxlarge.launcher.restart import Elastic, Probe
from mxlarge.launcher.supervisor import Supervisor, check_job, supervise, termination_signals
from mxlarge.launcher.tuning import local_role_env
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.plan import World
from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV
from mxlarge.protocol.reports import ENV as REPORTS_ENV

LOOPBACK = "127.0.0.1"

# Variables the launcher sets per process. A caller may not override them (the job would
# not form), and inherited values are dropped: e.g. ps-lite itself setenv()s DMLC_RANK,
# and a stale value inherited from an enclosing job changes how some ps-lite versions
# assign node ids.
OWNED_ENV = frozenset({
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
    "DMLC_NODE_HOST", "DMLC_INTERFACE", "DMLC_RANK", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER",
    "MXLARGE_ROLE", "MXLARGE_LOCAL_RANK", "MXLARGE_JOB_ID", HEARTBEAT_ENV, REPORTS_ENV,
})

# A worker that joined the parameter server leaves through ps-lite's exit barrier
# together with the scheduler, which exits in the same moment (measured: within one 0.1
# s poll). A scheduler still running this long after every worker exited 0 is still
# waiting for workers to join.
JOIN_GRACE = 3.0


class PortInUseError(OSError):
    """The scheduler port requested for a local job is already taken."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    There is an unavoidable window before the scheduler binds it; if another process
    takes the port meanwhile, the scheduler fails to bind and :func:`run_local` reports
    that failure.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def ensure_port_free(port: int, host: str = LOOPBACK) -> None:
    """Raise :class:`PortInUseError` if ``host:port`` cannot be bound for listening.

    SO_REUSEADDR is set like ZeroMQ does, so a port held only by TIME_WAIT connections
    of an earlier job counts as free, while any listener (on this address or the
    wildcard) does not.
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
    # Children write to a pipe; without this, Python block-buffers and lines arrive late
    # (or never, if the process is killed).
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


def local_hosts(workers: int) -> list[str]:
    """A local job's hosts: each worker process is its own, ``worker-<i>`` (launch index i)."""
    return [f"worker-{i}" for i in range(workers)]


def local_probe(lost: str | Path | None) -> Probe:
    """A local job's :data:`~mxlarge.launcher.restart.Probe`: every host lives but those
    named in the file ``lost`` (one name a line, read at each probe; a missing file
    names none)."""
    def probe(hosts: Sequence[str]) -> list[str]:
        gone: set[str] = set()
        if lost is not None and Path(lost).is_file():
            gone = {line.strip() for line in Path(lost).read_text().splitlines()}
        return [h for h in hosts if h not in gone]
    return probe



class LocalBackend(LaunchBackend):
    """``--launcher local``."""

    name = "local"
    on_this_machine = True
    #: seconds servers and scheduler may take to exit after the last worker (a spec's
    #: default)
    shutdown_timeout = 30.0

    def check_spec(self, spec: Spec) -> None:
        super().check_spec(spec)
        if spec.hostfile or spec.host_ip:
            raise ValueError("--hostfile/--host-ip are for cluster launchers")

    def preflight(self, spec: Spec) -> None:
        """A ``--port`` already taken (:class:`PortInUseError`)."""
        if spec.port is not None:
            ensure_port_free(spec.port)

    def firewall_refusal(self) -> str | None:
        return LOOPBACK_ONLY

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        return Elastic(world, local_hosts(world.processes), local_probe(local_lost),
                       min_workers)

    def attempt_env(self, spec: Spec, declared_workers: int) -> Mapping[str, str]:
        # CPU kernels reduce in an order that depends on the OpenMP team: every worker
        # keeps the declared world's (tests/e2e/test_simulate.py)
        if not spec.tuning:
            return spec.env
        return {**local_role_env("worker", declared_workers, {**os.environ, **spec.env}),
                **spec.env}

    def run(self, spec: Spec, output: IO[str] | Any = None, drawn: Drawn | None = None
            ) -> Outcome:
        """Runs ``spec.argv`` as 1 scheduler, ``spec.servers`` servers and
        ``spec.world.processes`` workers on loopback (the rules:
        ``docs/design/launcher.md``, The local job).

        Each process gets the ``DMLC_*`` variables of its role, plus ``MXLARGE_ROLE``,
        ``MXLARGE_LOCAL_RANK`` (launch index within the role) and ``MXLARGE_JOB_ID``; its output
        goes to ``output`` (stdout if None) as ``[worker 1] ...`` (its kvstore rank, once
        known: :func:`~mxlarge.launcher.child.process_label`); ``drawn`` gets every
        rank's parts while it runs (:class:`~mxlarge.launcher.reports.WorkerReports`). No
        child outlives this call.

        Raises:
            ValueError: on invalid arguments.
            PortInUseError: ``spec.port`` is already in use; nothing has been started.
        """
        workers = spec.world.processes
        servers = spec.servers
        command = check_job(spec.argv, workers, servers)
        shutdown_timeout = (self.shutdown_timeout if spec.shutdown_timeout is None
                            else spec.shutdown_timeout)
        if spec.grace < 0 or shutdown_timeout < 0:
            raise ValueError("grace and shutdown_timeout must be >= 0")
        if spec.stall_timeout is not None and spec.stall_timeout < 0:
            raise ValueError(f"stall_timeout must be >= 0 (0 disables), got {spec.stall_timeout}")
        base = _job_env(spec.env)
        ps_verbose = verbose_env(base)  # ps-lite names its port (pslog); not shown unless asked
        base.update(ps_verbose)
        port = free_port() if spec.port is None else spec.port
        if spec.port is not None:
            ensure_port_free(port)

        job_id = uuid.uuid4().hex[:12]
        # the job's directories: heartbeats (the watchdog's) and reports (the
        # timeline's)
        beats = tempfile.mkdtemp(prefix=f"mxlarge-heartbeat-{job_id}-")
        reported = tempfile.mkdtemp(prefix=f"mxlarge-reports-{job_id}-")
        base[HEARTBEAT_ENV] = beats
        base[REPORTS_ENV] = reported
        sup = Supervisor(sys.stdout if output is None else output,
                         hide_ps_verbose=bool(ps_verbose), heartbeats=beats,
                         roles={"server": servers, "worker": workers})
        stop = threading.Event()
        received: list[int] = []

        def emit(line: str) -> None:
            sup.sink.emit("launcher", line)
        watchdog = Watchdog(beats, workers, spec.stall_timeout, emit=emit)
        reports = WorkerReports(beats, reported, emit, sup.servers, drawn=drawn)
        try:
            with termination_signals(stop, received):
                sup.sink.emit("launcher", f"job {job_id}: scheduler on {LOOPBACK}:{port}, "
                                          f"{servers} server(s), {workers} worker(s)")
                for role, count in (("scheduler", 1), ("server", servers), ("worker", workers)):
                    for i in range(count):
                        env = _role_env(base, role=role, index=i, port=port, workers=workers,
                                        servers=servers, job_id=job_id)
                        if spec.tuning:
                            env.update(local_role_env(role, workers, env))
                        sup.spawn(role, None if role == "scheduler" else i, command, env=env)
                outcome = supervise(sup, LocalRun(sup, watchdog, shutdown_timeout), watchdog,
                                    stop, received, reports=reports)
                if outcome.reason is not None:
                    sup.sink.emit("launcher", f"{outcome.message}; stopping the job")
                else:
                    sup.sink.emit("launcher", outcome.message)
                # Still inside the signal block: a second Ctrl-C must not interrupt the
                # cleanup.
                sup.teardown(spec.grace)
            return outcome
        finally:
            sup.close(spec.grace)
            shutil.rmtree(beats, ignore_errors=True)
            shutil.rmtree(reported, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """A job on loopback as the supervision loop asks it
    (:class:`~mxlarge.launcher.supervisor.Supervised`)."""

    sup: Supervisor
    watchdog: Watchdog | None
    shutdown_timeout: float

    def explain(self, failed: Child) -> Outcome:
        assert failed.status is not None
        step = None
        record = None
        if self.watchdog is not None:
            self.watchdog.read(force=True)  # the failed worker's last record
            record = self.watchdog.record_of_pid(failed.pid) if failed.role == "worker" else None
            step = self.watchdog.progress() if record is None else record.done
        failed.find_rank()  # the line names it by its rank, as the tags and files do
        return Outcome(exit_code_for(failed.status), failure_message(failed), "crashed", step,
                       ProcessFailure(failed.role, record.rank if record else failed.rank,
                                      failed.index,
                                      record.host if record else socket.gethostname(),
                                      failed.pid, failed.status,
                                      record.done if record else None, tuple(failed.tail)))

    def terminated(self, sig: int) -> Outcome:
        return Outcome(128 + sig, f"launcher received {signal.Signals(sig).name}; job torn down")

    def ending(self) -> bool:
        return self.sup.all_exited("worker")

    def ended(self, seconds: float) -> Outcome | None:
        children = self.sup.children
        n_w = sum(c.role == "worker" for c in children)
        if self.sup.all_exited():
            n_s = sum(c.role == "server" for c in children)
            return Outcome(0, f"job finished: {n_w} worker(s), {n_s} server(s) and the "
                              f"scheduler exited 0")
        waiting = any(c.role == "scheduler" and c.status is None for c in children)
        if waiting and seconds > min(JOIN_GRACE, self.shutdown_timeout):
            return Outcome(1, f"no worker joined the parameter server: all {n_w} workers "
                           "exited 0 while the scheduler still waited for them (the "
                           "command never created a dist_sync store: give its Trainer "
                           "kvstore='dist_sync'); servers and scheduler stopped")
        if seconds > self.shutdown_timeout:
            hung = ", ".join(c.label for c in children if c.status is None)
            return Outcome(0, f"all workers exited 0; {hung} did not exit within "
                           f"{self.shutdown_timeout:g} s and were stopped")
        return None
