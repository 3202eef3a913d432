"""What the launcher learns about remote processes and hosts that ssh alone does not tell.

Tools checked on the namespace testbed (``tests/cluster/test_failures.py``,
``tests/cluster/test_partition.py``).

The guard (``python -m mxlarge.launcher.probe guard [--reraise] [--from-first-byte] -- CMD...``)
    Every cluster backend (ssh, mpi, slurm) runs every process under it, the local scheduler
    too. ``ssh`` exits with status 255 both when
    it cannot connect and when the remote process dies of a signal (sshd reports
    ``exit-signal``, and OpenSSH's client turns that into 255), so the launcher cannot tell a
    ``kill -9`` from a refused connection. The guard runs COMMAND as its child, in a process
    group of its own, and prints three kinds of lines, each starting with :data:`TAG`:

    * ``mxlarge-guard: started pid P on HOST`` once the command runs (the launcher then knows
      the connection works, and which remote pid is the process: the heartbeat records name
      it, which gives a worker's kvstore rank);
    * ``mxlarge-guard: pid P on HOST killed by SIGKILL`` when the command dies of a signal
      (the guard then exits with 128 + n);
    * ``mxlarge-guard: launcher connection lost ...`` when the lease (below) runs out.

    The command's exit status is the guard's. The guard also ends the command's whole group
    (SIGTERM, SIGKILL after :data:`GRACE` s) when it gets SIGHUP/SIGTERM/SIGINT (sshd hangs up
    the ``-tt`` terminal when the connection closes) and when the **lease** runs out: after
    the ``started`` line the launcher writes one byte (:data:`LEASE_BYTE`) every
    :data:`LEASE_EVERY` s to the stdin of the ssh client, of ``mpirun --stdin all`` or of
    ``srun --input=all``, each of which carries it to the stdin of every guard it started. No
    byte for :data:`LEASE_TIMEOUT` s, or end of file, means the launcher or the link is gone
    (a partitioned host: its sshd, orted or slurmstepd notices nothing until the link is back),
    and the guard ends the command. Echo and line mode are switched off first where stdin is a
    terminal (ssh's ``-tt``), so the bytes never show in the output; under mpirun and srun it
    is a pipe.

    ``--reraise`` (mpi, slurm): a guard that ends by signal n (its command killed by n, or n
    received) kills itself with n instead of exiting 128 + n, so that mpirun's ``exited on
    signal 9`` and srun's ``task 1: Killed``, which the launcher parses, stay what they would
    be unguarded. ``--from-first-byte`` (mpi): the lease runs from the first byte, not from the
    start, because Open MPI 4.1's ``--stdin all`` forwards nothing to ranks on mpirun's own
    host (measured with 4.1.4: they read nothing, and get no end of file either); those ranks
    are mpirun's own children, which it ends itself.

The probe (:func:`unreachable`)
    A TCP connect to a host's ssh port with a short timeout. An answer, even a refusal (no
    sshd there), means the host is up and reachable from here; silence or "no route" means it
    is not: that is how a stalled job names a partitioned host instead of suspecting "a
    server, the scheduler or the network".

The ssh probe (:func:`ssh_silent`)
    Whether ``ssh host true`` succeeds within a few seconds (:data:`SSH_PROBE_TIMEOUT`): the
    host is up, its sshd lets the launcher in, and it can start a command. This is what an
    ``--elastic`` ssh job asks of every host before each restart
    (:func:`mxlarge.launcher.restart.ssh_probe`): a host that only answers a TCP connect but
    cannot run the job's processes is no host for it.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

TAG = "mxlarge-guard:"
LEASE_BYTE = b"."
LEASE_EVERY = 1.0
LEASE_TIMEOUT = 10.0
GRACE = 5.0
_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PROBE_TIMEOUT = 2.0
SSH_PROBE_TIMEOUT = 5.0

_STARTED = re.compile(rf"^{TAG} started pid (?P<pid>\d+) on (?P<host>\S+)$")
_KILLED = re.compile(rf"^{TAG} pid \d+ on \S+ killed by (?P<sig>SIG\w+)$")


@dataclass
class GuardReport:
    """What a guard said about its command: ``pid``/``host`` once started, ``signal`` (a
    number) if the command died of one, ``lost`` if the guard ended it for a lost lease."""

    pid: int | None = None
    host: str | None = None
    signal: int | None = None
    lost: bool = False

    def see(self, line: str) -> bool:
        """Take in one output line; return whether it was a guard line."""
        if not line.startswith(TAG):
            return False
        if m := _STARTED.match(line):
            self.pid, self.host = int(m.group("pid")), m.group("host")
        elif m := _KILLED.match(line):
            with contextlib.suppress(KeyError):
                self.signal = int(signal.Signals[m.group("sig")])
        elif "connection lost" in line:
            self.lost = True
        return True


def guard_command(command: Sequence[str], reraise: bool = False,
                  from_first_byte: bool = False) -> list[str]:
    """``command`` run under the guard by this Python (which must exist at the same path on
    every host, as the command itself must), with :func:`guard`'s ``reraise`` and
    ``from_first_byte`` (``--reraise``, ``--from-first-byte``)."""
    return [sys.executable, "-m", "mxlarge.launcher.probe", "guard",
            *(["--reraise"] if reraise else []),
            *(["--from-first-byte"] if from_first_byte else []), "--", *command]


def _quiet_terminal(fd: int) -> None:
    """No echo, no line editing: the lease bytes are read one by one and never shown."""
    if not os.isatty(fd):
        return
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~(termios.ECHO | termios.ICANON | termios.ECHONL)
    attrs[6][termios.VMIN], attrs[6][termios.VTIME] = 1, 0
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
    """Reap ``child`` and every other dead child (:func:`_become_subreaper`'s orphans): a dead
    leader left as a zombie would keep its group "alive" until the grace ran out."""
    child.poll()
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def _die_of(signum: int) -> None:
    """End this process by signal ``signum`` (its default action, no core file), as the
    command would have ended unguarded: mpirun and srun then report the signal itself."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL/SIGSTOP have no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)


def guard(command: Sequence[str], lease_timeout: float = LEASE_TIMEOUT,
          reraise: bool = False, from_first_byte: bool = False) -> int:
    """Run ``command`` as the module docstring says; returns the exit status to exit with.

    With ``reraise`` an end by signal n (the command killed by n, or n received by the guard)
    is not returned as 128 + n: the guard kills itself with n (:func:`_die_of`). With
    ``from_first_byte`` the lease runs from the first byte received, not from the start (an end
    of file still ends the command at once).
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
    _become_subreaper()
    child = subprocess.Popen(list(command), stdin=subprocess.DEVNULL, start_new_session=True)
    print(f"{TAG} started pid {child.pid} on {host}", flush=True)
    leased = float("inf") if from_first_byte else time.monotonic()
    reading = True
    try:
        while True:
            status = child.poll()
            if status is not None:
                break
            if received:
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
                        if data:
                            leased = time.monotonic()
                        else:  # end of file: nobody will write again
                            reading = False
                            leased = -float("inf")
            else:
                time.sleep(0.2)
            if time.monotonic() - leased > lease_timeout:
                print(f"{TAG} launcher connection lost (no word from it for "
                      f"{lease_timeout:g} s); ending pid {child.pid} on {host}", flush=True)
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
    """Writes :data:`LEASE_BYTE` every :data:`LEASE_EVERY` s to the stdin of each guarded
    process it was given, until :meth:`close` (which closes those pipes: end of file)."""

    def __init__(self) -> None:
        self._pipes: list[object] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def add(self, pipe: object) -> None:
        with self._lock:
            self._pipes.append(pipe)

    def _run(self) -> None:
        while not self._stop.wait(LEASE_EVERY):
            with self._lock:
                pipes = list(self._pipes)
            for pipe in pipes:
                with contextlib.suppress(OSError, ValueError):
                    pipe.write(LEASE_BYTE)  # type: ignore[attr-defined]
                    pipe.flush()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(LEASE_EVERY + 1)
        with self._lock:
            for pipe in self._pipes:
                with contextlib.suppress(OSError, ValueError):
                    pipe.close()  # type: ignore[attr-defined]


def unreachable(host: str, port: int = 22, timeout: float = PROBE_TIMEOUT) -> str | None:
    """``None`` if ``host`` answers a TCP connect to ``port`` (accepted or refused) within
    ``timeout`` s, else why not, e.g. ``"no answer on port 22 within 2 s"``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None  # refused: the host is up and answered
    except TimeoutError:
        return f"no answer on port {port} within {timeout:g} s"
    except OSError as e:
        return f"port {port}: {e.strerror or e}"


def unreachable_hosts(hosts: Mapping[str, int], timeout: float = PROBE_TIMEOUT
                      ) -> dict[str, str]:
    """:func:`unreachable` for every host at once (threads): ``{host: why}`` of those that did
    not answer; takes at most ``timeout`` s (+ thread start)."""
    return _each(hosts, lambda host, port: unreachable(host, port, timeout), timeout)


def ssh_fails(host: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT) -> str | None:
    """``None`` if ``ssh -p port host true`` (the ``ssh`` on PATH, non-interactive: no password
    prompt, no host-key question) exits 0 within ``timeout`` s, else why not."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
           "-o", f"ConnectTimeout={max(1, int(timeout))}", "-p", str(port), host, "true"]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"ssh {host} true: no answer within {timeout:g} s"
    except OSError as e:
        return f"ssh {host} true: {e.strerror or e}"
    if r.returncode == 0:
        return None
    said = r.stderr.strip().splitlines()
    return f"ssh {host} true: status {r.returncode}" + (f" ({said[-1]})" if said else "")


def ssh_silent(hosts: Mapping[str, int], timeout: float = SSH_PROBE_TIMEOUT) -> dict[str, str]:
    """:func:`ssh_fails` for every host at once: ``{host: why}`` of those that did not let
    ``ssh host true`` through; takes at most ``timeout`` s (+ thread start)."""
    return _each(hosts, lambda host, port: ssh_fails(host, port, timeout), timeout)


def _each(hosts: Mapping[str, int], fails: Callable[[str, int], str | None],
          timeout: float) -> dict[str, str]:
    """``fails(host, port)`` for every host in threads of its own; ``{host: why}`` of the
    hosts it gave a reason for, or that had no verdict after ``timeout`` + 1 s."""
    found: dict[str, str] = {}
    lock = threading.Lock()

    def one(host: str, port: int) -> None:
        why = fails(host, port)
        if why is not None:
            with lock:
                found[host] = why

    threads = {host: threading.Thread(target=one, args=(host, port), daemon=True)
               for host, port in hosts.items()}
    for t in threads.values():
        t.start()
    deadline = time.monotonic() + timeout + 1
    for t in threads.values():
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        late = {h: f"no verdict within {timeout + 1:g} s" for h, t in threads.items()
                if t.is_alive() and h not in found}
        return {**found, **late}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxlarge.launcher.probe",
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
