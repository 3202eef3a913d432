"""What the ssh, mpi and slurm backends share: a job run through dmlc_tracker (shipped
in the mxnet wheel) under the launcher's supervision (:class:`DmlcBackend`, whose
:meth:`~DmlcBackend.run` calls the backend's hooks in their order).

We do not write our own cluster launcher: :meth:`DmlcBackend.run` builds the ``args``
namespace that ``mxnet/tools/launch.py`` would build and calls dmlc's own
``submit(args)``, with the ``subprocess`` name in dmlc's modules a shim
(:class:`_SubprocessShim`) that starts each command under the
:class:`~mxlarge.launcher.supervisor.Supervisor` and the guard
(:mod:`mxlarge.launcher.guard`); the one supervision loop then ends the job at the first
failure (:class:`DmlcRun`).

What differs between backends is each backend's class; this module asks it and never
looks at its name. Why, and what each fix is for: ``docs/design/launcher.md``.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, ClassVar

from mxlarge.launcher import supervisor
from mxlarge.launcher.backends.base import LaunchBackend, Spec
from mxlarge.launcher.backends.dmlc_job import (
    Launched,
    Submission,
    Tool,
    dmlc_args,
    job_dirs,
    job_env,
    remove_if_empty,
)
from mxlarge.launcher.child import Child, LineSink, exit_code_for, failure_message
from mxlarge.launcher.dmlc_compat import patched_subprocess, scheduler_address, tracker_compat
from mxlarge.launcher.environment import render_command
from mxlarge.launcher.explain import FailureContext, ReportSink, blame, terminated
from mxlarge.launcher.firewall import SCHEDULER_PORTS, Host, job_filter
from mxlarge.launcher.guard import guard_command
from mxlarge.launcher.hostfile import HostEntry, Layout, is_loopback, layout_of, place
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.preflight import check_hosts
from mxlarge.launcher.reach import unreachable_hosts
from mxlarge.launcher.reports import Drawn, WorkerReports
from mxlarge.launcher.scheduler_port import claimed_scheduler_port
from mxlarge.launcher.watchdog import Watchdog

#: Seconds the remaining processes may take to exit after the scheduler (a spec's
#: default).
SHUTDOWN_TIMEOUT = 60.0
#: The teardown's grace (SIGTERM to SIGKILL) once a host was found cut off: a tool
#: client (ssh, mpirun, srun) may wait on that host, which cannot answer; the job is to
#: end within the stall timeout + 10 s of the cut (tests/cluster/test_partition.py).
CUT_GRACE = 2.0
# dmlc_tracker's submit() raised: no outcome, run raises (a marker, compared by
# identity)
_TRACKER_FAILED = Outcome(1, "")
_ROLE_IN_CMD = re.compile(r"\bDMLC_ROLE=(\w+)")
# The shim patches module globals, so only one submission may run per process at a time.
_submit_lock = threading.Lock()


class DmlcBackend(LaunchBackend):
    """A backend that runs its jobs through dmlc_tracker's module of the same
    :attr:`name`.

    :meth:`run` is the template: it calls the hooks below in their order. The defaults
    are the common case.
    """

    tool: ClassVar[Tool]
    shutdown_timeout = SHUTDOWN_TIMEOUT

    def check_spec(self, spec: Spec) -> None:
        if spec.port is not None:
            raise ValueError("--port is for the local launcher (dmlc_tracker picks the "
                             "scheduler port)")

    def preflight(self, spec: Spec) -> None:
        """Every host answers, is the host its name says and takes ``--firewall on``'s
        filter (:func:`mxlarge.launcher.preflight.check_hosts`, ``HostCheckError``)."""
        entries = self.check_hosts(spec.hostfile, spec.world.processes, spec.servers,
                                   spec.server_hosts)
        ports = {e.host: int(e.port) if e.port else 22 for e in entries or ()}
        check_hosts(ports, f"hostfile {spec.hostfile}", firewall=spec.firewall,
                    host_ip=spec.host_ip, ssh=self.probes_with_ssh())

    def run(self, spec: Spec, output: IO[str] | Any = None, drawn: Drawn | None = None
            ) -> Outcome:
        """Runs ``spec`` through dmlc_tracker, supervised until it ends: the scheduler
        here, servers and workers where the backend puts them; ``drawn`` gets every rank's
        parts while it runs (:class:`~mxlarge.launcher.reports.WorkerReports`). The hooks, in
        order: :meth:`check_hosts` and :meth:`check_words` (before anything starts),
        :meth:`prepare` (what dmlc reads, where the job runs), :meth:`layout`; while
        dmlc submits, for each command it starts, :meth:`describe` and
        :meth:`fix_command`; at the first failure :meth:`before_explain` and
        :meth:`explain`; at the end :meth:`used_hosts`.

        Raises:
            ValueError: invalid arguments, hostfile missing/empty/too short.
            FileNotFoundError: the backend's tool (ssh, mpirun, srun) is not on PATH.
            RuntimeError: dmlc_tracker itself failed, or another submission is running.
            FirewallError: ``firewall="on"`` and a host cannot take the filter; nothing started.
        """
        workers = spec.world.processes
        servers = spec.servers
        command = supervisor.check_job(spec.argv, workers, servers)
        entries = self.check_hosts(spec.hostfile, workers, servers, spec.server_hosts)
        if shutil.which(self.tool.command) is None:
            raise FileNotFoundError(f"the {self.name} launcher needs {self.tool.command!r} on "
                                    "PATH")
        env, hide_ps_verbose = job_env(spec, entries)
        beats, reports = job_dirs(spec, env)
        words = render_command(guard_command(command, reraise=self.tool.reraise,
                                             from_first_byte=self.tool.from_first_byte), env)
        self.check_words(words)
        args = dmlc_args(self.name, spec, words)
        if not _submit_lock.acquire(blocking=False):
            raise RuntimeError("another cluster submission is running in this process")
        try:
            with contextlib.ExitStack() as stack:
                args.host_file, hosts = self.prepare(spec.hostfile, entries, stack)
                for folder in (beats, reports):
                    os.makedirs(folder, exist_ok=True)  # the parent goes once no job uses it
                    stack.callback(remove_if_empty, os.path.dirname(folder))
                    stack.callback(shutil.rmtree, folder, True)
                cut: dict[str, str] = {}  # hosts found not answering during the job, and why
                own: set[str] = set()  # the job's processes' ip:port, once it ran
                stack.enter_context(self._job_filter(spec, args.host_ip, entries, hosts, env,
                                                     output, cut, own))
                job = Submission(
                    spec, env["MXLARGE_JOB_ID"], args, hosts, beats, reports, hide_ps_verbose,
                    {e.host: int(e.port) for e in entries or () if e.port},
                    self.layout(entries, servers, workers, args.host_ip), cut,
                    self.shutdown_timeout if spec.shutdown_timeout is None
                    else spec.shutdown_timeout, own)
                outcome, contacted = _submit(self, job, sys.stdout if output is None else output,
                                             drawn)
        finally:
            _submit_lock.release()
        used = self.used_hosts(hosts, contacted)
        return dataclasses.replace(outcome, hosts=tuple(dict.fromkeys([args.host_ip, *used])))

    def probes_with_ssh(self) -> bool:
        """Whether the backend reaches its hosts with ``ssh`` (the pre-flight's probe)."""
        return True

    def check_words(self, words: Sequence[str]) -> None:
        """Refuse a command dmlc's backend would mangle (``ValueError``)."""

    def prepare(self, hostfile: str | None, entries: list[HostEntry] | None,
                stack: contextlib.ExitStack) -> tuple[str | None, list[str]]:
        """Once per job: the hostfile dmlc reads (a temporary one goes on ``stack``) and
        the hosts the job may run on, in order."""
        return hostfile, [e.host for e in entries or ()]

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """Where the job's processes go (the launcher's layout line); the default:
        dmlc's ssh placement over the lines it reads
        (:func:`~mxlarge.launcher.hostfile.place`)."""
        return layout_of(scheduler, *place(entries or [], servers, workers))

    def describe(self, role: str, number: int, command: str) -> Launched:
        """The ``number``-th command of ``role`` dmlc starts; the default: one tool
        process for all processes of a role."""
        return Launched(role, None, f"{role}s via {self.tool.command}")

    def fix_command(self, command: str) -> str:
        """The command line dmlc built, with this backend's fixes."""
        return command

    def before_explain(self, context: FailureContext) -> Outcome | None:
        """An outcome that takes precedence over any failed child (Slurm ending the
        allocation), else ``None``."""
        return None

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        """The outcome naming the server or worker behind the failed ``child``; the
        default: the rank the tool reported (:meth:`FailureContext.explain_reported`).
        """
        return context.explain_reported(child, self.tool.rank_word)

    def used_hosts(self, hosts: list[str], contacted: set[str]) -> list[str]:
        """The job's hosts for its outcome, from :meth:`prepare`'s and the hosts
        commands were sent to (:attr:`Launched.host`)."""
        return hosts

    def _job_filter(self, spec: Spec, host_ip: str, entries: list[HostEntry] | None,
                    hosts: list[str], env: Mapping[str, str], output: IO[str] | Any,
                    cut: dict[str, str], own: set[str]
                    ) -> contextlib.AbstractContextManager[Any]:
        """The job's packet filter (:func:`~mxlarge.launcher.firewall.job_filter`),
        guards here (the scheduler), then each other host once, as the backend reaches
        it; it counts the attempts at ``own``, the job's processes' addresses."""
        guarded = [Host(f"{host_ip} (here)")] + list({
            e.host: Host.ssh(e.host, e.port) for e in entries or () if e.host != host_ip
        }.values())
        # every process on loopback (the tests' fake clusters): as local, nothing to
        # filter
        loopback = all(is_loopback(h) for h in [host_ip, *hosts])
        sink = LineSink(sys.stdout if output is None else output)
        return job_filter(spec.firewall, self.firewall_refusal(), env["MXLARGE_JOB_ID"],
                          guarded, SCHEDULER_PORTS, lambda line: sink.emit("launcher", line),
                          loopback=loopback, cut=cut, own=own)




class _SubprocessShim:
    """Stands in for the ``subprocess`` module inside dmlc_tracker modules during a
    submit: each command starts in a process group of its own under the supervisor, with
    the backend's fixes (:meth:`DmlcBackend.fix_command`), and under the guard."""

    def __init__(self, sup: supervisor.Supervisor, backend: DmlcBackend) -> None:
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
            # e.g. ssh's rsync running in a multiprocessing.Pool child: not ours to
            # supervise.
            return subprocess.check_call(args, shell=shell, env=env, executable=executable,
                                         **kwargs)
        launched = self._describe(args, env)
        if isinstance(args, str):
            args = self._backend.fix_command(args)
        try:
            # every process runs under the guard (mxlarge.launcher.guard), the scheduler
            # here too (same command), and every guard needs its lease: through the ssh
            # client's, mpirun's or srun's stdin, which each forwards to its remote
            # processes
            child = self._sup.spawn(launched.role, launched.index, args, env=env, shell=shell,
                                    executable=executable, label=launched.label,
                                    where=launched.where, lease=True)
        except RuntimeError:
            return 0  # teardown has begun; starting more would only be killed again
        if launched.host is not None and isinstance(args, str):
            self.hosts[child.pid] = launched.host
        # Deliberately no CalledProcessError: in dmlc's daemon threads it would only
        # print a traceback. The supervisor has seen the exit and acts on it.
        child.wait_exit()
        return 0

    def _describe(self, args: Any, env: Mapping[str, str] | None) -> Launched:
        if env is not None and env.get("DMLC_ROLE") == "scheduler":
            return Launched("scheduler", None, "scheduler")
        text = args if isinstance(args, str) else " ".join(map(str, args))
        m = _ROLE_IN_CMD.search(text)
        role = m.group(1) if m else "process"
        with self._lock:
            number = self._counts.get(role, 0)
            self._counts[role] = number + 1
        return self._backend.describe(role, number, text)


@dataclass(frozen=True)
class DmlcRun:
    """A job dmlc_tracker runs in ``thread`` as the supervision loop asks it
    (:class:`~mxlarge.launcher.supervisor.Supervised`)."""

    backend: DmlcBackend
    context: FailureContext
    thread: threading.Thread
    errors: list[BaseException]
    shutdown_timeout: float

    def explain(self, child: Child) -> Outcome:
        """What the backend says first (:meth:`DmlcBackend.before_explain`), the
        scheduler's (or another child's) own exit, or the server or worker behind it
        (:meth:`DmlcBackend.explain`)."""
        assert child.status is not None
        early = self.backend.before_explain(self.context)
        if early is not None:
            return early
        if child.role not in ("server", "worker"):
            scheduler = child.role == "scheduler"
            return blame(exit_code_for(child.status),
                         failure_message(child), child.role, None, child.index,
                         self.context.host_ip if scheduler else None, child.status, child,
                         pid=child.guard.pid if scheduler else None)
        child.join_pump(timeout=1.0)  # the guard's/tool's last lines name what happened
        return self.backend.explain(self.context, child)

    def terminated(self, sig: int) -> Outcome:
        return terminated(sig, self.context.host_ip)

    def ending(self) -> bool:
        return not self.thread.is_alive()

    def ended(self, seconds: float) -> Outcome | None:
        sup = self.context.sup
        if self.errors:
            return _TRACKER_FAILED
        if not sup.children:
            return Outcome(1, "dmlc_tracker started no process")
        if sup.all_exited():
            return Outcome(0, f"job finished: all {len(sup.children)} processes exited 0")
        if seconds > self.shutdown_timeout:
            hung = ", ".join(c.label for c in sup.children if c.status is None)
            return Outcome(1, f"{hung} still running {self.shutdown_timeout:g} s after the "
                              "scheduler exited")
        return None


def _submit(backend: DmlcBackend, job: Submission, output: IO[str] | Any,
            drawn: Drawn | None) -> tuple[Outcome, set[str]]:
    """dmlc's ``submit(job.args)`` in a thread, under the one supervision loop: the
    outcome and the hosts commands were sent to (``drawn``: :class:`WorkerReports`')."""
    from dmlc_tracker import tracker  # late: only cluster jobs need dmlc_tracker

    module = importlib.import_module(f"dmlc_tracker.{backend.name}")
    args = job.args
    grace = job.spec.grace
    sink = ReportSink(output, backend.tool.reports)
    sup = supervisor.Supervisor(output, sink=sink, hide_ps_verbose=job.hide_ps_verbose,
                                heartbeats=job.beats,
                                roles={"server": args.num_servers, "worker": args.num_workers})
    # the hosts a stalled job probes (not this one: the launcher runs here)
    remote = {h: job.ports.get(h, 22) for h in job.hosts if h != args.host_ip}

    def probe() -> Mapping[str, str]:  # the watchdog's and the failure report's
        found = unreachable_hosts(remote)
        job.cut.update(found)
        return found

    def emit(line: str) -> None:
        sup.sink.emit("launcher", line)
    watchdog = Watchdog(
        job.beats, args.num_workers, job.spec.stall_timeout, emit=emit, probe=probe,
        stopped=lambda: [s for c in list(sup.children) for s in list(c.guard.stopped.values())])
    reports = WorkerReports(job.beats, job.reports, emit, sup.servers, drawn=drawn)
    shim = _SubprocessShim(sup, backend)
    stop = threading.Event()
    received: list[int] = []
    errors: list[BaseException] = []

    def run_backend() -> None:
        try:
            module.submit(args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)

    context = FailureContext(args.host_ip, sup, sink, shim.hosts, watchdog, job.ports, probe,
                             stop, received, job.cut)
    thread = threading.Thread(target=run_backend, name=f"dmlc-{backend.name}-submit",
                              daemon=True)
    sup.sink.emit("launcher", f"job {job.job_id}: scheduler here at {args.host_ip}, "
                              f"{args.num_servers} server(s), {args.num_workers} worker(s) via "
                              f"dmlc_tracker {backend.name}")
    sup.sink.emit("launcher", job.layout.describe())
    try:
        with tracker_compat(), patched_subprocess([module, tracker], shim), \
                scheduler_address(tracker, args.host_ip), claimed_scheduler_port(tracker), \
                supervisor.termination_signals(stop, received):
            thread.start()
            outcome = supervisor.supervise(
                sup, DmlcRun(backend, context, thread, errors, job.shutdown_timeout), watchdog,
                stop, received, reports=reports)
            if outcome.message:
                bad = outcome.exit_code != 0 and not stop.is_set()
                sup.sink.emit("launcher", f"{outcome.message}; stopping the job" if bad
                              else outcome.message)
            # A tool client (ssh, mpirun, srun) waits on a cut-off host that cannot
            # answer; every guard behind it ends its command when the client's lease
            # stops.
            sup.teardown(min(grace, CUT_GRACE) if job.cut else grace)
            # With the scheduler gone, tracker.submit() returns within a poll interval.
            thread.join(timeout=grace + 10)
    finally:
        sup.close(grace)
        for child in sup.children:  # the scheduler bound its address and assigned the others'
            if child.role == "scheduler":
                job.own.update(child.pslog.bound, child.pslog.assigned)
    if outcome is _TRACKER_FAILED:
        err = errors[0]
        raise RuntimeError(f"dmlc_tracker {backend.name}.submit failed: {err!r}") from err
    return outcome, set(shim.hosts.values())
