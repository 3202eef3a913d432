"""The guard (``python -m mxlarge.launcher.guard guard``) with real processes on this host: its
stdin a pipe, as under mpirun and srun (no terminal), the lease keeping the command alive,
its expiry or end of file ending the command's whole process group (the launcher's teardown
word too, said as such), and ``--reraise`` dying of the command's signal (or of the one it
received) so that mpirun and srun report it."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from mxlarge.launcher.guard import (
    LEASE_BYTE,
    STOPPED_AFTER,
    TAG,
    TEARDOWN,
    GuardReport,
    Lease,
    guard_command,
)

# A guard with a 1 s lease (the real one is LEASE_TIMEOUT): the claims are the same.
_SHORT_LEASE = ("import sys; from mxlarge.launcher.guard import guard; "
                "sys.exit(guard(sys.argv[1:], lease_timeout=1.0, reraise=True))")
# the command: a group of two (a background sleep and the shell waiting on the other)
_GROUP = ["sh", "-c", "sleep 60 & sleep 60; wait"]


@pytest.fixture
def started() -> Iterator[Callable[[list[str]], subprocess.Popen[str]]]:
    """Starts a guard with its stdin a pipe (stderr, where ``python -m`` may warn, apart);
    kills it and closes its pipes after the test."""
    procs: list[subprocess.Popen[str]] = []

    def start(argv: list[str]) -> subprocess.Popen[str]:
        procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True,
                                      start_new_session=True))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]


def _started(proc: subprocess.Popen[str]) -> int:
    """The command's pid (= its process group) from the guard's first line."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.fullmatch(rf"{TAG} started pid (\d+) on \S+\n", line)
    assert m, f"no started line: {line!r}"
    return int(m.group(1))


def _ended(proc: subprocess.Popen[str]) -> str:
    """Wait for the guard to end (its stdin left open: an end of file would end the lease);
    its output."""
    proc.wait(timeout=30)
    assert proc.stdout is not None
    return proc.stdout.read()


def _group_alive(pgid: int, wait: float = 2.0) -> bool:
    """Whether the group still has a process ``wait`` s from now (or at once, if it is gone):
    the guard's dead command is a zombie until init reaps it after the guard's end."""
    deadline = time.monotonic() + wait
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def _lease(proc: subprocess.Popen[str], stop: threading.Event) -> threading.Thread:
    """Write a lease byte every 0.2 s to the guard's stdin pipe until ``stop``."""
    def run() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # the guard ended: nobody reads any more
            while not stop.wait(0.2):
                proc.stdin.write(LEASE_BYTE.decode())
                proc.stdin.flush()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_guard_command_asks_for_reraise_only_when_told():
    assert guard_command(["x"])[-3:] == ["guard", "--", "x"]
    assert guard_command(["x"], reraise=True)[-4:] == ["guard", "--reraise", "--", "x"]


@pytest.mark.parametrize("reraise", [False, True])
def test_a_command_killed_by_a_signal(started, reraise):
    """Without ``--reraise`` 128 + n (ssh's client would turn a signal into 255 anyway); with
    it the guard itself dies of n, which is what mpirun's "exited on signal 9" and srun's
    "task 1: Killed" report."""
    proc = started(guard_command(["sh", "-c", "kill -9 $$"], reraise=reraise))
    out = _ended(proc)
    assert re.search(rf"^{TAG} pid \d+ on \S+ killed by SIGKILL$", out, re.M), out
    assert proc.returncode == (-signal.SIGKILL if reraise else 128 + signal.SIGKILL)


def test_reraise_passes_an_exit_status_on(started):
    proc = started(guard_command(["sh", "-c", "exit 3"], reraise=True))
    _ended(proc)
    assert proc.returncode == 3


def test_reraise_of_a_signal_the_guard_received_ends_the_group_first(started):
    """mpirun's orted and slurmstepd end a task with SIGTERM: the guard ends the command's
    whole group, then dies of SIGTERM itself."""
    proc = started(guard_command(_GROUP, reraise=True))
    stop = threading.Event()
    _lease(proc, stop)
    try:
        pgid = _started(proc)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        termed = time.monotonic()
        assert proc.wait(timeout=30) == -signal.SIGTERM
        assert time.monotonic() - termed < 2.0
        assert not _group_alive(pgid)
    finally:
        stop.set()


def test_a_lease_over_a_pipe_keeps_the_command_and_its_expiry_ends_the_group(started):
    """stdin a pipe, not a terminal (mpirun --stdin all, srun --input=all): while bytes arrive
    the command runs past the lease timeout; once they stop (the link is cut: no end of file)
    the guard says so and ends the command's whole group within the timeout + its grace."""
    proc = started([sys.executable, "-c", _SHORT_LEASE, *_GROUP])
    stop = threading.Event()
    lease = _lease(proc, stop)
    try:
        pgid = _started(proc)
        time.sleep(2.5)  # 2.5 lease timeouts
        assert proc.poll() is None and _group_alive(pgid, wait=0)
        stop.set()
        lease.join()
        silent = time.monotonic()
        out = _ended(proc)
        took = time.monotonic() - silent
    finally:
        stop.set()
    assert re.search(rf"^{TAG} launcher connection lost \(no word from it for 1 s\); ending "
                     rf"pid {pgid} on \S+$", out, re.M), out
    assert proc.returncode == 1
    assert not _group_alive(pgid)
    # the last byte went out up to 0.2 s (the writer's period) before ``silent``; sh and sleep
    # end on SIGTERM: not GRACE s later
    assert 0.8 <= took < 3.0, took


def test_end_of_file_on_the_pipe_ends_the_group_at_once(started):
    proc = started([sys.executable, "-c", _SHORT_LEASE.replace("1.0", "60.0"), *_GROUP])
    pgid = _started(proc)
    assert proc.stdin is not None
    proc.stdin.close()
    closed = time.monotonic()
    out = _ended(proc)
    took = time.monotonic() - closed
    # an end of file is not "no word for N s": it says what it was
    assert re.search(rf"^{TAG} launcher connection lost \(its input ended\); ending pid "
                     rf"{pgid} on \S+$", out, re.M), out
    assert not _group_alive(pgid)
    assert took < 2.0, took


@pytest.mark.parametrize("reraise", [False, True])
def test_the_launchers_teardown_word_ends_the_group_and_says_teardown(started, reraise):
    """A job torn down on purpose (:meth:`Lease.tear_down` before the launcher signals
    anything, then the end of file): the guard says teardown, not a lost connection, ends the
    command's group at once and ends as a SIGTERM would end it."""
    flag = "reraise=True" if reraise else "reraise=False"
    proc = started([sys.executable, "-c", _SHORT_LEASE.replace("1.0", "60.0")
                    .replace("reraise=True", flag), *_GROUP])
    pgid = _started(proc)
    assert proc.stdin is not None
    proc.stdin.write((LEASE_BYTE + TEARDOWN).decode())
    proc.stdin.flush()
    told = time.monotonic()
    out = _ended(proc)
    assert re.fullmatch(rf"{TAG} the launcher tears the job down; ending pid {pgid} on \S+\n",
                        out), out
    assert proc.returncode == (-signal.SIGTERM if reraise else 128 + signal.SIGTERM)
    assert not _group_alive(pgid) and time.monotonic() - told < 3.0


def test_a_lease_tells_its_guards_of_the_teardown_once():
    r, w = os.pipe()
    lease = Lease()
    with os.fdopen(w, "wb") as pipe:
        lease.add(pipe)
        assert lease.tear_down() and not lease.tear_down()
        lease.close()
    with os.fdopen(r, "rb") as got:
        assert got.read().replace(LEASE_BYTE, b"") == TEARDOWN
    assert not Lease().tear_down()  # no guard to tell


def test_from_first_byte_waits_for_the_lease_to_begin(started):
    """``--from-first-byte`` (mpi: Open MPI 4.1's ``--stdin all`` forwards nothing to ranks on
    mpirun's own host): no byte yet is no expiry; once bytes came and stop, the lease runs out
    as usual."""
    proc = started([sys.executable, "-c", _SHORT_LEASE.replace(
        "reraise=True", "reraise=True, from_first_byte=True"), *_GROUP])
    pgid = _started(proc)
    time.sleep(2.5)  # no byte for 2.5 lease timeouts
    assert proc.poll() is None and _group_alive(pgid, wait=0)
    stop = threading.Event()
    lease = _lease(proc, stop)
    time.sleep(1.0)
    stop.set()
    lease.join()
    out = _ended(proc)
    assert "launcher connection lost" in out, out
    assert proc.returncode == 1 and not _group_alive(pgid)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("from_first_byte", [False, True])
def test_mpirun_stdin_all_gives_a_local_rank_no_byte(from_first_byte):
    """The Open MPI 4.1 fact ``--from-first-byte`` exists for, with the real mpirun: a rank on
    mpirun's own host gets none of the lease bytes written to ``mpirun --stdin all`` (and no end
    of file), so a lease from the start ends it; one from the first byte lets it run to its
    end (mpirun, its parent here, ends it on teardown)."""
    code = _SHORT_LEASE.replace("reraise=True", f"reraise=True, from_first_byte={from_first_byte}")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = subprocess.Popen(
        ["mpirun", "--stdin", "all", "-n", "1", sys.executable, "-c", code, "sleep", "3"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=env, start_new_session=True)
    stop = threading.Event()
    _lease(proc, stop)
    try:
        out = _ended(proc)
    finally:
        stop.set()
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
    if from_first_byte:
        assert proc.returncode == 0, out
    else:
        assert "launcher connection lost (no word from it for 1 s)" in out, out
        assert proc.returncode != 0


def test_a_stopped_command_is_said_with_its_role_and_host_and_its_continuation(started,
                                                                             monkeypatch):
    """SIGSTOP of the command (a server: its DMLC_ROLE): after STOPPED_AFTER s the guard says
    so, which GuardReport keeps (the watchdog names it); SIGCONT: said too, and forgotten."""
    monkeypatch.setenv("DMLC_ROLE", "server")  # the guard's own environment, as dmlc sets it
    proc = started(guard_command(["sleep", "60"], from_first_byte=True))  # no lease expiry
    assert proc.stdin is not None and proc.stdout is not None
    pid = _started(proc)
    report = GuardReport()
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    line = proc.stdout.readline().rstrip("\n")
    took = time.monotonic() - t0
    assert re.fullmatch(rf"{TAG} server pid {pid} on \S+ stopped", line), line
    assert STOPPED_AFTER <= took < STOPPED_AFTER + 2, took
    assert report.see(line)
    (stopped,) = report.stopped.values()
    assert (stopped.role, stopped.pid) == ("server", pid)
    assert str(stopped).endswith("stopped (SIGSTOP or a debugger)")
    os.kill(pid, signal.SIGCONT)
    line = proc.stdout.readline().rstrip("\n")
    assert re.fullmatch(rf"{TAG} server pid {pid} on \S+ continued", line), line
    assert report.see(line) and report.stopped == {}
    proc.stdin.close()  # end of file: the guard ends the command
    assert proc.wait(10) == 1
