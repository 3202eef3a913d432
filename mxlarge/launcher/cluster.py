"""Run a dist_sync job through dmlc_tracker (shipped in the mxnet wheel): what the ssh, mpi and
slurm backends (:mod:`mxlarge.launcher.backends`) share.

We do not write our own cluster launcher: :func:`dmlc_run` builds the ``args`` namespace that
``mxnet/tools/launch.py`` would build and calls dmlc's own ``submit(args)``. dmlc starts every
process with ``subprocess.check_call`` in daemon threads and never looks at the result (a failed
worker leaves the scheduler waiting forever), so during a submission the ``subprocess`` name in
its modules is a shim (:class:`_SubprocessShim`) that starts each command in a process group of
its own under the :class:`~mxlarge.launcher._supervise.Supervisor`, with the backend's fixes
applied to the command line; the one supervision loop then ends the job at the first failure,
and every process runs under the guard (:mod:`mxlarge.launcher.guard`), whose lease ends it when
the launcher or its link is gone.

What differs between backends (the hostfile's reading, the command-line fixes, the guard's
flags, which hosts the job used, how a failed ssh client, mpirun or srun is traced back to the
process behind it) is each backend's class; this module asks it and never looks at its name.
The history and measurements behind the fixes are in ``docs/design/launcher.md``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any, ClassVar

from mxlarge.launcher._supervise import (
    Backend,
    Child,
    LineSink,
    Supervisor,
    check_job,
    exit_code_for,
    failure_message,
    supervise,
    termination_signals,
)
from mxlarge.launcher.backends.base import LaunchBackend, Spec
from mxlarge.launcher.dmlc_compat import (
    guess_host_ip,
    patched_subprocess,
    scheduler_address,
    tracker_compat,
)
from mxlarge.launcher.environment import forwarded_env, render_command
from mxlarge.launcher.explain import FailureContext, ReportSink, blame, terminated
from mxlarge.launcher.firewall import SCHEDULER_PORTS, Host, job_filter
from mxlarge.launcher.guard import guard_command
from mxlarge.launcher.hostfile import HostEntry, Layout, is_ip, is_loopback, layout_of, place
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.preflight import check_hosts
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.reach import unreachable_hosts
from mxlarge.launcher.scheduler_port import claimed_scheduler_port
from mxlarge.launcher.tuning import cluster_env
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV

# dmlc_tracker's submit() raised: no outcome, cluster_run raises (a marker, compared by identity)
_TRACKER_FAILED = Outcome(1, "")
#: The teardown's grace (SIGTERM to SIGKILL) once a host was found cut off: a tool client
#: (ssh, mpirun, srun) may wait on that host, which cannot answer; the job is to end within the
#: stall timeout + 10 s of the cut (tests/cluster/test_partition.py).
CUT_GRACE = 2.0
_RESERVED_EXTRA = frozenset({"cluster", "num_workers", "num_servers", "host_file", "command"})
_ROLE_IN_CMD = re.compile(r"\bDMLC_ROLE=(\w+)")



class DmlcBackend(LaunchBackend):
    """A backend that runs its jobs through dmlc_tracker's module of the same :attr:`name`.

    The front ends ask :meth:`preflight` before anything starts (the hosts answer).
    :func:`dmlc_run` asks it, in this order: :meth:`check_hosts` (before anything starts),
    :meth:`guard_flags` and :meth:`check_words` (the command every process runs),
    :meth:`dmlc_hostfile` and :meth:`hosts` (what dmlc reads, where the job runs),
    :meth:`prepare`; while dmlc submits, for each command it starts, :meth:`describe`,
    :meth:`fix_command` and :meth:`target_host`; at the first failure :meth:`before_explain`
    and :meth:`explain`; at the end :meth:`used_hosts`. The defaults here are the common case.
    """

    #: the tool dmlc's backend starts (``ssh``, ``mpirun``, ``srun``): it must be on PATH
    tool: ClassVar[str]
    #: what the tool prints about the rank that failed (named groups ``rank``, ``host`` and
    #: ``signal`` or ``what``): :class:`ReportSink` keeps the first match per child
    report_patterns: ClassVar[tuple[re.Pattern[str], ...]] = ()

    def check_spec(self, spec: Spec) -> None:
        if spec.port is not None:
            raise ValueError("--port is for the local launcher (dmlc_tracker picks the "
                             "scheduler port)")

    def run(self, spec: Spec, output: IO[str] | Any = None) -> Outcome:
        extra: dict[str, Any] = {"host_ip": spec.host_ip} if spec.host_ip else {}
        where = {} if output is None else {"output": output}
        return dmlc_run(self, spec.argv, workers=spec.world.processes, servers=spec.servers,
                        hostfile=spec.hostfile, env=spec.env, extra=extra, grace=spec.grace,
                        stall_timeout=spec.stall_timeout, tuning=spec.tuning,
                        firewall=spec.firewall, server_hosts=spec.server_hosts, **where)

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """Where the job's processes go (the launcher's layout line); the default:
        dmlc's ssh placement over the lines it reads (:func:`~mxlarge.launcher.hostfile.place`)."""
        return layout_of(scheduler, *place(entries or [], servers, workers))

    def preflight(self, spec: Spec) -> None:
        """Every host answers, is the host its name says and takes ``--firewall on``'s filter
        (:func:`mxlarge.launcher.preflight.check_hosts`, ``HostCheckError``)."""
        entries = self.check_hosts(spec.hostfile, spec.world.processes, spec.servers,
                                   spec.server_hosts)
        ports = {e.host: int(e.port) if e.port else 22 for e in entries or ()}
        check_hosts(ports, f"hostfile {spec.hostfile}", firewall=spec.firewall,
                    host_ip=spec.host_ip, ssh=self.probes_with_ssh())

    def probes_with_ssh(self) -> bool:
        """Whether the backend reaches its hosts with ``ssh`` (the pre-flight's probe)."""
        return True

    def guard_flags(self) -> dict[str, bool]:
        """:func:`~mxlarge.launcher.guard.guard_command`'s ``reraise`` and
        ``from_first_byte`` for this backend's processes."""
        return {}

    def check_words(self, words: Sequence[str], extra: Mapping[str, Any]) -> None:
        """Refuse a command dmlc's backend would mangle (``ValueError``)."""

    def dmlc_hostfile(self, hostfile: str | None, entries: list[HostEntry] | None,
                      stack: contextlib.ExitStack) -> str | None:
        """The hostfile dmlc reads (a temporary one goes on ``stack``)."""
        return hostfile

    def hosts(self, entries: list[HostEntry] | None) -> list[str]:
        """The hosts the job may run on, in order."""
        return [e.host for e in entries or ()]

    def prepare(self) -> None:
        """Ask the cluster what the command-line fixes depend on (once per job)."""

    def describe(self, role: str, number: int, command: str) -> tuple[str, int | None, str]:
        """``(role, launch index or None, label)`` of the ``number``-th command of ``role``
        dmlc starts; the default: one tool process for all processes of a role."""
        return role, None, f"{role}s via {self.tool}"

    def fix_command(self, command: str) -> str:
        """The command line dmlc built, with this backend's fixes."""
        return command

    def target_host(self, command: str) -> str | None:
        """The one host ``command`` runs its process on, if it names one (ssh)."""
        return None

    def before_explain(self, context: FailureContext) -> Outcome | None:
        """An outcome that takes precedence over any failed child (Slurm ending the
        allocation), else ``None``."""
        return None

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        """The outcome naming the server or worker behind the failed ``child``."""
        raise NotImplementedError

    def used_hosts(self, hosts: list[str], contacted: set[str]) -> list[str]:
        """The job's hosts for its outcome, from :meth:`hosts` and the hosts commands were
        sent to (:meth:`target_host`)."""
        return hosts


# --------------------------------------------------------------------------- supervision shim

class _SubprocessShim:
    """Stands in for the ``subprocess`` module inside dmlc_tracker modules during a submit."""

    def __init__(self, sup: Supervisor, backend: DmlcBackend) -> None:
        self._sup = sup
        self._backend = backend
        self._pid = os.getpid()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.hosts: dict[int, str] = {}  # child pid -> the host its command runs on (ssh)

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
            args = self._backend.fix_command(args)
        try:
            # every process runs under the guard (mxlarge.launcher.guard), the scheduler here
            # too (same command), and every guard needs its lease: through the ssh client's,
            # mpirun's or srun's stdin, which each forwards to its remote processes
            child = self._sup.spawn(role, index, args, env=env, shell=shell,
                                    executable=executable, label=label, lease=True)
        except RuntimeError:
            return 0  # teardown has begun; starting more would only be killed again
        host = self._backend.target_host(args) if isinstance(args, str) else None
        if host is not None:
            self.hosts[child.pid] = host
        # Deliberately no CalledProcessError: in dmlc's daemon threads it would only print a
        # traceback. The supervisor has seen the exit and acts on it.
        child.wait_exit()
        return 0

    def _describe(self, args: Any, env: Mapping[str, str] | None) -> tuple[str, int | None, str]:
        if env is not None and env.get("DMLC_ROLE") == "scheduler":
            return "scheduler", None, "scheduler"
        text = args if isinstance(args, str) else " ".join(map(str, args))
        m = _ROLE_IN_CMD.search(text)
        role = m.group(1) if m else "process"
        with self._lock:
            number = self._counts.get(role, 0)
            self._counts[role] = number + 1
        return self._backend.describe(role, number, text)


def explain_failure(backend: DmlcBackend, context: FailureContext, child: Child) -> Outcome:
    """The outcome of the first failed local child: what the backend says first
    (:meth:`DmlcBackend.before_explain`), the scheduler's (or another child's) own exit, or the
    server or worker behind it (:meth:`DmlcBackend.explain`)."""
    assert child.status is not None
    early = backend.before_explain(context)
    if early is not None:
        return early
    if child.role not in ("server", "worker"):
        scheduler = child.role == "scheduler"
        return blame(exit_code_for(child.status), failure_message(child), child.role, None,
                     child.index, context.host_ip if scheduler else None, child.status, child,
                     pid=child.guard.pid if scheduler else None)
    child.join_pump(timeout=1.0)  # the guard's/tool's last lines name what happened
    return backend.explain(context, child)


# --------------------------------------------------------------------------- submission

# The shim patches module globals, so only one submission may run per process at a time.
_submit_lock = threading.Lock()


def dmlc_run(backend: DmlcBackend, command: Sequence[str], *, workers: int, servers: int,
             hostfile: str | None, env: Mapping[str, str] | None = None,
             extra: Mapping[str, Any] | None = None, grace: float = 10.0,
             output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 60.0,
             stall_timeout: float | None = None, heartbeat_dir: str | None = None,
             tuning: bool = True, firewall: str = "off",
             server_hosts: Sequence[str] = ()) -> Outcome:
    """:func:`mxlarge.launcher.backends.cluster_run` on ``backend`` (its arguments and
    errors)."""
    command = check_job(command, workers, servers)
    entries = backend.check_hosts(hostfile, workers, servers, server_hosts)
    if shutil.which(backend.tool) is None:
        raise FileNotFoundError(f"the {backend.name} launcher needs {backend.tool!r} on PATH")

    # Unbuffered by default so that lines arrive through ssh/mpirun/srun as they are printed.
    # No __pycache__ written into the (shared) checkout by the job's processes.
    job_env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **forwarded_env(env)}
    # ps-lite names its port (pslog); those lines are not shown unless the user asked for them
    ps_verbose = verbose_env({**os.environ, **job_env})
    job_env.update(ps_verbose)
    if tuning:
        job_env.update(cluster_env({**os.environ, **job_env}))
    job_env["MXLARGE_JOB_ID"] = uuid.uuid4().hex[:12]
    if server_hosts or any(e.server for e in entries or ()):
        job_env["MXLARGE_SERVER_HOSTS"] = "1"  # the exchange's order (mxlarge.kvstore.order)
    if stall_timeout is not None and stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 (0 disables), got {stall_timeout}")
    beats = None
    if stall_timeout != 0:
        beats = os.path.abspath(heartbeat_dir or os.path.join(
            ".mxlarge-heartbeat", job_env["MXLARGE_JOB_ID"]))
        job_env[HEARTBEAT_ENV] = beats
    # every process under the guard (mxlarge.launcher.guard), with the backend's flags
    words = render_command(guard_command(command, **backend.guard_flags()), job_env)
    backend.check_words(words, extra or {})

    from dmlc_tracker import opts, tracker  # late: only cluster jobs need dmlc_tracker

    module = importlib.import_module(f"dmlc_tracker.{backend.name}")
    args = opts.get_opts(["--cluster", backend.name, "--num-workers", str(workers),
                          "--num-servers", str(servers), "placeholder"])
    args.command = words
    for key, value in (extra or {}).items():
        if key in _RESERVED_EXTRA or not hasattr(args, key):
            raise ValueError(f"extra option {key!r} is not a dmlc_tracker option this function "
                             f"lets you set")
        setattr(args, key, value)

    if not args.host_ip:
        args.host_ip = guess_host_ip()
    elif not is_ip(str(args.host_ip)):
        # The scheduler binds DMLC_PS_ROOT_URI itself: same no-DNS rule as the hostfile.
        raise ValueError(f"host_ip must be an IP address (the scheduler binds it), "
                         f"got {args.host_ip!r}")

    if not _submit_lock.acquire(blocking=False):
        raise RuntimeError("another cluster_submit is running in this process")
    try:
        with contextlib.ExitStack() as stack:
            args.host_file = backend.dmlc_hostfile(hostfile, entries, stack)
            if beats is not None:
                os.makedirs(beats, exist_ok=True)
                if heartbeat_dir is None:  # ours: the parent goes too once no job uses it
                    stack.callback(_remove_if_empty, os.path.dirname(beats))
                stack.callback(shutil.rmtree, beats, True)
            hosts = backend.hosts(entries)
            # Guards: here (the scheduler), then each other host once, as the backend reaches it.
            guarded = [Host(f"{args.host_ip} (here)")] + list({
                e.host: Host.ssh(e.host, e.port) for e in entries or ()
                if e.host != args.host_ip}.values())
            # every process on loopback (the tests' fake clusters): as local, nothing to filter
            loopback = all(is_loopback(h) for h in [args.host_ip, *hosts])
            cut: dict[str, str] = {}  # hosts found not answering during the job, and why
            stack.enter_context(job_filter(
                firewall, backend.firewall_refusal(), job_env["MXLARGE_JOB_ID"], guarded,
                SCHEDULER_PORTS, lambda line: LineSink(output).emit("launcher", line),
                loopback=loopback, cut=cut))
            ports = {e.host: int(e.port) for e in entries or () if e.port}
            layout = backend.layout(entries, servers, workers, args.host_ip)
            return _submit(backend, module, tracker, args, job_env["MXLARGE_JOB_ID"], grace,
                           output, shutdown_timeout, hosts, beats, stall_timeout,
                           bool(ps_verbose), ports, layout, cut)
    finally:
        _submit_lock.release()


def _remove_if_empty(directory: str) -> None:
    with contextlib.suppress(OSError):  # not empty: another job's heartbeats are there
        os.rmdir(directory)


def _submit(backend: DmlcBackend, module: Any, tracker: Any, args: Any, job_id: str,
            grace: float, output: IO[str] | Any, shutdown_timeout: float,
            hosts: list[str], beats: str | None, stall_timeout: float | None,
            hide_ps_verbose: bool, ports: Mapping[str, int], layout: Layout,
            cut: dict[str, str]) -> Outcome:
    sink = ReportSink(output, backend.report_patterns)
    sup = Supervisor(output, sink=sink, hide_ps_verbose=hide_ps_verbose)
    # the hosts a stalled job probes (not this one: the launcher runs here)
    remote = {h: ports.get(h, 22) for h in hosts if h != args.host_ip}

    def probe() -> Mapping[str, str]:  # the watchdog's and the failure report's
        found = unreachable_hosts(remote)
        cut.update(found)
        return found

    watchdog = None if beats is None else Watchdog(
        beats, args.num_workers, stall_timeout, emit=lambda line: sup.sink.emit("launcher", line),
        probe=probe, stopped=lambda: [s for c in list(sup.children)
                                      for s in list(c.guard.stopped.values())])
    backend.prepare()
    shim = _SubprocessShim(sup, backend)
    stop = threading.Event()
    received: list[int] = []
    errors: list[BaseException] = []

    def run_backend() -> None:
        try:
            module.submit(args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)

    context = FailureContext(args.host_ip, sup, sink, shim.hosts, watchdog, ports, probe, stop,
                             received, cut)
    thread = threading.Thread(target=run_backend, name=f"dmlc-{backend.name}-submit",
                              daemon=True)
    sup.sink.emit("launcher", f"job {job_id}: scheduler here at {args.host_ip}, "
                              f"{args.num_servers} server(s), {args.num_workers} worker(s) via "
                              f"dmlc_tracker {backend.name}")
    sup.sink.emit("launcher", layout.describe())
    try:
        with tracker_compat(), patched_subprocess([module, tracker], shim), \
                scheduler_address(tracker, args.host_ip), claimed_scheduler_port(tracker), \
                termination_signals(stop, received):
            thread.start()
            outcome = supervise(sup, _loop_backend(backend, context, thread, errors,
                                                   shutdown_timeout), watchdog, stop, received)
            if outcome.message:
                bad = outcome.exit_code != 0 and not stop.is_set()
                sup.sink.emit("launcher", f"{outcome.message}; stopping the job" if bad
                              else outcome.message)
            # A tool client (ssh, mpirun, srun) waits on a cut-off host that cannot answer;
            # every guard behind it ends its command when the client's lease stops.
            sup.teardown(min(grace, CUT_GRACE) if cut else grace)
            # With the scheduler gone, tracker.submit() returns within a poll interval.
            thread.join(timeout=grace + 10)
    finally:
        sup.close(grace)
    if outcome is _TRACKER_FAILED:
        err = errors[0]
        raise RuntimeError(f"dmlc_tracker {backend.name}.submit failed: {err!r}") from err
    used = backend.used_hosts(hosts, set(shim.hosts.values()))
    return dataclasses.replace(outcome, hosts=tuple(dict.fromkeys([args.host_ip, *used])))


def _loop_backend(backend: DmlcBackend, context: FailureContext, thread: threading.Thread,
                  errors: list[BaseException], shutdown_timeout: float) -> Backend:
    """What the supervision loop needs to know of a job dmlc_tracker runs in ``thread``."""
    sup = context.sup

    def ended(seconds: float) -> Outcome | None:
        if errors:
            return _TRACKER_FAILED
        if not sup.children:
            return Outcome(1, "dmlc_tracker started no process")
        if sup.all_exited():
            return Outcome(0, f"job finished: all {len(sup.children)} processes exited 0")
        if seconds > shutdown_timeout:
            hung = ", ".join(c.label for c in sup.children if c.status is None)
            return Outcome(1, f"{hung} still running {shutdown_timeout:g} s after the "
                              "scheduler exited")
        return None

    return Backend(lambda child: explain_failure(backend, context, child),
                   lambda sig: terminated(sig, context.host_ip),
                   lambda: not thread.is_alive(), ended)
