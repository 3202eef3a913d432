"""One supervised process (:class:`Child`): the leader of a process group of its own, its
output pumped into ``[label] line`` records (:class:`LineSink`) and kept as its last lines,
its exit seen without reaping it (``waitid(WNOWAIT)``), and its name
(:func:`process_label`) and failure line (:func:`failure_message`). Why ``waitid(WNOWAIT)``:
``docs/design/launcher.md`` (Supervision).

The set of children, their teardown and the supervision loop are
:mod:`mxlarge.launcher.supervisor`'s.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from mxlarge.launcher.guard import GuardReport, Lease
from mxlarge.launcher.pslog import PsLog

# How often the supervision loops look at their children. Small enough that a failure is
# noticed well within a second, large enough to cost nothing next to MXNet's own
# threads.
POLL_INTERVAL = 0.05

# Lines of each child's output kept in memory: the evidence of a failure
# (``Child.tail``).
TAIL_LINES = 200
# How long a failure report waits for the failed child's last lines (see
# failure_message).
_DRAIN_WAIT = 1.0


def describe_status(status: int) -> str:
    """Describe a Popen-style return code: ``status 3`` or ``signal 9 (SIGKILL)``."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = "unknown"
        return f"signal {-status} ({name})"
    return f"status {status}"


def process_label(role: str, rank: int | None, launch: int | None) -> str:
    """How the launcher names one process, in its output's ``[label]``, its failure line
    and the headings of its evidence: ``worker 1`` by its kvstore rank, ``worker 1
    (launch 0)`` where its launch index differs, ``worker (launch 0)`` while the rank is
    not known, ``scheduler`` (no number)."""
    if rank is None:
        return role if launch is None else f"{role} (launch {launch})"
    return f"{role} {rank}" if launch in (None, rank) else f"{role} {rank} (launch {launch})"


def failure_message(child: Child) -> str:
    """The one line that names a failed child by its label (``worker 1 (launch 0) exited
    with signal 9 (SIGKILL)``), followed by the cause when its output told one
    (:meth:`PsLog.cause`)."""
    assert child.status is not None
    # The exit is seen by waitid, the output by the pump thread: let the pump read what
    # the process wrote before it died (the pipe ends with it, unless a grandchild still
    # holds it).
    child.join_pump(timeout=_DRAIN_WAIT)
    line = f"{child.label} exited with {describe_status(child.status)}"
    cause = child.pslog.cause()
    return line if cause is None else f"{line}: {cause}"


def exit_code_for(status: int) -> int:
    """Map a Popen-style return code to a shell-style exit code (a signal n becomes 128 + n)."""
    return 128 - status if status < 0 else status


class LineSink:
    """Thread-safe writer of ``[label] line`` records to a text stream."""

    def __init__(self, output: IO[str] | Any) -> None:
        self._out = output
        self._lock = threading.Lock()

    def emit(self, label: str, text: str) -> None:
        """Write one prefixed line. A closed output (``ValueError``) or a broken one
        (``OSError``: EPIPE, a full disk) drops the line instead of raising: the pumps
        must keep draining the children's pipes, or the children would block on a full
        pipe. Any other exception is a bug in the output object and propagates."""
        with self._lock:
            try:
                self._out.write(f"[{label}] {text}\n")
                flush = getattr(self._out, "flush", None)
                if flush is not None:
                    flush()
            except (OSError, ValueError):
                pass


class Child:
    """One supervised process (the leader of its own process group); ``tail`` holds its
    last :data:`TAIL_LINES` lines of output.

    One process of a server or worker (``index`` its launch index) is labelled by its
    kvstore rank once ``ranks`` tells it (:func:`process_label`; ``where`` follows, e.g.
    ``" via ssh h:22"``), which its output's lines are checked for until then; a
    ``label`` given is kept (one mpirun or srun for every process of a role).
    """

    def __init__(self, role: str, index: int | None, label: str | None,
                 popen: subprocess.Popen[bytes], sink: LineSink, hide_ps_verbose: bool = False,
                 lease: Lease | None = None, where: str = "",
                 ranks: Callable[[Child], int | None] | None = None) -> None:
        self.role = role
        self.index = index
        self.rank: int | None = None  # its kvstore rank, once known
        self._label = label
        self._where = where
        self._ranks = ranks if index is not None and role in ("server", "worker") else None
        self.popen = popen
        self.status: int | None = None
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.pslog = PsLog(hide_ps_verbose)  # what ps-lite said: its address, an abort
        self.guard = GuardReport()  # what its remote guard said (ssh: mxlarge.launcher.guard)
        self._lease = lease
        self._pump = threading.Thread(target=self._pump_lines, args=(sink,),
                                      name=f"pump {label}", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        """Process id, which is also the id of the child's process group."""
        return self.popen.pid

    @property
    def alone(self) -> bool:
        """Whether it is one process (not an mpirun or srun carrying several)."""
        return self._label is None

    @property
    def label(self) -> str:
        """Its name in the job's output and evidence (the class docstring)."""
        if self._label is not None:
            return self._label
        return process_label(self.role, self.find_rank(), self.index) + self._where

    def find_rank(self) -> int | None:
        """Its kvstore rank, looked for (by ``ranks``) while not known."""
        if self._ranks is not None and self.rank is None:
            self.rank = self._ranks(self)
        return self.rank

    def _pump_lines(self, sink: LineSink) -> None:
        stream = self.popen.stdout
        if stream is None:
            return
        try:
            for raw in iter(stream.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if self.guard.see(text):
                    if self.guard.pid is not None and self._lease is not None:
                        self._lease.add(self.popen.stdin)  # the guard runs: lease it
                        self._lease = None
                    if "started pid" in text:  # bookkeeping, not news
                        continue
                shown = self.pslog.see(text)  # ps-lite's hidden verbose lines are no evidence
                self.find_rank()  # the lines before it print under the launch index
                if shown:
                    self.tail.append(text)
                    sink.emit(self.label, text)
        except (OSError, ValueError):
            pass  # the pipe was closed under us during teardown
        finally:
            with contextlib.suppress(OSError):
                stream.close()

    def check(self) -> int | None:
        """Return the Popen-style status if the process has exited, else ``None``; never reaps."""
        if self.status is None:
            try:
                info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                # Reaped elsewhere (should not happen); fall back to what Popen knows.
                rc = self.popen.poll()
                self.status = rc if rc is not None else -1
            else:
                if info is not None:
                    if info.si_code == os.CLD_EXITED:
                        self.status = info.si_status
                    else:  # CLD_KILLED or CLD_DUMPED
                        self.status = -info.si_status
        return self.status

    def wait_exit(self, stop: threading.Event | None = None) -> int | None:
        """Block until the process exits (without reaping it) or ``stop`` is set."""
        while self.check() is None:
            if stop is not None and stop.is_set():
                return None
            time.sleep(POLL_INTERVAL)
        return self.status

    def join_pump(self, timeout: float) -> None:
        """Wait for the output pump to drain the pipe."""
        self._pump.join(timeout)

