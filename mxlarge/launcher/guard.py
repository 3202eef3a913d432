"""The guard every cluster process runs under, and the lease that keeps it going.

``python -m mxlarge.launcher.guard [--reraise] [--from-first-byte] -- CMD...`` runs CMD
as its child in a process group of its own and prints what ssh cannot tell (``ssh``
exits 255 both for a refused connection and for a remote ``kill -9``): :data:`TAG` lines
when the command started (its pid and host), when it died of a signal, and when the
launcher's **lease** ran out. The launcher (:class:`Lease`) writes a byte every
:data:`LEASE_EVERY` s to the stdin of each ssh client, ``mpirun --stdin all`` or ``srun
--input=all`` it starts; no byte for :data:`LEASE_TIMEOUT` s, or end of file, means the
launcher or the link is gone (a partitioned host notices nothing else), and the guard
ends the command's group. At a job's teardown the launcher writes :data:`TEARDOWN`
first: the guard ends the command and says so.

A command stopped for :data:`STOPPED_AFTER` s (``SIGSTOP``: state ``T``) is said too
(and its continuation): the watchdog names it when every worker waits
(:class:`Stopped`).

``--reraise`` (mpi, slurm) dies of the command's signal so that mpirun's and srun's own
reports stay what they would be unguarded; ``--from-first-byte`` (mpi) starts the lease
at the first byte, because Open MPI 4.1's ``--stdin all`` gives ranks on mpirun's own
host none. The measurements behind these choices are in ``docs/design/launcher.md``.
Importing this module does not import MXNet.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import re
import resource
import select
import signal
import socket
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TAG = "mxlarge-guard:"
LEASE_BYTE = b"."
#: The launcher's word that it tears the job down (before it signals the processes).
TEARDOWN = b"!"
LEASE_EVERY = 1.0
LEASE_TIMEOUT = 10.0
GRACE = 5.0
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
#: How long the command must be stopped (state ``T``) before its guard says so.
STOPPED_AFTER = 2.0
_STARTED = re.compile(rf"^{TAG} started pid (?P<pid>\d+) on (?P<host>\S+)$")
_KILLED = re.compile(rf"^{TAG} pid \d+ on \S+ killed by (?P<sig>SIG\w+)$")
_STOPPED = re.compile(rf"^{TAG} (?P<role>\w+) pid (?P<pid>\d+) on (?P<host>\S+) "
                      r"(?P<what>stopped|continued)\b")


@dataclass(frozen=True)
class Stopped:
    """A guarded process its guard found stopped (``SIGSTOP``, a debugger): state ``T``."""

    role: str
    pid: int
    host: str

    def __str__(self) -> str:
        return f"{self.role} pid {self.pid} on {self.host} stopped (SIGSTOP or a debugger)"


@dataclass
class GuardReport:
    """What a guard said about its command: ``pid``/``host`` once started, ``signal`` (a
    number) if the command died of one, ``lost`` if the guard ended it for a lost lease.
    """

    pid: int | None = None
    host: str | None = None
    signal: int | None = None
    lost: bool = False
    #: the processes stopped now, of every guard whose lines come this way (mpirun,
    #: srun)
    stopped: dict[tuple[str, int], Stopped] = field(default_factory=dict)
    #: (host, pid) of every command started, of every guard whose lines come this way
    started: list[tuple[str, int]] = field(default_factory=list)

    def see(self, line: str) -> bool:
        """Take in one output line; return whether it was a guard line."""
        if not line.startswith(TAG):
            return False
        if m := _STOPPED.match(line):
            key = (m.group("host"), int(m.group("pid")))
            if m.group("what") == "stopped":
                self.stopped[key] = Stopped(m.group("role"), key[1], key[0])
            else:
                self.stopped.pop(key, None)
        elif m := _STARTED.match(line):
            self.pid = int(m.group("pid"))
            self.host = m.group("host")
            self.started.append((self.host, self.pid))
        elif m := _KILLED.match(line):
            with contextlib.suppress(KeyError):
                self.signal = int(signal.Signals[m.group("sig")])
        elif "connection lost" in line:
            self.lost = True
        return True


def guard_command(command: Sequence[str], reraise: bool = False,
                  from_first_byte: bool = False) -> list[str]:
    """``command`` run under the guard by this Python (which must exist at the same path
    on every host, as the command itself must), with :func:`guard`'s ``reraise`` and
    ``from_first_byte`` (``--reraise``, ``--from-first-byte``)."""
    return [sys.executable, "-m", "mxlarge.launcher.guard", "guard",
            *(["--reraise"] if reraise else []),
            *(["--from-first-byte"] if from_first_byte else []), "--", *command]


def _quiet_terminal(fd: int) -> None:
    """No echo, no line editing: the lease bytes are read one by one and never shown."""
    if not os.isatty(fd):
        return
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.ECHONL)
    attrs[6][termios.VMIN] = 1
    attrs[6][termios.VTIME] = 0
    termios.tcsetattr(fd, termios.TCSANOW, attrs)


def _end_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``child``'s group, SIGKILL it if anything is left after :data:`GRACE` s."""
    pgid = child.pid
    for sig in (signal.SIGTERM, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        _reap(child)
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _become_subreaper() -> None:
    """Orphans of the command (children of a shell that died first) become this process's
    children, not init's (Linux ``PR_SET_CHILD_SUBREAPER``), so that :func:`_reap` can reap
    them: a zombie counts as a member of its group until somebody reaps it, and init may take
    seconds to."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap(child: subprocess.Popen[bytes]) -> None:
    """Reap ``child`` and every other dead child (:func:`_become_subreaper`'s orphans):
    a dead leader left as a zombie would keep its group "alive" until the grace ran out.
    """
    child.poll()
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _die_of(signum: int) -> None:
    """End this process by signal ``signum`` (its default action, no core file), as the
    command would have ended unguarded: mpirun and srun then report the signal itself.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` (``R``, ``S``, ``T`` stopped, ...), ``None`` if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class _StopWatch:
    """Says once when the command has been stopped (``T``, ``t``) for
    :data:`STOPPED_AFTER` s, and when it continues: a stopped server or scheduler writes
    no heartbeat, so only its guard can tell the launcher where the job stands still."""

    def __init__(self, pid: int, host: str) -> None:
        self.pid = pid
        self.host = host
        self.role = os.environ.get("DMLC_ROLE", "process")
        self.since: float | None = None
        self.said = False

    def check(self) -> None:
        if process_state(self.pid) in ("T", "t"):
            now = time.monotonic()
            self.since = self.since or now
            if not self.said and now - self.since >= STOPPED_AFTER:
                self.said = True
                print(f"{TAG} {self.role} pid {self.pid} on {self.host} stopped", flush=True)
            return
        if self.said:
            print(f"{TAG} {self.role} pid {self.pid} on {self.host} continued", flush=True)
        self.since = None
        self.said = False


def guard(command: Sequence[str], lease_timeout: float = LEASE_TIMEOUT,
          reraise: bool = False, from_first_byte: bool = False) -> int:
    """Run ``command`` as the module docstring says; returns the exit status to exit
    with.

    With ``reraise`` an end by signal n (the command killed by n, or n received by the
    guard) is not returned as 128 + n: the guard kills itself with n (:func:`_die_of`).
    With ``from_first_byte`` the lease runs from the first byte received, not from the
    start (an end of file still ends the command at once).
    """
    host = socket.gethostname()
    stdin = sys.stdin.fileno()
    with contextlib.suppress(termios.error):
        _quiet_terminal(stdin)
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)

    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    said = ""  # why the guard ends the command: the lease's end
    _become_subreaper()
    child = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"{TAG} started pid {child.pid} on {host}", flush=True)
    leased = float("inf") if from_first_byte else time.monotonic()
    reading = True
    watch = _StopWatch(child.pid, host)
    try:
        while True:
            status = child.poll()
            if status is not None:
                break
            watch.check()
            if received:
                if said:
                    print(f"{TAG} {said}; ending pid {child.pid} on {host}", flush=True)
                _end_group(child)
                if reraise:
                    _die_of(received[0])
                return 128 + received[0]
            if reading:
                with contextlib.suppress(InterruptedError):
                    ready, _, _ = select.select([stdin], [], [], 0.2)
                    if ready:
                        try:
                            data = os.read(stdin, 4096)
                        except OSError as e:  # EIO: the terminal was hung up
                            data = b"" if e.errno == errno.EIO else b"x"
                        if TEARDOWN in data:  # as a SIGTERM, said
                            said = "the launcher tears the job down"
                            received.append(signal.SIGTERM)
                        elif data:
                            leased = time.monotonic()
                        else:  # end of file: nobody will write again
                            reading = False
                            leased = -float("inf")
            else:
                time.sleep(0.2)
            if time.monotonic() - leased > lease_timeout and not received:
                why = ("its input ended" if leased == -float("inf") else
                       f"no word from it for {lease_timeout:g} s")
                print(f"{TAG} launcher connection lost ({why}); ending pid {child.pid} on "
                      f"{host}", flush=True)
                _end_group(child)
                return 1
    finally:
        # whatever the command left behind in its group goes with it
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    if status < 0:
        print(f"{TAG} pid {child.pid} on {host} killed by {signal.Signals(-status).name}",
              flush=True)
        if reraise:
            _die_of(-status)
        return 128 - status
    return status


class Lease:
    """Writes :data:`LEASE_BYTE` every :data:`LEASE_EVERY` s to the stdin of each
    guarded process it was given, until :meth:`close` (which closes those pipes: end of
    file); :meth:`tear_down` writes :data:`TEARDOWN` to them."""

    def __init__(self) -> None:
        self._pipes: list[object] = []
        self._lock = threading.Lock()
        self._torn = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def add(self, pipe: object) -> None:
        with self._lock:
            self._pipes.append(pipe)

    def _run(self) -> None:
        while not self._stop.wait(LEASE_EVERY):
            self._write(LEASE_BYTE)

    def _write(self, word: bytes) -> None:
        with self._lock:
            pipes = list(self._pipes)
        for pipe in pipes:
            with contextlib.suppress(OSError, ValueError):
                # a pipe is a Popen's stdin, kept as object: the supervisor passes
                # Popen.stdin, which is Optional to mypy
                pipe.write(word)  # type: ignore[attr-defined]
                pipe.flush()  # type: ignore[attr-defined]

    def tear_down(self) -> bool:
        """Tells every guard, once, that the job is being torn down; returns whether
        this call told any."""
        with self._lock:
            told = not self._torn and bool(self._pipes)
            self._torn = True
        if told:
            self._write(TEARDOWN)
        return told

    def close(self) -> None:
        self._stop.set()
        self._thread.join(LEASE_EVERY + 1)
        with self._lock:
            for pipe in self._pipes:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()  # type: ignore[attr-defined]  # a Popen's stdin (_write)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxlarge.launcher.guard",
                                description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    g = sub.add_parser("guard", help="run COMMAND under the guard (the cluster backends do)")
    g.add_argument("--reraise", action="store_true",
                   help="end by the signal that ended the command (mpirun, srun report it)")
    g.add_argument("--from-first-byte", action="store_true",
                   help="the lease runs from the first byte received (mpirun's local ranks "
                        "get none)")
    g.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("guard: no command")
    return guard(command, reraise=a.reraise, from_first_byte=a.from_first_byte)


if __name__ == "__main__":
    sys.exit(main())
