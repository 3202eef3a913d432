"""Naming the process behind a failed cluster job: the reports mpirun and srun print,
the kvstore rank of the process a failed ssh client, mpirun or srun carried, and the one
:class:`~mxlarge.launcher.outcome.Outcome` that blames it.

A cluster launcher sees only its local children. For ssh there is one client per
process, and the process's own lines (its guard's, its ps-lite Bind line) come back
through it; mpirun and srun carry every rank of a role and print which rank failed on
which host. The kvstore rank comes from the scheduler's assignments, else from the one
rank of the role on the named host, else from the heartbeats; the line names ``worker
(launch 1)`` while it is not known. Each backend decides which of these it uses
(:meth:`~mxlarge.launcher.backends.dmlc.DmlcBackend.explain`).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from mxlarge.launcher.child import Child, LineSink, exit_code_for, failure_message
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.supervisor import Supervisor
from mxlarge.launcher.watchdog import Watchdog

_STRSIGNAL = {signal.strsignal(s): int(s) for s in signal.Signals if signal.strsignal(s)}
_SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")


@dataclass(frozen=True)
class Report:
    """What mpirun or srun said about the first rank that failed in its step."""

    rank: int
    host: str | None
    status: int | None  # Popen-style: -n for signal n


class ReportSink(LineSink):
    """A :class:`LineSink` that also keeps the first failed rank/host a tool (mpirun,
    srun) reports, by the backend's ``patterns``."""

    def __init__(self, output: IO[str] | Any, patterns: Sequence[re.Pattern[str]] = ()) -> None:
        super().__init__(output)
        self._patterns = tuple(patterns)
        self.reports: dict[str, Report] = {}  # label -> the first report in its output

    def emit(self, label: str, text: str) -> None:
        super().emit(label, text)
        if label in self.reports:
            return
        for pattern in self._patterns:
            m = pattern.search(text)
            if m:
                self.reports[label] = Report(int(m.group("rank")), m.groupdict().get("host"),
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
    """``worker rank 1 on h2``; ``worker (launch 1) on h2`` while the kvstore rank is
    not known (the one number the launcher's lines, the tags and the watchdog use is the
    kvstore rank)."""
    name = (f"{role} rank {rank}" if rank is not None else
            f"{role} (launch {launch})" if launch is not None else role)
    return f"{name} on {host}" if host else name


def status_words(status: int) -> str:
    """``killed by SIGKILL`` or ``exited with status 3``."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with status {status}"


_INTERRUPTED = frozenset(128 + s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def blame(code: int, message: str, role: str, rank: int | None, launch: int | None,
          host: str | None, status: int | None, child: Child | None = None,
          pid: int | None = None) -> Outcome:
    """The :class:`Outcome` blaming one process (``rank``: its kvstore rank, for a
    server or worker; ``launch``: its launch index or task rank; ``child``: the local
    process that carried it; ``pid``: its own, where known).

    128 + SIGINT/SIGTERM/SIGHUP, or the launcher itself failing first (``scancel``), is
    the launcher having been interrupted: no ``reason``, so not restarted.
    """
    interrupted = code in _INTERRUPTED or role == "launcher"
    failure = ProcessFailure(role, rank if role in ("server", "worker") else None, launch, host,
                             pid, status, None, tuple(child.tail) if child else ())
    return Outcome(code, message, None if interrupted else "crashed", failure=failure)


def terminated(sig: int, host_ip: str) -> Outcome:
    """The launcher received ``sig``: the job was torn down (not restarted)."""
    return blame(128 + sig, f"launcher received {signal.Signals(sig).name}; job torn down",
                 "launcher", None, None, host_ip, -sig, pid=os.getpid())


class FailureContext:
    """What a backend has to hand when it names the process behind a failed local child
    (ssh client, mpirun, srun): the job's children and their output, the tools' reports,
    the hosts commands were sent to (``targets``: child pid -> host), the heartbeats,
    the probe of the job's hosts (``cut``: the hosts it, or a backend, found not
    answering) and the launcher's signals."""

    def __init__(self, host_ip: str, sup: Supervisor, sink: ReportSink,
                 targets: Mapping[int, str], watchdog: Watchdog | None,
                 ports: Mapping[str, int], probe: Callable[[], Mapping[str, str]],
                 stop: threading.Event, received: Sequence[int],
                 cut: dict[str, str] | None = None) -> None:
        self.host_ip = host_ip
        self.sup = sup
        self.sink = sink
        self.targets = targets
        self.watchdog = watchdog
        self.ports = ports
        self.probe = probe
        self.stop = stop
        self.received = received
        self.cut = {} if cut is None else cut  # hosts found not answering: the teardown's

    failed = staticmethod(blame)

    def _assigned(self) -> dict[str, tuple[str, int]]:
        """The scheduler's assignments, ``"ip:port" -> (role, kvstore rank)``."""
        return next((c.pslog.assigned for c in self.sup.children if c.role == "scheduler"), {})

    def rank(self, child: Child, host: str | None, remote_pid: int | None,
             by_bind: bool = False) -> int | None:
        """The kvstore rank of the process behind ``child`` (on ``host``, with
        ``remote_pid`` if known): from its own Bind line (``by_bind``: one process per
        child, as with ssh), from the one rank of its role on that host, or from the
        heartbeats."""
        if by_bind and child.find_rank() is not None:  # its Bind line (or its heartbeat)
            return child.rank
        assigned = self._assigned()
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

    def explain_reported(self, child: Child, task: str) -> Outcome:
        """A failed mpirun or srun: the rank its report names (``task``: what the tool
        calls a rank), or, with no report, the hosts the probe finds cut off."""
        assert child.status is not None
        report = self.sink.reports.get(child.label)
        if report is None:
            # no rank reported: mpirun lost a daemon (its ssh's keepalive gave up on a
            # host), srun a node; the probe tells whether a host is cut off, as for
            # ssh's 255
            cut = self.probe()
            line = failure_message(child) + "".join(
                f"; host {h} unreachable ({why})" for h, why in sorted(cut.items()))
            host = next(iter(cut)) if len(cut) == 1 else None
            return blame(exit_code_for(child.status), line, child.role, None, None, host,
                         child.status, child)
        rank = self.rank(child, report.host, None)
        status = report.status if report.status is not None else child.status
        what = who(child.role, rank, report.rank, report.host)
        line = f"{what} ({child.label}, {task} {report.rank}) {status_words(status)}"
        code = 128 - status if status < 0 else exit_code_for(child.status)
        return blame(code, line, child.role, rank, report.rank, report.host, status, child)


def _address(host: str) -> str | None:
    with contextlib.suppress(OSError):
        return socket.gethostbyname(host)
    return None
