"""Submit a dist_sync job to a cluster through ``dmlc_tracker`` (shipped in the mxnet wheel).

We do not write our own cluster launcher: :func:`cluster_submit` builds the ``args`` namespace
that ``mxnet/tools/launch.py`` would build (with ``dmlc_tracker.opts.get_opts``) and calls the
backend's own ``submit(args)``. Around that call it adds three things.

Compatibility with Python 3.11 (:func:`tracker_compat`)
    dmlc_tracker as shipped with MXNet 1.9.1 calls ``Thread.isAlive()`` (removed in Python
    3.9; without it ``tracker.submit`` crashes right after starting the scheduler and leaves it
    orphaned) and ``Thread.setDaemon()`` (deprecated since 3.10: a ``DeprecationWarning``, an
    error under ``-W error``). While a submission runs, ``Thread.isAlive`` is aliased to
    ``is_alive`` and ``setDaemon`` sets ``.daemon`` without warning; both are restored after.

Scheduler address
    The scheduler binds, and workers dial, the tracker's ``hostIP``. The mpi and slurm backends
    never pass ``args.host_ip`` on (only ssh does), and the guess dmlc makes leaks a socket.
    We resolve the address once (:func:`guess_host_ip`, or ``extra["host_ip"]``) and make
    ``tracker.submit`` use it for every backend.

Scheduler port (:func:`claimed_scheduler_port`)
    dmlc's ``PSTracker`` takes the first port from 9091 up that it can bind, closes it, and
    starts the scheduler, which binds it seconds later (after ``import mxnet``): two jobs
    launched from one host at once take the same port and the second scheduler dies with
    ``bind failed``. While a job's tracker picks its port and until its scheduler listens on
    it, the launcher holds a lock file of this user's on this machine, so the next job's
    tracker finds the port taken.

Supervision
    Every backend starts its processes with ``subprocess.check_call`` in daemon threads (the
    scheduler locally, then ``ssh``/``mpirun``/``srun`` per role) and never looks at the
    result; a failed worker leaves the scheduler waiting forever. During a submission the
    ``subprocess`` name inside ``dmlc_tracker.tracker`` and the backend module is replaced by a
    shim whose ``check_call`` starts the command in its own process group under a
    :class:`~mxlarge.launcher._supervise.Supervisor` (output prefixed, exit watched). The first
    non-zero exit, or SIGINT/SIGTERM/SIGHUP to the launcher, tears down every local process the
    backend started, which ends the tracker too. A remote process cut off from the launcher
    (a partitioned host, a launcher killed with SIGKILL) ends itself: every process runs under
    the guard of :mod:`mxlarge.launcher.probe`, whose lease the launcher writes to the stdin of
    each ``ssh``, ``mpirun`` and ``srun`` it starts.

Command-line fixes (checked on real sshd/Open MPI/Slurm, ``tests/cluster``)
    * ``ssh`` runs with ``-tt``: sshd signals a command only through its terminal, so without
      one the remote workers and servers of a failed job would outlive their killed ``ssh``
      clients (a server whose worker died waits forever). With a pty, killing the client hangs
      the terminal up and the remote process group gets SIGHUP.
    * ``srun --share --exclusive=user`` (dmlc's step flags) is refused by Slurm >= 20.11
      (``unrecognized option '--share'``), and without ``--overlap`` the server step waits for
      the worker step to end, which never happens. Where srun knows ``--overlap``, the two
      flags become ``--overlap``: both steps run side by side in the allocation.
      ``--kill-on-bad-exit=1``: a task that dies ends its step (else srun waits on);
      ``--input=all``: the guards' lease reaches every task.
    * ``mpirun --stdin all``: the lease reaches every rank, not only rank 0; and, unless the
      user set ``OMPI_MCA_plm_rsh_agent``/``plm_rsh_args``, ``--mca plm_rsh_args`` with the
      ssh backend's keepalive: the ssh clients mpirun starts its remote daemons with escape
      the launcher's teardown (process groups of their own), and one talking to a cut-off host
      would otherwise stay after the job; with it, it gives up within ~10 s, mpirun exits and
      the launcher probes the hosts (``... exited with status 255; host h2 unreachable``).

Failure report
    :func:`cluster_run` returns an :class:`~mxlarge.launcher._supervise.Outcome` naming the
    role, kvstore rank and host of the
    first process that failed: for ssh from the process itself (one ssh client per process),
    for mpirun and srun from the report those tools print about the failed rank
    (``mpirun noticed that process rank R ... on node H``, ``srun: error: H: task R: ...``).

Environment forwarding
    ``ssh`` forwards only a handful of variables (not PYTHONPATH), ``mpirun`` only its ``-x``
    list. So the variables of :func:`forwarded_env` are put on the command line itself, as
    ``env K=V ... command``, which all three backends (and the local scheduler) run unchanged.
    Note that values on a command line are visible to ``ps`` on every host.

Backends: ``ssh``, ``mpi`` and ``slurm`` are supported. ``sge`` and ``yarn`` raise
:class:`NotImplementedError`: both are broken in the copy shipped with MXNet 1.9.1 beyond what a
compatibility shim can fix (see :data:`UNSUPPORTED`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from mxlarge.launcher._supervise import (
    Backend,
    Child,
    LineSink,
    Outcome,
    Supervisor,
    check_job,
    exit_code_for,
    failure_message,
    supervise,
    termination_signals,
)
from mxlarge.launcher.firewall import SCHEDULER_PORTS, Host, job_filter
from mxlarge.launcher.probe import guard_command, unreachable, unreachable_hosts
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.tuning import cluster_env
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV

SUPPORTED = ("ssh", "mpi", "slurm")

UNSUPPORTED: dict[str, str] = {
    "sge": (
        "dmlc_tracker's sge backend (MXNet 1.9.1) cannot run a parameter-server job: submit() "
        "reads args.logdir and args.vcores, which its option parser never defines "
        "(AttributeError before anything is submitted); it builds '-S /bin/bash-q QUEUE' for a "
        "non-default queue; and it never sets DMLC_ROLE, so no array task could tell whether "
        "it is a server or a worker. On an SGE cluster, request the nodes as a parallel job "
        "and use the 'ssh' or 'mpi' launcher from inside it (see docs/launching.md)."
    ),
    "yarn": (
        "dmlc_tracker's yarn backend (MXNet 1.9.1) cannot run: dmlc-yarn.jar and its build "
        "script are not shipped in the mxnet wheel, and the container bootstrap "
        "dmlc_tracker/launcher.py is neither executable nor runnable as a script (relative "
        "import), which is also how the scheduler is started."
    ),
}

# Forwarded to every process when set in the launcher's environment; ``env`` adds to this.
FORWARD_VARS = frozenset({
    "PYTHONPATH", "OMP_NUM_THREADS", "DMLC_INTERFACE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID",
})
FORWARD_PREFIXES = ("MLFLOW_", "MXNET_")
# Never forwarded automatically: they would appear in process listings on every host.
_SECRET_WORDS = ("PASSWORD", "TOKEN", "SECRET")

# Set by dmlc_tracker per process or by us; overriding them from ``env`` (which is applied after
# the tracker's own exports) would break the job.
OWNED_ENV = frozenset({
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
    "DMLC_NODE_HOST", "DMLC_RANK", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER", "MXLARGE_JOB_ID",
    HEARTBEAT_ENV,
})

_TOOLS = {"ssh": "ssh", "mpi": "mpirun", "slurm": "srun"}
_RESERVED_EXTRA = frozenset({"cluster", "num_workers", "num_servers", "host_file", "command"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_ROLE_IN_CMD = re.compile(r"\bDMLC_ROLE=(\w+)")
_SSH_TARGET = re.compile(r"^ssh .*?StrictHostKeyChecking=no (\S+) -p (\S+)")
_SRUN_DMLC_FLAGS = "srun --share --exclusive=user "
# ssh: the client gives up on a silent server after 3 x 3 s (a partitioned host; the probe then
# names it), instead of waiting for TCP's own timeout (minutes to hours).
_SSH_FLAGS = "ssh -tt -o ServerAliveInterval=3 -o ServerAliveCountMax=3 "
# mpirun forwards its stdin (the guards' lease) to rank 0 only unless told otherwise; the
# other ranks' stdin is /dev/null, an end of file that would end their guards at once.
_MPIRUN_FLAGS = "mpirun --stdin all "
# The ssh clients mpirun starts its remote daemons (orted) with sit in process groups of their
# own, out of the launcher's teardown: without a keepalive, one talking to a partitioned host
# outlives the job (measured: still there 28 s after its end, 75 s after the cut). Same
# keepalive as the ssh backend's; not added when the user chose mpirun's remote agent or its
# arguments.
_MPIRUN_SSH_KEEPALIVE = '--mca plm_rsh_args "-o ServerAliveInterval=3 -o ServerAliveCountMax=3" '
_MPIRUN_AGENT_VARS = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_rsh_agent")
# srun: a failed task ends its step; stdin (the lease) to every task (srun's default, stated)
_SRUN_FLAGS = "--kill-on-bad-exit=1 --input=all "
# What mpirun (Open MPI 4) and srun print about the rank that failed (a signal; an exit code).
# srun says what happened in strsignal(3)'s words ("Killed") or "Exited with exit code N".
_TOOL_REPORTS = {
    "mpi": (re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) "
                       r"exited on signal (?P<signal>\d+)"),
            re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]")),
    "slurm": (re.compile(r"srun: error: (?P<host>[^:\s]+): tasks? (?P<rank>\d+)[-,\d]*: "
                         r"(?P<what>.+?)\s*$"),),
}
_STRSIGNAL = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}
_SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")


# --------------------------------------------------------------------------- compatibility

_compat_lock = threading.Lock()
_compat_depth = 0
_compat_saved: dict[str, Any] = {}
_MISSING = object()


def _set_daemon(self: threading.Thread, daemonic: bool) -> None:
    self.daemon = daemonic


@contextlib.contextmanager
def tracker_compat() -> Iterator[None]:
    """Let dmlc_tracker 1.9.1 run on Python >= 3.9 while the block runs.

    Adds ``threading.Thread.isAlive`` (an alias of ``is_alive``) and replaces the deprecated
    ``setDaemon`` by a silent equivalent. Reentrant and thread-safe; the original class
    attributes are restored when the outermost block exits.
    """
    global _compat_depth
    with _compat_lock:
        if _compat_depth == 0:
            for name in ("isAlive", "setDaemon"):
                _compat_saved[name] = threading.Thread.__dict__.get(name, _MISSING)
            threading.Thread.isAlive = threading.Thread.is_alive  # type: ignore[attr-defined]
            threading.Thread.setDaemon = _set_daemon  # type: ignore[method-assign]
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

    Same logic (the address of this host's FQDN, or, if that is a 127.x address, the one of the
    interface that routes outward), minus the UDP socket dmlc's version never closes.
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

    dmlc's mpi and slurm backends call ``tracker.submit`` without ``hostIP``, so ``--host-ip``
    is silently ignored there and the scheduler address is always guessed.
    """
    original = tracker.submit

    def submit(nworker: int, nserver: int, fun_submit: Any, hostIP: str | None = "auto",
               pscmd: str | None = None) -> Any:
        if hostIP in (None, "auto", "ip"):
            hostIP = host_ip
        return original(nworker, nserver, fun_submit, hostIP=hostIP, pscmd=pscmd)

    tracker.submit = submit
    try:
        yield
    finally:
        tracker.submit = original


#: Held while a tracker picks its scheduler port and until the scheduler listens on it.
PORT_LOCK = Path(tempfile.gettempdir()) / f"mxlarge-{os.getuid()}-scheduler-port.lock"
#: Longest wait for a starting scheduler to listen (it imports MXNet first).
SCHEDULER_LISTEN_TIMEOUT = 60.0


def listening(port: int) -> bool:
    """Whether a TCP socket of this network namespace listens on ``port`` (any address), read
    from ``/proc/net/tcp{,6}`` (state 0A), so nothing races the scheduler for the port."""
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
    """Make ``tracker.PSTracker`` hold :data:`PORT_LOCK` from choosing its port until its
    scheduler listens there (or has ended, or :data:`SCHEDULER_LISTEN_TIMEOUT` passed)."""
    import fcntl

    original = tracker.PSTracker

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

    tracker.PSTracker = Claimed
    try:
        yield
    finally:
        tracker.PSTracker = original


# --------------------------------------------------------------------------- environment

def _auto_forward(name: str) -> bool:
    if not (name in FORWARD_VARS or name.startswith(FORWARD_PREFIXES)):
        return False
    return not any(word in name for word in _SECRET_WORDS)


def forwarded_env(env: Mapping[str, str] | None = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a cluster job's processes receive on top of what the backend sets.

    ``PYTHONPATH``, ``OMP_NUM_THREADS``, ``DMLC_INTERFACE``, ``MLFLOW_*`` and ``MXNET_*`` from
    ``environ`` (default: this process's environment), except names containing PASSWORD, TOKEN
    or SECRET, then ``env`` on top.

    Raises:
        ValueError: if ``env`` sets a variable the tracker owns or an invalid name.
    """
    environ = os.environ if environ is None else environ
    out = {k: v for k, v in environ.items() if _auto_forward(k)}
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(f"invalid environment variable name {key!r}")
        if key in OWNED_ENV:
            raise ValueError(f"env may not set {key}: dmlc_tracker/the launcher set it per "
                             f"process")
        out[key] = str(value)
    return out


def shell_word(word: str) -> str:
    """Quote ``word`` for a POSIX shell without using single quotes.

    dmlc's ssh backend wraps the whole remote command in single quotes, so our own quoting must
    use double quotes; the result parses the same in one shell layer (scheduler, mpirun, srun)
    and in two (the local shell, then the remote one behind ssh).
    """
    if _SHELL_SAFE.match(word):
        return word
    return '"' + re.sub(r'([\\"$`])', r"\\\1", word) + '"'


def render_command(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``env K=V ... command``, every word quoted with :func:`shell_word`."""
    words = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *command]
    return [shell_word(w) for w in words]


# --------------------------------------------------------------------------- hostfiles

@dataclass(frozen=True)
class HostEntry:
    """One host line: ``host``, ``host:port`` (ssh) / ``host:slots`` (MPICH), ``slots=N``."""

    host: str
    port: str | None
    slots: int | None


def read_hostfile(path: str, launcher: str) -> list[HostEntry]:
    """Parse a hostfile as the ``launcher`` backend will read it; ``#`` starts a comment.

    Raises:
        ValueError: if the file is missing, unreadable or malformed.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"hostfile {path} cannot be read: {e.strerror}") from e
    entries = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        host, _, after = tokens[0].partition(":")
        slots: int | None = None
        port: str | None = None
        try:
            for tok in tokens[1:]:
                key, _, value = tok.partition("=")
                if key == "slots":
                    slots = int(value)
            if after:
                if launcher == "mpi":
                    slots = int(after)
                else:
                    port = str(int(after))
        except ValueError as e:
            raise ValueError(f"hostfile {path}, line {lineno}: cannot parse {line!r}") from e
        if not host:
            raise ValueError(f"hostfile {path}, line {lineno}: no host in {line!r}")
        entries.append(HostEntry(host, port, slots))
    return entries


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_hosts(path: str | None, launcher: str, workers: int, servers: int) -> list[HostEntry]:
    """Validates a hostfile for ``launcher`` before anything starts.

    Raises:
        ValueError: naming the file and what is missing (file, hosts, slots, IP addresses).
    """
    if path is None:
        raise ValueError(f"the {launcher} launcher needs a hostfile (one host per line)")
    if not os.path.isfile(path):
        raise ValueError(f"hostfile {path} does not exist")
    entries = read_hostfile(path, launcher)
    if not entries:
        raise ValueError(f"hostfile {path} lists no hosts")
    if launcher == "ssh":
        # dmlc exports each line's host as DMLC_NODE_HOST, and ps-lite hands that to ZeroMQ's
        # bind, which takes addresses and interface names but does no DNS ("bind failed").
        named = [e.host for e in entries if not _is_ip(e.host)]
        if named:
            raise ValueError(
                f"hostfile {path}: the ssh launcher needs IP addresses, not names "
                f"({', '.join(sorted(set(named)))}): dmlc passes each host to ps-lite as "
                f"DMLC_NODE_HOST, the address it binds, and that bind does not resolve names")
        # dmlc places servers round-robin from the first line, then workers after them: with at
        # least as many lines as workers, each worker gets a line of its own.
        if len(entries) < workers:
            raise ValueError(
                f"hostfile {path} lists {len(entries)} host(s) but {workers} workers need at "
                f"least {workers} lines (repeat a line to put several workers on one host)")
    else:
        # Workers and servers are two separate mpirun calls over the same hostfile.
        capacity = sum(e.slots if e.slots is not None else 1 for e in entries)
        need = max(workers, servers)
        if capacity < need:
            raise ValueError(
                f"hostfile {path} provides {capacity} slot(s) on {len(entries)} host(s) but "
                f"{workers} workers and {servers} servers need {need} (add slots=N to a line "
                f"to run several processes on one host)")
    return entries


# --------------------------------------------------------------------------- supervision shim

class _SubprocessShim:
    """Stands in for the ``subprocess`` module inside dmlc_tracker modules during a submit."""

    def __init__(self, sup: Supervisor, launcher: str, srun_overlap: bool = False) -> None:
        self._sup = sup
        self._launcher = launcher
        self._srun_overlap = srun_overlap
        self._pid = os.getpid()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.hosts: dict[int, str] = {}  # child pid -> ssh target

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def check_call(self, args: Any, *, shell: bool = False, env: Mapping[str, str] | None = None,
                   executable: str | None = None, **kwargs: Any) -> int:
        if os.getpid() != self._pid or kwargs:
            # e.g. ssh's rsync running in a multiprocessing.Pool child: not ours to supervise.
            return subprocess.check_call(args, shell=shell, env=env, executable=executable,
                                         **kwargs)
        role, index, label = self._describe(args, env)
        if isinstance(args, str):
            args = self._fix_command(args)
        try:
            # every process runs under the guard (mxlarge.launcher.probe), the scheduler here
            # too (same command), and every guard needs its lease: through the ssh client's,
            # mpirun's or srun's stdin, which each forwards to its remote processes
            child = self._sup.spawn(role, index, args, env=env, shell=shell,
                                    executable=executable, label=label, lease=True)
        except RuntimeError:
            return 0  # teardown has begun; starting more would only be killed again
        target = _SSH_TARGET.match(args) if isinstance(args, str) else None
        if self._launcher == "ssh" and target:
            self.hosts[child.pid] = target.group(1)
        # Deliberately no CalledProcessError: in dmlc's daemon threads it would only print a
        # traceback. The supervisor has seen the exit and acts on it.
        child.wait_exit()
        return 0

    def _fix_command(self, command: str) -> str:
        """The ``-tt``, keepalive, ``--stdin all``, ``--overlap``, ``--kill-on-bad-exit`` and
        ``--input=all`` fixes of the module docstring."""
        if self._launcher == "ssh" and command.startswith("ssh "):
            return _SSH_FLAGS + command[len("ssh "):]
        if self._launcher == "mpi" and command.startswith("mpirun "):
            chosen = any(v in os.environ for v in _MPIRUN_AGENT_VARS)
            return (_MPIRUN_FLAGS + ("" if chosen else _MPIRUN_SSH_KEEPALIVE) +
                    command[len("mpirun "):])
        if self._launcher == "slurm":
            flags = "srun --overlap " if self._srun_overlap else _SRUN_DMLC_FLAGS
            return command.replace(_SRUN_DMLC_FLAGS, flags + _SRUN_FLAGS)
        return command

    def _describe(self, args: Any, env: Mapping[str, str] | None) -> tuple[str, int | None, str]:
        if env is not None and env.get("DMLC_ROLE") == "scheduler":
            return "scheduler", None, "scheduler"
        text = args if isinstance(args, str) else " ".join(map(str, args))
        m = _ROLE_IN_CMD.search(text)
        role = m.group(1) if m else "process"
        tool = _TOOLS[self._launcher]
        if self._launcher == "ssh":
            with self._lock:
                index = self._counts.get(role, 0)
                self._counts[role] = index + 1
            target = _SSH_TARGET.match(text)
            where = f" via ssh {target.group(1)}:{target.group(2)}" if target else " via ssh"
            # the launch index: the kvstore rank is not known before ps-lite assigns it
            return role, index, f"{role} (launch {index}){where}"
        return role, None, f"{role}s via {tool}"


@contextlib.contextmanager
def _patched_subprocess(modules: Sequence[ModuleType], shim: _SubprocessShim) -> Iterator[None]:
    saved = [(m, m.subprocess) for m in modules]
    try:
        for m in modules:
            m.subprocess = shim  # type: ignore[attr-defined]
        yield
    finally:
        for m, original in saved:
            m.subprocess = original  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- submission

# The shim patches module globals, so only one submission may run per process at a time.
_submit_lock = threading.Lock()


@dataclass(frozen=True)
class _Report:
    """What mpirun or srun said about the first rank that failed in its step."""

    rank: int
    host: str | None
    status: int | None  # Popen-style: -n for signal n


class _ReportSink(LineSink):
    """A :class:`LineSink` that also keeps the first failed rank/host mpirun or srun reports."""

    def __init__(self, output: IO[str] | Any, launcher: str) -> None:
        super().__init__(output)
        self._patterns = _TOOL_REPORTS.get(launcher, ())
        self.reports: dict[str, _Report] = {}  # label -> the first report in its output

    def emit(self, label: str, text: str) -> None:
        super().emit(label, text)
        if label in self.reports:
            return
        for pattern in self._patterns:
            m = pattern.search(text)
            if m:
                self.reports[label] = _Report(int(m.group("rank")), m.groupdict().get("host"),
                                              _reported_status(m.groupdict()))
                return


def _reported_status(fields: Mapping[str, str | None]) -> int | None:
    """mpirun's ``exited on signal 9``, srun's ``Killed`` / ``Exited with exit code 3``."""
    if fields.get("signal"):
        return -int(str(fields["signal"]))
    what = fields.get("what") or ""
    if what in _STRSIGNAL:
        return -_STRSIGNAL[what]
    m = _SRUN_EXIT.search(what)
    return int(m.group(1)) if m else None


def who(role: str, rank: int | None, launch: int | None, host: str | None) -> str:
    """``worker rank 1 on h2``; ``worker (launch 1) on h2`` while the kvstore rank is not known
    (the one number the launcher's lines, the tags and the watchdog use is the kvstore rank)."""
    name = (f"{role} rank {rank}" if rank is not None else
            f"{role} (launch {launch})" if launch is not None else role)
    return f"{name} on {host}" if host else name


def _status_words(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


def srun_has_overlap() -> bool:
    """Whether this ``srun`` has ``--overlap`` (Slurm >= 20.11)."""
    try:
        r = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--overlap" in r.stdout


def _slurm_nodes() -> list[str]:
    """The nodes of the current Slurm allocation, expanded by ``scontrol`` where possible."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return []
    try:
        r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return [nodelist]
    return r.stdout.split() if r.returncode == 0 and r.stdout.split() else [nodelist]


def cluster_submit(launcher: str, command: Sequence[str], *, workers: int, servers: int,
                   hostfile: str | None, env: Mapping[str, str] | None = None,
                   extra: Mapping[str, Any] | None = None, grace: float = 10.0,
                   output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 60.0,
                   stall_timeout: float | None = None, heartbeat_dir: str | None = None) -> int:
    """:func:`cluster_run` that returns only the exit code."""
    return cluster_run(launcher, command, workers=workers, servers=servers, hostfile=hostfile,
                       env=env, extra=extra, grace=grace, output=output,
                       shutdown_timeout=shutdown_timeout, stall_timeout=stall_timeout,
                       heartbeat_dir=heartbeat_dir).exit_code


def cluster_run(launcher: str, command: Sequence[str], *, workers: int, servers: int,
                hostfile: str | None, env: Mapping[str, str] | None = None,
                extra: Mapping[str, Any] | None = None, grace: float = 10.0,
                output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 60.0,
                stall_timeout: float | None = None,
                heartbeat_dir: str | None = None, tuning: bool = True,
                firewall: str = "off") -> Outcome:
    """Run ``command`` as a dist_sync job through dmlc_tracker's ``launcher`` backend.

    The scheduler runs on this host (that is how dmlc_tracker works), servers and workers where
    the backend puts them: ``ssh`` round-robin over the hostfile (servers first, one process
    per line), ``mpi`` with two ``mpirun --hostfile`` calls, ``slurm`` with two ``srun`` job
    steps inside the current allocation.

    Args:
        launcher: ``"ssh"``, ``"mpi"`` or ``"slurm"``.
        command: argv run for every role; it must exist at the same path on every host.
        workers: number of workers (>= 1).
        servers: number of servers (>= 1).
        hostfile: required for ssh and mpi (``IP`` or ``IP:port`` for ssh, which needs
            addresses, not names; ``host slots=N`` for mpi; ``#`` comments allowed); must be
            ``None`` for slurm.
        env: extra variables for every process, on top of :func:`forwarded_env` and
            ``PYTHONUNBUFFERED=1``; passed on the command line as ``env K=V ... command``.
        extra: overrides of dmlc_tracker options by their ``args`` attribute name, e.g.
            ``{"host_ip": "10.0.0.1"}`` (address the scheduler binds and workers dial; default:
            this host's primary address), ``{"sync_dst_dir": ...}`` (ssh rsync),
            ``{"slurm_worker_nodes": 4, "slurm_server_nodes": 4}``.
        grace: seconds between SIGTERM and SIGKILL during teardown.
        output: text stream for the processes' prefixed output.
        shutdown_timeout: seconds the remaining processes may take to exit after the scheduler.
        stall_timeout: the stall watchdog's timeout as for :func:`run_local` (``None`` the
            default rule, 0 off).
        heartbeat_dir: where workers write their heartbeats; it must be on a filesystem shared
            by every host and this one, or the watchdog never hears from remote workers and
            stays unarmed (default: ``.mxlarge-heartbeat/<job id>`` in the current directory,
            which the ssh backend also ``cd``s to on every host). Removed afterwards.
        tuning: add :mod:`mxlarge.launcher.tuning`'s settings (malloc, big-array bound) where
            ``env`` and this process's environment leave them unset.
        firewall: ``"auto"``, ``"on"`` or ``"off"``: the job's packet filter, which lets only
            the job's hosts reach its ports while it runs (:mod:`mxlarge.launcher.firewall`;
            ssh and mpi, as root on every host; ``auto`` installs it where it can; the front
            ends' default is ``auto``, a library call changes no host's rules unless asked).

    Returns:
        The :class:`~mxlarge.launcher._supervise.Outcome` (with the job's ``hosts``); its exit
        code is 0 if every process started here exited 0, else that of the first failure
        (128 + n for a signal n, 124 for a stall).

    Raises:
        ValueError: invalid arguments, hostfile missing/empty/too short.
        NotImplementedError: ``sge`` or ``yarn`` (see :data:`UNSUPPORTED`).
        FileNotFoundError: the backend's tool (ssh, mpirun, srun) is not on PATH.
        RuntimeError: dmlc_tracker itself failed, or another submission is running.
        FirewallError: ``firewall="on"`` and a host cannot take the filter; nothing started.
    """
    if launcher in UNSUPPORTED:
        raise NotImplementedError(UNSUPPORTED[launcher])
    if launcher == "local":
        raise ValueError("use mxlarge.launcher.run_local for local jobs")
    if launcher not in SUPPORTED:
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(SUPPORTED)}")
    command = check_job(command, workers, servers)
    if launcher == "slurm" and hostfile is not None:
        raise ValueError("the slurm launcher takes its nodes from the allocation; "
                         "pass hostfile=None")
    entries = None if launcher == "slurm" else check_hosts(hostfile, launcher, workers, servers)
    tool = _TOOLS[launcher]
    if shutil.which(tool) is None:
        raise FileNotFoundError(f"the {launcher} launcher needs {tool!r} on PATH")

    # Unbuffered by default so that lines arrive through ssh/mpirun/srun as they are printed.
    # No __pycache__ written into the (shared) checkout by the job's processes.
    job_env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **forwarded_env(env)}
    # ps-lite names its port (pslog); those lines are not shown unless the user asked for them
    ps_verbose = verbose_env({**os.environ, **job_env})
    job_env.update(ps_verbose)
    if tuning:
        job_env.update(cluster_env({**os.environ, **job_env}))
    job_env["MXLARGE_JOB_ID"] = uuid.uuid4().hex[:12]
    if stall_timeout is not None and stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 (0 disables), got {stall_timeout}")
    beats = None
    if stall_timeout != 0:
        beats = os.path.abspath(heartbeat_dir or os.path.join(
            ".mxlarge-heartbeat", job_env["MXLARGE_JOB_ID"]))
        job_env[HEARTBEAT_ENV] = beats
    # every process under the guard (mxlarge.launcher.probe); mpirun/srun report a signal
    # only if the guard dies of it (ssh's client turns any signal into 255 anyway)
    # (Open MPI 4.1's "--stdin all" gives ranks on mpirun's own host no byte: their lease
    # runs from the first one, and mpirun, here, ends them itself)
    words = render_command(guard_command(command, reraise=launcher != "ssh",
                                         from_first_byte=launcher == "mpi"), job_env)
    if launcher == "ssh":
        bad = next((w for w in words if "'" in w), None)
        if bad is not None:
            raise ValueError(f"the ssh backend wraps the remote command in single quotes; "
                             f"{bad!r} contains one")
        cwd = os.getcwd()
        if not _SHELL_SAFE.match(cwd) and not (extra or {}).get("sync_dst_dir"):
            raise ValueError(f"the ssh backend runs 'cd {cwd}' unquoted on each host; run from "
                             f"a directory whose path has no spaces or shell metacharacters")

    from dmlc_tracker import opts, tracker  # late: only cluster jobs need dmlc_tracker

    backend = importlib.import_module(f"dmlc_tracker.{launcher}")
    args = opts.get_opts(["--cluster", launcher, "--num-workers", str(workers),
                          "--num-servers", str(servers), "placeholder"])
    args.command = words
    for key, value in (extra or {}).items():
        if key in _RESERVED_EXTRA or not hasattr(args, key):
            raise ValueError(f"extra option {key!r} is not a dmlc_tracker option this function "
                             f"lets you set")
        setattr(args, key, value)

    if not args.host_ip:
        args.host_ip = guess_host_ip()
    elif not _is_ip(str(args.host_ip)):
        # The scheduler binds DMLC_PS_ROOT_URI itself: same no-DNS rule as the hostfile.
        raise ValueError(f"host_ip must be an IP address (the scheduler binds it), "
                         f"got {args.host_ip!r}")

    if not _submit_lock.acquire(blocking=False):
        raise RuntimeError("another cluster_submit is running in this process")
    try:
        with contextlib.ExitStack() as stack:
            if launcher == "ssh":
                assert entries is not None
                # dmlc's ssh backend does not know comments; give it a clean copy.
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mxlarge-hosts-"))
                args.host_file = os.path.join(tmp, "hosts")
                with open(args.host_file, "w", encoding="utf-8") as f:
                    f.writelines(f"{e.host}:{e.port}\n" if e.port else f"{e.host}\n"
                                 for e in entries)
            else:
                args.host_file = hostfile
            if beats is not None:
                os.makedirs(beats, exist_ok=True)
                if heartbeat_dir is None:  # ours: the parent goes too once no job uses it
                    stack.callback(_remove_if_empty, os.path.dirname(beats))
                stack.callback(shutil.rmtree, beats, True)
            hosts = _slurm_nodes() if launcher == "slurm" else [e.host for e in entries or ()]
            # Guards: here (the scheduler), then each other host once, as the backend reaches it.
            guarded = [Host(f"{args.host_ip} (here)")] + list({
                e.host: Host.ssh(e.host, e.port) for e in entries or ()
                if e.host != args.host_ip}.values())
            # every process on loopback (the tests' fake clusters): as local, nothing to filter
            loopback = all(_is_ip(h) and ipaddress.ip_address(h).is_loopback
                           for h in [args.host_ip, *hosts])
            stack.enter_context(job_filter(
                firewall, "local" if loopback else launcher, job_env["MXLARGE_JOB_ID"],
                guarded, SCHEDULER_PORTS, lambda line: LineSink(output).emit("launcher", line)))
            ports = {e.host: int(e.port) for e in entries or () if e.port}
            return _submit(backend, tracker, args, launcher, job_env["MXLARGE_JOB_ID"], grace,
                           output, shutdown_timeout, hosts, beats, stall_timeout,
                           bool(ps_verbose), ports)
    finally:
        _submit_lock.release()


def _remove_if_empty(directory: str) -> None:
    with contextlib.suppress(OSError):  # not empty: another job's heartbeats are there
        os.rmdir(directory)


def _submit(backend: ModuleType, tracker: ModuleType, args: Any, launcher: str, job_id: str,
            grace: float, output: IO[str] | Any, shutdown_timeout: float,
            hosts: list[str], beats: str | None, stall_timeout: float | None,
            hide_ps_verbose: bool, ports: Mapping[str, int]) -> Outcome:
    sink = _ReportSink(output, launcher)
    sup = Supervisor(output, sink=sink, hide_ps_verbose=hide_ps_verbose)
    # the hosts a stalled job probes (not this one: the launcher runs here)
    remote = {h: ports.get(h, 22) for h in hosts if h != args.host_ip}

    def probe() -> Mapping[str, str]:  # the watchdog's and the failure report's
        return unreachable_hosts(remote)

    watchdog = None if beats is None else Watchdog(
        beats, args.num_workers, stall_timeout, emit=lambda line: sup.sink.emit("launcher", line),
        probe=probe)
    shim = _SubprocessShim(sup, launcher, srun_overlap=launcher == "slurm" and srun_has_overlap())
    stop = threading.Event()
    received: list[int] = []
    errors: list[BaseException] = []

    def run_backend() -> None:
        try:
            backend.submit(args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)

    explain = _Explainer(launcher, args.host_ip, sup, sink, shim, watchdog, ports, probe)
    thread = threading.Thread(target=run_backend, name=f"dmlc-{launcher}-submit", daemon=True)
    sup.sink.emit("launcher", f"job {job_id}: scheduler here at {args.host_ip}, "
                              f"{args.num_servers} server(s), {args.num_workers} worker(s) via "
                              f"dmlc_tracker {launcher}")
    try:
        with tracker_compat(), _patched_subprocess([backend, tracker], shim), \
                scheduler_address(tracker, args.host_ip), claimed_scheduler_port(tracker), \
                termination_signals(stop, received):
            thread.start()
            outcome = supervise(sup, _backend(launcher, sup, thread, errors, stop, received,
                                              shutdown_timeout, explain), watchdog, stop,
                                received)
            if outcome.message:
                bad = outcome.exit_code != 0 and not stop.is_set()
                sup.sink.emit("launcher", f"{outcome.message}; stopping the job" if bad
                              else outcome.message)
            sup.teardown(grace)
            # With the scheduler gone, tracker.submit() returns within a poll interval.
            thread.join(timeout=grace + 10)
    finally:
        sup.close(grace)
    if outcome is _TRACKER_FAILED:
        err = errors[0]
        raise RuntimeError(f"dmlc_tracker {launcher}.submit failed: {err!r}") from err
    if launcher == "ssh":  # in hostfile order (dmlc's threads start the clients in any order)
        contacted = set(shim.hosts.values())
        hosts = [h for h in hosts if h in contacted]
    return dataclasses.replace(outcome, hosts=tuple(dict.fromkeys([args.host_ip, *hosts])))


# dmlc_tracker's submit() raised: no outcome, cluster_run raises (a marker, compared by identity)
_TRACKER_FAILED = Outcome(1, None, None, None, "")
_INTERRUPTED = frozenset(128 + s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def _failed(code: int, message: str, role: str, rank: int | None, launch: int | None,
            host: str | None, status: int | None, child: Child | None = None) -> Outcome:
    """The :class:`Outcome` blaming one process (``child``: the local process that carried it).

    128 + SIGINT/SIGTERM/SIGHUP, or the launcher itself failing first (``scancel``), is the
    launcher having been interrupted: no ``reason``, so not restarted.
    """
    interrupted = code in _INTERRUPTED or role == "launcher"
    return Outcome(code, role, rank, status, message, None if interrupted else "crashed",
                   failed_kvstore_rank=rank if role in ("server", "worker") else None,
                   failed_host=host, failed_output=tuple(child.tail) if child else (),
                   failed_launch=launch)


class _Explainer:
    """Names the process behind a failed local child (ssh client, mpirun, srun, scheduler):
    role, kvstore rank, host and what happened to it, in one line."""

    def __init__(self, launcher: str, host_ip: str, sup: Supervisor, sink: _ReportSink,
                 shim: _SubprocessShim, watchdog: Watchdog | None, ports: Mapping[str, int],
                 probe: Callable[[], Mapping[str, str]]) -> None:
        self.launcher, self.host_ip, self.sup, self.sink = launcher, host_ip, sup, sink
        self.shim, self.watchdog, self.ports, self.probe = shim, watchdog, ports, probe

    def _assigned(self) -> dict[str, tuple[str, int]]:
        """The scheduler's assignments, ``"ip:port" -> (role, kvstore rank)``."""
        return next((c.pslog.assigned for c in self.sup.children if c.role == "scheduler"), {})

    def _rank(self, child: Child, host: str | None, remote_pid: int | None) -> int | None:
        assigned = self._assigned()
        # ssh: one process per client, its own Bind line names its address (mpirun's and
        # srun's output holds the lines of every rank of the role)
        ssh = self.launcher == "ssh" and child.guard.pid is not None
        for address in child.pslog.bound if ssh else ():
            if address in assigned and assigned[address][0] == child.role:
                return assigned[address][1]
        if host is not None:  # mpirun/srun: the host they named, if one rank of the role is there
            with contextlib.suppress(OSError):
                ip = socket.gethostbyname(host)
                ranks = {r for a, (role, r) in assigned.items()
                         if role == child.role and a.rsplit(":", 1)[0] == ip}
                if len(ranks) == 1:
                    return ranks.pop()
        if self.watchdog is not None and child.role == "worker":
            self.watchdog.read(force=True)
            records = [s.record for s in self.watchdog.seen.values()
                       if (remote_pid is None or s.record.pid == remote_pid)
                       and host in (s.record.host, _address(s.record.host))]
            if len(records) == 1:
                return records[0].rank
        return None

    def __call__(self, child: Child) -> Outcome:
        assert child.status is not None
        if child.role == "scheduler" or child.role not in ("server", "worker"):
            scheduler = child.role == "scheduler"
            return _failed(exit_code_for(child.status), failure_message(child), child.role,
                           0 if scheduler else None, child.index,
                           self.host_ip if scheduler else None, child.status, child)
        child.join_pump(timeout=1.0)  # the guard's/tool's last lines name what happened
        if self.launcher == "ssh":
            return self._ssh(child)
        report = self.sink.reports.get(child.label)
        if report is None:
            # no rank reported: mpirun lost a daemon (its ssh's keepalive gave up on a host),
            # srun a node; the probe tells whether a host is cut off, as for ssh's 255
            cut = self.probe()
            line = failure_message(child) + "".join(
                f"; host {h} unreachable ({why})" for h, why in sorted(cut.items()))
            host = next(iter(cut)) if len(cut) == 1 else None
            return _failed(exit_code_for(child.status), line, child.role, None, None, host,
                           child.status, child)
        rank = self._rank(child, report.host, None)
        status = report.status if report.status is not None else child.status
        what = who(child.role, rank, report.rank, report.host)
        task = "task" if self.launcher == "slurm" else "mpi rank"
        line = f"{what} ({child.label}, {task} {report.rank}) {_status_words(status)}"
        code = 128 - status if status < 0 else exit_code_for(child.status)
        return _failed(code, line, child.role, rank, report.rank, report.host, status, child)

    def _ssh(self, child: Child) -> Outcome:
        assert child.status is not None
        host = self.shim.hosts.get(child.pid)
        rank = self._rank(child, host, child.guard.pid)
        what = who(child.role, rank, child.index, host)

        def failed(code: int, line: str, status: int) -> Outcome:
            return _failed(code, line, child.role, rank, child.index, host, status, child)

        if child.guard.signal is not None:
            status = -child.guard.signal
            line = f"{what} {_status_words(status)}"
            cause = child.pslog.cause()
            line = line if cause is None else f"{line}: {cause}"
            return failed(128 + child.guard.signal, line, status)
        if child.status != 255:  # the guard passed the command's own status on
            return failed(exit_code_for(child.status), f"{what} {_status_words(child.status)}",
                          child.status)
        why = None if host is None else unreachable(host, self.ports.get(host, 22))
        if why is not None:
            return failed(255, f"{what}: host {host} unreachable ({why}); ssh lost it "
                               f"(status 255)", 255)
        if child.guard.pid is None:
            return failed(255, f"{what}: ssh exited with status 255 before the command "
                               f"started (ssh could not connect?)", 255)
        return failed(255, f"{what}: ssh exited with status 255 while the command ran and the "
                           f"host answers (the connection broke)", 255)


def _address(host: str) -> str | None:
    with contextlib.suppress(OSError):
        return socket.gethostbyname(host)
    return None


# A Slurm cancellation (scancel, a SIGTERM to salloc) ends the job steps and signals the
# launcher at about the same time; a failed step waits this long for that signal, so the
# termination, not the step it ended, is named.
_TERMINATION_WAIT = 1.0


def _backend(launcher: str, sup: Supervisor, thread: threading.Thread,
             errors: list[BaseException], stop: threading.Event, received: list[int],
             shutdown_timeout: float, explain: _Explainer) -> Backend:
    """What the supervision loop needs to know of a job dmlc_tracker runs in ``thread``."""

    def explain_failure(child: Child) -> Outcome:
        if launcher == "slurm":
            if stop.wait(_TERMINATION_WAIT):
                return _terminated(received[0] if received else signal.SIGTERM,
                                   explain.host_ip)
            ending = _allocation_ending()
            if ending is not None:
                return _failed(128 + signal.SIGTERM, f"{ending}; job torn down", "launcher", 0,
                               None, explain.host_ip, -signal.SIGTERM)
        return explain(child)

    def ended(seconds: float) -> Outcome | None:
        if errors:
            return _TRACKER_FAILED
        if not sup.children:
            return Outcome(1, None, None, None, "dmlc_tracker started no process")
        if sup.all_exited():
            return Outcome(0, None, None, None,
                           f"job finished: all {len(sup.children)} processes exited 0")
        if seconds > shutdown_timeout:
            hung = ", ".join(c.label for c in sup.children if c.status is None)
            return Outcome(1, None, None, None, f"{hung} still running "
                           f"{shutdown_timeout:g} s after the scheduler exited")
        return None

    return Backend(explain_failure, lambda sig: _terminated(sig, explain.host_ip),
                   lambda: not thread.is_alive(), ended)


def _allocation_ending() -> str | None:
    """Why this Slurm allocation is ending (``scancel``, a SIGTERM to ``salloc`` revoking it),
    or ``None`` while it runs: then a failed step failed on its own (``--kill-on-bad-exit``
    ends only the step)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = r.stdout.strip()
    if r.returncode == 0 and state == "RUNNING":
        return None
    return (f"Slurm ended the allocation (job {job} {state or 'gone'}): the job was cancelled "
            "or its allocation revoked")


def _terminated(sig: int, host_ip: str) -> Outcome:
    return _failed(128 + sig, f"launcher received {signal.Signals(sig).name}; job torn down",
                   "launcher", 0, None, host_ip, -sig)
