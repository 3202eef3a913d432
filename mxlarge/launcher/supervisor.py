"""The supervision every backend runs: children in process groups of their own (each one a
:class:`~mxlarge.launcher.child.Child`), their output as ``[label] line``, the one loop
(:func:`supervise`) that ends a job with one :class:`~mxlarge.launcher.outcome.Outcome`,
and teardown.

What the loop asks of a running job is :class:`Supervised`, which each backend provides
(:class:`~mxlarge.launcher.backends.local.LocalRun`,
:class:`~mxlarge.launcher.backends.dmlc.DmlcRun`); a stall and a worker stuck in its
exit are judged by one rule for all (:mod:`mxlarge.launcher.verdict`). Why
``waitid(WNOWAIT)`` and process groups: ``docs/design/launcher.md`` (Supervision).
"""
from __future__ import annotations

import contextlib
import enum
import functools
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from mxlarge.launcher.child import POLL_INTERVAL, Child, LineSink, process_label
from mxlarge.launcher.guard import Lease
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.pgroups import live_process_groups, parent_death_signal, signal_group
from mxlarge.launcher.reports import WorkerReports
from mxlarge.launcher.verdict import evidence, exit_outcome, stall_outcome
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.protocol.heartbeat import read_all

# After SIGKILL a process normally vanishes within milliseconds; this only bounds
# pathological cases (uninterruptible sleep on a dead NFS mount) so that teardown itself
# can never hang.
_KILL_WAIT = 5.0

# How long the teardown gives ssh, mpirun and srun to pass the lease's teardown word on
# to the guards before they are signalled (a lease byte arrives within milliseconds).
_TEARDOWN_WORD = 0.5

_TERMINATION_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Seconds the launcher waits, after the user's Ctrl-C, for rank 0 to end its step, log
#: what it has (its model among it) and exit, before it tears the job down.
STOP_WAIT = 60.0


def check_job(command: Sequence[str], workers: int, servers: int) -> list[str]:
    """Validates a job's shape; returns the command as a list.

    Raises:
        ValueError: empty command, fewer than 1 worker or 1 server.
    """
    command = list(command)
    if not command:
        raise ValueError("command is empty")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if servers < 1:
        raise ValueError(f"servers must be >= 1 for a dist_sync job, got {servers}")
    return command


class Supervisor:
    """Starts children in their own process groups, streams their output, tears them
    down.

    Args:
        output: text stream that receives every child's output, one ``[label] line`` per line.
        sink: a :class:`LineSink` (subclass) to use instead of a plain one on ``output``.
        hide_ps_verbose: do not show ps-lite's level-1 lines (the launcher set ``PS_VERBOSE``
            for its own use, see :mod:`mxlarge.launcher.pslog`).
        heartbeats: the job's heartbeat directory (:mod:`mxlarge.protocol.heartbeat`), where a
            worker's kvstore rank is found when ps-lite's lines do not tell it.
        roles: the job's processes per role (``{"server": 1, "worker": 2}``): the one process
            of its role is rank 0 from the start.
    """

    def __init__(self, output: IO[str] | Any, sink: LineSink | None = None,
                 hide_ps_verbose: bool = False, heartbeats: str | Path | None = None,
                 roles: Mapping[str, int] | None = None) -> None:
        self.sink = LineSink(output) if sink is None else sink
        self._hide_ps_verbose = hide_ps_verbose
        self.heartbeats = heartbeats
        self.roles = dict(roles or {})
        self.children: list[Child] = []
        self._exit_order: list[Child] = []
        self._recorded: set[int] = set()
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._preexec = parent_death_signal()
        self._lease: Lease | None = None

    def spawn(self, role: str, index: int | None, args: str | Sequence[str], *,
              env: Mapping[str, str] | None = None, shell: bool = False,
              executable: str | None = None, label: str | None = None, where: str = "",
              lease: bool = False) -> Child:
        """Start a child in a new session with stdout and stderr merged into one pipe,
        labelled ``label``, else by its role, launch index and, once known, kvstore rank
        (:class:`Child`, :meth:`rank_of`), then ``where``.

        With ``lease``, the child's stdin is a pipe that gets the guard's lease bytes
        once its guard has started (:class:`mxlarge.launcher.guard.Lease`); else it is
        ``/dev/null``.

        Raises:
            RuntimeError: if teardown has already begun (a late start would escape it).
        """
        with self._lock:
            if self._closing:
                raise RuntimeError(f"not starting {label or process_label(role, None, index)}: "
                                   "the job is being torn down")
            if lease and self._lease is None:
                self._lease = Lease()
            popen = subprocess.Popen(  # noqa: S603 - the command is the caller's, by design
                args, env=None if env is None else dict(env), shell=shell, executable=executable,
                stdin=subprocess.PIPE if lease else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=self._preexec)
            child = Child(role, index, label, popen, self.sink, self._hide_ps_verbose,
                          self._lease if lease else None, where, self.rank_of)
            self.children.append(child)
        return child

    def rank_of(self, child: Child) -> int | None:
        """The kvstore rank of the one process behind ``child``: 0 for the only one of
        its role, else the scheduler's assignment of the address its own ps-lite Bind
        line names, else (a worker) the heartbeat of its pid (its guard's pid and host
        for a remote one); None while none tells."""
        if self.roles.get(child.role) == 1:
            return 0
        with self._lock:
            children = list(self.children)
        assigned = next((c.pslog.assigned for c in children if c.role == "scheduler"), {})
        for address in list(child.pslog.bound):
            if address in assigned and assigned[address][0] == child.role:
                return assigned[address][1]
        if self.heartbeats is None or child.role != "worker":
            return None
        pid = child.guard.pid or child.pid
        return next((r.rank for r in read_all(self.heartbeats).values()
                     if r.pid == pid and child.guard.host in (None, r.host)), None)

    def servers(self) -> dict[int, tuple[str, int | None]]:
        """Each server's kvstore rank -> (host, pid), as far as known: a child that is
        one server gives its own (its guard's for a remote one); a child that carries
        every server (mpirun, srun) gives, for each server rank the scheduler assigned,
        the host its guards started on whose address is the rank's (the pid when one
        server started there), else the address itself."""
        with self._lock:
            children = list(self.children)
        out: dict[int, tuple[str, int | None]] = {}
        assigned = next((c.pslog.assigned for c in children if c.role == "scheduler"), {})
        for child in (c for c in children if c.role == "server"):
            if child.alone:
                rank = child.find_rank()
                if rank is not None:
                    out[rank] = (child.guard.host or socket.gethostname(),
                                 child.guard.pid or child.pid)
                continue
            started = list(child.guard.started)
            for address, (role, rank) in list(assigned.items()):
                if role == "server":
                    ip = address.rsplit(":", 1)[0]
                    there = [(h, p) for h, p in started if address_of(h) == ip]
                    out[rank] = (there[0][0] if there else ip,
                                 there[0][1] if len(there) == 1 else None)
        return out

    def poll(self) -> None:
        """Record which children have exited since the last call, in order of detection."""
        with self._lock:
            children = list(self.children)
        for child in children:
            # Not "status is None": a helper thread (e.g. dmlc's, via wait_exit) may
            # have seen the exit first, and that exit must still be recorded here.
            if child.check() is not None and id(child) not in self._recorded:
                self._recorded.add(id(child))
                self._exit_order.append(child)

    def any_exited(self) -> bool:
        """Whether a child was seen to exit (:meth:`poll`)."""
        return bool(self._exit_order)

    def first_failure(self) -> Child | None:
        """The first child seen to exit with a non-zero status or a signal, if any."""
        return next((c for c in self._exit_order if c.status != 0), None)

    def all_exited(self, role: str | None = None) -> bool:
        """Whether every child (of ``role``, if given) has exited."""
        return all(c.status is not None for c in self.children if role in (None, c.role))

    def teardown(self, grace: float) -> None:
        """The lease's teardown word to the guards (:meth:`Lease.tear_down`), then
        SIGTERM to every process group, SIGKILL to what is left after ``grace`` seconds.

        Idempotent and bounded: returns after at most ``grace`` + a few seconds.
        """
        with self._lock:
            self._closing = True
            groups = {c.pid for c in self.children}
        live = groups & live_process_groups()
        if not live:
            return
        if self._lease is not None and self._lease.tear_down():
            # the guards behind ssh, mpirun and srun say "teardown", not "connection
            # lost"
            time.sleep(_TEARDOWN_WORD)
        for pgid in live:
            signal_group(pgid, signal.SIGTERM)
            # a stopped process (SIGSTOP, a stalled job) acts on SIGTERM only once
            # continued
            signal_group(pgid, signal.SIGCONT)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
            live &= live_process_groups()
        for pgid in live:
            signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + _KILL_WAIT
        while live and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
            live &= live_process_groups()

    def close(self, grace: float) -> None:
        """Tear everything down, reap the group leaders and drain the output pumps."""
        if self._closed:
            return
        self.teardown(grace)
        if self._lease is not None:
            self._lease.close()
        for child in self.children:
            # a lease pipe whose guard never started was never leased: closed here, not
            # by GC
            if child.popen.stdin is not None:
                with contextlib.suppress(OSError):
                    child.popen.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.popen.wait(timeout=_KILL_WAIT)
            child.check()
            if child.status is None:
                child.status = child.popen.returncode
        for child in self.children:
            child.join_pump(timeout=_KILL_WAIT)
        self._closed = True


class Supervised(Protocol):
    """A running job as the supervision loop (:func:`supervise`) asks it: the loop
    decides when to ask, the backend's run object what the answer is."""

    def explain(self, child: Child) -> Outcome:
        """The first child seen to fail → the outcome naming the process behind it (the
        child itself on loopback; for ssh, mpirun and srun the remote process they
        report)."""

    def terminated(self, sig: int) -> Outcome:
        """The launcher received signal ``sig`` → the outcome of the torn-down job."""

    def ending(self) -> bool:
        """Whether the job is winding down, so that training can no longer fail it
        (local: every worker exited; cluster: dmlc's ``submit`` returned)."""

    def ended(self, seconds: float) -> Outcome | None:
        """Asked at each poll while ending, with the seconds since it began: the outcome
        once the job is over (every process exited, or the rest overran their time),
        else None."""


class JobState(enum.Enum):
    """Where a supervised job is (torchrun's ``WorkerState``, for a job of processes)."""

    RUNNING = "running"  # training: a failure, a stall or a worker stuck in its exit ends it
    ENDING = "ending"  # the workers' work is done: the rest may take their time to exit


def supervise(sup: Supervisor, backend: Supervised, watchdog: Watchdog | None,
              stop: threading.Event, received: Sequence[int], *,
              reports: WorkerReports | None = None,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """The one supervision loop of every backend (:func:`_supervise_loop`), its failed
    outcome with the launcher's :func:`evidence`, and what ``reports`` collected while
    it ran (:meth:`WorkerReports.conclude`: the stragglers named, the timeline merged).
    """
    outcome = _supervise_loop(sup, backend, watchdog, stop, received, reports, clock=clock,
                              sleep=sleep)
    if reports is not None:
        outcome = reports.conclude(outcome)
    return evidence(outcome, sup.children, watchdog)


def _supervise_loop(sup: Supervisor, backend: Supervised, watchdog: Watchdog | None,
                    stop: threading.Event, received: Sequence[int],
                    reports: WorkerReports | None, *, clock: Callable[[], float],
                    sleep: Callable[[float], None]) -> Outcome:
    """Polls the children every :data:`POLL_INTERVAL` until the job has an outcome.

    At each poll, in this order (the first that applies ends the loop):

    1. the launcher was signalled (``stop``; ``received[0]`` names the signal, SIGTERM if
       none) → ``backend.terminated``; on a first SIGINT (the user's Ctrl-C) while rank 0
       trains, only once a process of the job has exited (rank 0, after it kept what it
       had: :func:`~mxlarge.protocol.heartbeat.ask_stop`), another signal came, or
       :data:`STOP_WAIT` s passed;
    2. a child failed (the first seen, :meth:`Supervisor.first_failure`) →
       ``backend.explain``;
    3. the watchdog sees a stall (:func:`stall_outcome`);
    4. ``reports`` reads the workers' heartbeats (stragglers: lines, never an outcome);
    5. :attr:`JobState.RUNNING`: once ``backend.ending()``, the job is
       :attr:`JobState.ENDING`; until then, a worker stuck in its exit after its work is done
       ends it (:func:`exit_outcome`);
    6. :attr:`JobState.ENDING`: ``backend.ended(seconds since it began ending)`` has the
       outcome, or not yet.

    Nothing is torn down here: the caller tears down after the outcome's line is out.
    """
    state = JobState.RUNNING
    ending_since = 0.0
    asked: float | None = None  # when rank 0 was asked to stop
    while True:
        if stop.is_set():
            if asked is None and received[:1] == [signal.SIGINT] and reports is not None \
                    and reports.ask_stop():
                asked = clock()
                sup.sink.emit("launcher", "Ctrl-C: rank 0 stops after its step and keeps what "
                              f"it has (up to {STOP_WAIT:g} s; Ctrl-C again: at once)")
            sup.poll()
            if asked is None or len(received) > 1 or sup.any_exited() \
                    or clock() - asked > STOP_WAIT:
                return backend.terminated(received[0] if received else signal.SIGTERM)
            sleep(POLL_INTERVAL)
            continue
        sup.poll()
        failed = sup.first_failure()
        if failed is not None:
            return backend.explain(failed)
        stalled = stall_outcome(watchdog, sup.children)
        if stalled is not None:
            return stalled
        if reports is not None:
            reports.poll()
        if state is JobState.RUNNING and backend.ending():
            state = JobState.ENDING
            ending_since = clock()
        if state is JobState.ENDING:
            done = backend.ended(clock() - ending_since)
            if done is not None:
                return done
        else:
            finished = exit_outcome(watchdog, sup.children,
                                    lambda line: sup.sink.emit("launcher", line))
            if finished is not None:
                return finished
        sleep(POLL_INTERVAL)


@contextlib.contextmanager
def termination_signals(stop: threading.Event, received: list[int]) -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into ``stop.set()`` while the block runs.

    The supervision loop then tears the job down instead of the launcher dying and
    orphaning its children. Python only lets the main thread install handlers; elsewhere
    this does nothing and the caller's own ``finally`` remains the safety net. Previous
    handlers are restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        received.append(signum)  # the first names the end; a second one hurries it
        stop.set()

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in _TERMINATION_SIGNALS:
            previous[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, old in previous.items():
            # ``None`` means the old handler was installed from C; the default is the
            # best approximation Python can restore.
            signal.signal(sig, signal.SIG_DFL if old is None else old)


@functools.lru_cache(maxsize=256)
def address_of(host: str) -> str | None:
    """``host``'s IPv4 address as this machine resolves it, None if it does not."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None
