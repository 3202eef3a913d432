"""Tests of mxlarge.launcher with real scheduler/server/worker processes on 127.0.0.1.

Every job runs ``tests/scripts/kv_worker.py`` (a real dist_sync push/pull) and carries a unique
marker in its environment, so that a scan of /proc can prove no process of the job is left behind.
Cluster backends run against fake ``ssh``/``mpirun``/``srun``/``sbatch`` executables that
record their argv and then start the processes locally, so the dmlc_tracker code paths run for
real over loopback.
"""
from __future__ import annotations

import importlib.util
import inspect
import ipaddress
import json
import mmap
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from mxlarge.launcher import (
    JobSpec,
    Outcome,
    PortInUseError,
    free_port,
    run_job,
    run_local,
    tracker_compat,
)
from mxlarge.launcher.child import process_label
from mxlarge.plan import World

PY = sys.executable
WORKER = str(Path(__file__).resolve().parents[1] / "scripts" / "kv_worker.py")
REPO = Path(__file__).resolve().parents[2]
MARKER_VAR = "MXLARGE_TEST_MARKER"


# --------------------------------------------------------------------------- helpers

class Collector:
    """A thread-safe text stream that remembers each line and when it arrived."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = ""
        self.lines: list[tuple[float, str]] = []

    def write(self, s: str) -> int:
        with self._lock:
            self._buf += s
            *complete, self._buf = self._buf.split("\n")
            now = time.monotonic()
            self.lines.extend((now, line) for line in complete)
        return len(s)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        with self._lock:
            return "\n".join(line for _, line in self.lines)

    def count(self, pattern: str) -> int:
        with self._lock:
            return sum(bool(re.search(pattern, line)) for _, line in self.lines)

    def first_time(self, pattern: str) -> float:
        with self._lock:
            return next(t for t, line in self.lines if re.search(pattern, line))


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def marked_processes(marker: str) -> dict[int, dict[str, str]]:
    """Live processes whose environment or command line contains ``marker``."""
    found = {}
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if needle in environ or needle in cmdline:
            env = dict(kv.split("=", 1) for kv in environ.decode(errors="replace").split("\0")
                       if "=" in kv)
            found[int(entry)] = env
    return found


def assert_no_leftovers(marker: str, timeout: float = 5.0) -> None:
    # The launcher has reaped every group leader when it returns; allow a moment for the kernel
    # to finish tearing down a process that was SIGKILLed.
    wait_until(lambda: not marked_processes(marker), timeout,
               f"no process with {marker} (left: {marked_processes(marker)})")


def _proc_net_addr(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hexaddr)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1])
    # /proc/net/tcp6 prints four 32-bit words, each in host (little-endian) byte order.
    return ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))


def listening_sockets(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state owned by ``pids``."""
    inode_pid = {}
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", target)
            if m:
                inode_pid[m.group(1)] = pid
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for row in f:
                cols = row.split()
                local, state, inode = cols[1], cols[3], cols[9]
                if state == "0A" and inode in inode_pid:  # 0A == TCP_LISTEN
                    addr, port = local.split(":")
                    out.append((inode_pid[inode], str(_proc_net_addr(addr)), int(port, 16)))
    return out


def launch_index_of_rank(out: Collector, rank: int) -> int:
    """The launch index of kvstore rank ``rank``, from its line, which its label names by that
    rank (``[worker 1]``, ``[worker 1 (launch 0)]``: child.process_label)."""
    m = re.search(rf"^\[worker {rank}(?: \(launch (\d+)\))?\] kv_worker rank={rank} num_workers",
                  out.text(), re.M)
    assert m, out.text()
    return rank if m.group(1) is None else int(m.group(1))


@pytest.fixture
def marker() -> str:
    return f"mxlt-{uuid.uuid4().hex}"


# --------------------------------------------------------------------------- local jobs

@pytest.mark.timeout(120)
@pytest.mark.parametrize("servers", [1, 2])
def test_local_job_pushes_and_pulls_correct_sums(servers: int, marker: str) -> None:
    out = Collector()
    # With 2 servers, a tiny big-array bound makes every key sliced across both servers.
    env = {MARKER_VAR: marker, "MXNET_KVSTORE_BIGARRAY_BOUND": "4" if servers > 1 else "1000000"}
    outcome = run_local([PY, WORKER, "--size", "8"], workers=2, servers=servers, env=env,
                        output=out)
    text = out.text()
    assert outcome == Outcome(0, outcome.message), text
    assert "exited 0" in outcome.message
    for rank in (0, 1):  # each line under its rank's label
        assert re.search(rf"^\[worker {rank}(?: \(launch [01]\))?\] kv_worker sum OK "
                         rf"rank={rank}$", text, re.M), text
    assert out.count("MISMATCH") == 0
    assert re.search(r"^\[scheduler\] kv_worker start role=scheduler", text, re.M)
    for i in range(servers):  # at import, before ps-lite assigned a rank to one of several
        label = f"server {i}" if servers == 1 else rf"server \(launch {i}\)"
        assert re.search(rf"^\[{label}\] kv_worker start role=server local_rank={i}$",
                         text, re.M), text
    assert {launch_index_of_rank(out, 0), launch_index_of_rank(out, 1)} == {0, 1}
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_worker_exit_code_fails_the_job(marker: str) -> None:
    out = Collector()
    outcome = run_local([PY, WORKER, "--exit-code", "3", "--exit-rank", "1", "--sleep", "60"],
                        workers=2, servers=1, env={MARKER_VAR: marker}, output=out)
    returned = time.monotonic()
    index = launch_index_of_rank(out, 1)
    assert outcome.exit_code == 3
    assert (outcome.failure.role, outcome.failure.launch_index, outcome.failure.status) == \
        ("worker", index, 3)
    assert outcome.failure.kvstore_rank == 1
    assert outcome.message == f"{process_label('worker', 1, index)} exited with status 3"
    assert returned - out.first_time(r"kv_worker exiting with 3") < 30
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_worker_exception_under_fail_fast_fails_the_job(marker: str) -> None:
    out = Collector()
    outcome = run_local([PY, WORKER, "--raise-rank", "1", "--sleep", "60"], workers=2,
                        servers=1, env={MARKER_VAR: marker}, output=out)
    returned = time.monotonic()
    index = launch_index_of_rank(out, 1)
    assert (outcome.exit_code, outcome.failure.role, outcome.failure.launch_index,
            outcome.failure.status) == (1, "worker", index, 1), out.text()
    assert re.search(rf"^\[{re.escape(process_label('worker', 1, index))}\] RuntimeError: "
                     "kv_worker raising", out.text(), re.M)
    assert returned - out.first_time("RuntimeError: kv_worker raising") < 30
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_pinned_worker_exception_without_fail_fast_never_exits(marker: str) -> None:
    """MXNet 1.9.1: the raising worker waits in ps-lite's exit barrier for the other worker,
    which waits in pull for the raising one: nothing exits. If this starts failing, the
    fail_fast requirement in mxlarge.protocol.failfast can be revisited. Also covers SIGTERM to
    a launcher running in-process."""
    out = Collector()
    seen: dict[str, object] = {}

    def observe_then_interrupt() -> None:
        try:
            wait_until(lambda: out.count("RuntimeError: kv_worker raising") == 1, 60,
                       "the traceback")
            time.sleep(5)
            seen["alive"] = sorted(e.get("DMLC_ROLE", "?")
                                   for e in marked_processes(marker).values())
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            seen["error"] = e
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by run_local in the main thread

    handler_before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=observe_then_interrupt, daemon=True)
    thread.start()
    outcome = run_local([PY, WORKER, "--raise-rank", "1", "--no-fail-fast"], workers=2,
                        servers=1, env={MARKER_VAR: marker}, output=out, grace=5.0)
    thread.join(5)
    if "error" in seen:
        raise seen["error"]  # type: ignore[misc]
    assert seen["alive"] == ["scheduler", "server", "worker", "worker"]
    assert outcome == Outcome(143, "launcher received SIGTERM; job torn down")
    assert signal.getsignal(signal.SIGTERM) == handler_before
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("role", "index"), [("worker", 1), ("server", 0)])
def test_kill_9_mid_run_tears_down_and_sockets_are_loopback_only(role: str, index: int,
                                                                 marker: str) -> None:
    out = Collector()
    seen: dict[str, object] = {}

    def killer() -> None:
        try:
            wait_until(lambda: out.count(r"kv_worker ready") == 2, 60, "both workers ready")
            procs = marked_processes(marker)
            seen["roles"] = sorted(e.get("DMLC_ROLE", "?") for e in procs.values())
            seen["sockets"] = listening_sockets(list(procs))
            victim = next(pid for pid, e in procs.items()
                          if e.get("MXLARGE_ROLE") == role
                          and e.get("MXLARGE_LOCAL_RANK") == str(index))
            seen["killed_at"] = time.monotonic()
            os.kill(victim, signal.SIGKILL)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            seen["error"] = e

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    outcome = run_local([PY, WORKER, "--sleep", "90"], workers=2, servers=1,
                        env={MARKER_VAR: marker}, output=out, grace=5.0)
    returned = time.monotonic()
    thread.join(5)
    if "error" in seen:
        raise seen["error"]  # type: ignore[misc]
    assert seen["roles"] == ["scheduler", "server", "worker", "worker"]
    sockets = seen["sockets"]
    assert isinstance(sockets, list)
    assert len(sockets) >= 4, sockets  # scheduler, server, 2 workers each listen once
    assert all(ipaddress.ip_address(addr).is_loopback for _, addr, _ in sockets), sockets
    assert outcome.exit_code == 128 + 9
    f = outcome.failure
    assert (f.role, f.launch_index, f.status) == (role, index, -9)
    assert f.kvstore_rank in (0, 1)  # its label, message and artifact name it by it
    assert outcome.message == f"{process_label(role, f.kvstore_rank, index)} exited with " \
                              "signal 9 (SIGKILL)"
    assert returned - seen["killed_at"] < 30  # type: ignore[operator]
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_exception_inside_the_launcher_leaves_no_process(marker: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import mxlarge.launcher.backends.local as local

    out = Collector()

    def broken_supervise(*_args: object, **_kwargs: object) -> Outcome:
        wait_until(lambda: out.count(r"kv_worker ready") == 2, 60, "both workers ready")
        raise RuntimeError("bug in the launcher")

    monkeypatch.setattr(local, "supervise", broken_supervise)
    with pytest.raises(RuntimeError, match="bug in the launcher"):
        run_local([PY, WORKER, "--sleep", "90"], workers=2, servers=1,
                  env={MARKER_VAR: marker}, output=out, grace=5.0)
    assert_no_leftovers(marker)


@pytest.mark.timeout(60)
def test_hanging_servers_are_stopped_after_the_workers_succeed(marker: str) -> None:
    # No MXNet here: workers and the scheduler exit 0 at once, the server hangs in a grandchild.
    script = 'if [ "$DMLC_ROLE" = server ]; then sleep 60; else echo $DMLC_ROLE done; fi'
    out = Collector()
    started = time.monotonic()
    outcome = run_local(["sh", "-c", script], workers=2, servers=1, env={MARKER_VAR: marker},
                        output=out, grace=1.0, shutdown_timeout=1.0)
    assert time.monotonic() - started < 15
    assert outcome.exit_code == 0 and outcome.failure is None
    assert "server 0 did not exit within 1 s and were stopped" in outcome.message
    assert out.count(r"^\[worker \(launch [01]\)\] worker done$") == 2  # no rank: no store
    assert out.count(re.escape(outcome.message)) == 1  # the launcher's line, once
    assert_no_leftovers(marker)


@pytest.mark.timeout(60)
def test_workers_that_never_joined_are_named_at_once(marker: str) -> None:
    """Workers exit 0 while the scheduler still waits for them (a command that never creates a
    dist store; here sh, the scheduler and server wait like ps-lite's): said within seconds,
    not after the 30 s shutdown timeout, exit 1, once."""
    script = 'if [ "$DMLC_ROLE" = worker ]; then echo worker done; else sleep 60; fi'
    out = Collector()
    started = time.monotonic()
    outcome = run_local(["sh", "-c", script], workers=2, servers=1, env={MARKER_VAR: marker},
                        output=out, grace=1.0)
    assert time.monotonic() - started < 15
    assert outcome.exit_code == 1 and outcome.reason is None  # not a fault to restart
    assert outcome.message.startswith("no worker joined the parameter server: all 2 workers "
                                      "exited 0 while the scheduler still waited for them")
    assert out.count(re.escape(outcome.message)) == 1
    assert_no_leftovers(marker)


@pytest.mark.timeout(30)
def test_port_in_use_fails_before_starting_anything(marker: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        out = Collector()
        with pytest.raises(PortInUseError, match=rf"port {port}\b"):
            run_local([PY, WORKER], workers=2, servers=1, port=port,
                      env={MARKER_VAR: marker}, output=out)
    assert out.text() == ""
    assert not marked_processes(marker)


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_local_argument_validation() -> None:
    with pytest.raises(ValueError, match="workers"):
        run_local([PY, WORKER], workers=0, servers=1)
    with pytest.raises(ValueError, match="servers"):
        run_local([PY, WORKER], workers=1, servers=0)
    with pytest.raises(ValueError, match="DMLC_ROLE"):
        run_local([PY, WORKER], workers=1, servers=1, env={"DMLC_ROLE": "worker"})
    with pytest.raises(ValueError, match="empty"):
        run_local([], workers=1, servers=1)


@pytest.mark.timeout(120)
def test_sigterm_to_launcher_tears_the_job_down(marker: str) -> None:
    proc = subprocess.Popen(
        [PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "1", "--grace", "5",
         "--env", f"{MARKER_VAR}={marker}", "--", PY, WORKER, "--sleep", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    out = Collector()
    reader = threading.Thread(target=lambda: [out.write(line) for line in proc.stdout or []],
                              daemon=True)
    reader.start()
    try:
        wait_until(lambda: out.count(r"kv_worker ready") == 2, 60, "both workers ready")
        # The launcher's own command line carries the marker too.
        assert len(set(marked_processes(marker)) - {proc.pid}) == 4
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        assert time.monotonic() - sent < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
    assert rc == 128 + signal.SIGTERM, out.text()
    assert "launcher received SIGTERM" in out.text()
    assert_no_leftovers(marker)


# --------------------------------------------------------------------------- cluster backends

def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


_FAKE_HEAD = """#!@PY@
import json, os, subprocess, sys
LOG = @LOG@
CLEAN = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}
def record(tool, **more):
    with open(LOG, "a") as f:
        f.write(json.dumps(dict(tool=tool, argv=sys.argv[1:], **more)) + "\\n")
def run_copies(n, cmd, env_for):
    # Relay each copy's output line by line, as srun/mpirun do; a shared pipe would let
    # unbuffered writes of different ranks interleave within a line.
    import threading
    lock = threading.Lock()
    def relay(stream):
        for line in iter(stream.readline, b""):
            with lock:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
        stream.close()
    procs = [subprocess.Popen(cmd, env=env_for(i), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(n)]
    def copy_stdin():  # to every copy, as mpirun --stdin all and srun --input=all do
        for data in iter(lambda: os.read(0, 4096), b""):
            for p in procs:
                try:
                    p.stdin.write(data); p.stdin.flush()
                except OSError:
                    pass
        for p in procs:
            try:
                p.stdin.close()
            except OSError:
                pass
    threading.Thread(target=copy_stdin, daemon=True).start()
    relays = [threading.Thread(target=relay, args=(p.stdout,)) for p in procs]
    for t in relays:
        t.start()
    rcs = [p.wait() for p in procs]
    for t in relays:
        t.join()
    bad = [rc for rc in rcs if rc]
    sys.exit((bad[0] if bad[0] > 0 else 1) if bad else 0)
"""

# ssh: run the remote command with sh -c in a *clean* environment, as sshd would, so that only
# what the command line carries reaches the job.
_FAKE_SSH = _FAKE_HEAD + """
record("ssh")
args, host, port, i = sys.argv[1:], None, "22", 0
rest = []
while i < len(args):
    if args[i] == "-o":
        i += 2
    elif args[i] == "-tt":
        i += 1
    elif args[i] == "-p":
        port = args[i + 1]; i += 2
    elif host is None:
        host = args[i]; i += 1
    else:
        rest.append(args[i]); i += 1
assert host in ("127.0.0.1", "localhost"), host
os.execve("/bin/sh", ["sh", "-c", " ".join(rest)], CLEAN)
"""

# mpirun (Open MPI flavour): -n N, -x K=V, --hostfile H, then the program; ranks get only the -x
# variables, like remote ranks would.
_FAKE_MPIRUN = _FAKE_HEAD + """
record("mpirun")
args = sys.argv[1:]
if args == ["--version"]:
    print("mpirun (Open MPI) 4.1.2")
    sys.exit(0)
n, xs, i = 1, {}, 0
while i < len(args):
    if args[i] in ("-n", "-np"):
        n = int(args[i + 1]); i += 2
    elif args[i] == "-x":
        k, _, v = args[i + 1].partition("="); xs[k] = v; i += 2
    elif args[i] in ("--hostfile", "--stdin"):
        i += 2
    elif args[i] == "--mca":
        i += 3
    else:
        break
run_copies(n, args[i:], lambda r: {**CLEAN, **xs, "OMPI_COMM_WORLD_RANK": str(r)})
"""

# srun: -N/-n and flags, then the program; tasks inherit srun's environment (--export=ALL).
_FAKE_SRUN = _FAKE_HEAD + """
record("srun", env={k: v for k, v in os.environ.items() if k.startswith("DMLC_")})
args, n, i = sys.argv[1:], 1, 0
while i < len(args) and args[i].startswith("-"):
    if args[i] in ("-n", "-N"):
        if args[i] == "-n":
            n = int(args[i + 1])
        i += 2
    else:
        i += 1
run_copies(n, args[i:], lambda r: {**os.environ, "SLURM_PROCID": str(r)})
"""

# sbatch: run the batch script right here (a real sbatch would queue it) on a 2-node "allocation".
_FAKE_SBATCH = _FAKE_HEAD + """
record("sbatch")
env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2"}
sys.exit(subprocess.call(["bash", *sys.argv[1:]], env=env))
"""


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake cluster tools first on PATH; returns the JSON-lines log they append to."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.jsonl"
    for name, text in (("ssh", _FAKE_SSH), ("mpirun", _FAKE_MPIRUN), ("srun", _FAKE_SRUN),
                       ("sbatch", _FAKE_SBATCH)):
        _write_exe(bindir / name, text.replace("@PY@", PY).replace("@LOG@", repr(str(log))))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    # Something to forward: a PYTHONPATH the remote side would not have otherwise.
    pythonpath = tmp_path / "pp"
    pythonpath.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(pythonpath))
    monkeypatch.delenv("DMLC_INTERFACE", raising=False)
    return log


def calls(log: Path, tool: str) -> list[dict]:
    if not log.exists():
        return []
    return [c for c in map(json.loads, log.read_text().splitlines()) if c["tool"] == tool]


REPORT = ["--report-env", "PYTHONPATH,MLFLOW_RUN_ID,DMLC_NUM_WORKER,DMLC_NUM_SERVER"]


def assert_workers_saw(out: str, **expected: str) -> None:
    for name, value in expected.items():
        got = re.findall(rf"^\[worker[^\]]*\] kv_worker env {name}=(.*)$", out, re.M)
        assert got == [value, value], (name, got, out)


@pytest.mark.timeout(120)
def test_ssh_backend_runs_a_real_job_over_loopback(fakes: Path, tmp_path: Path,
                                                  marker: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("# two entries for one machine\n127.0.0.1:2222\n\n127.0.0.1  # default port\n")
    out = Collector()
    rc = run_job(JobSpec("ssh", [PY, WORKER, *REPORT], World(2), 1, hostfile=str(hosts),
                         env={"MLFLOW_RUN_ID": "run-ssh", MARKER_VAR: marker},
                         host_ip="127.0.0.1"), out).exit_code
    text = out.text()
    assert rc == 0, text
    for rank in (0, 1):
        assert re.search(rf"^\[worker {rank}(?: \(launch \d\))? via ssh [^\]]+\] kv_worker "
                         rf"sum OK rank={rank}$", text, re.M), text
    assert_workers_saw(text, PYTHONPATH=os.environ["PYTHONPATH"], MLFLOW_RUN_ID="run-ssh",
                       DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1")
    ssh = calls(fakes, "ssh")
    assert len(ssh) == 3
    # ssh -tt -o ServerAliveInterval=3 -o ServerAliveCountMax=3 -o StrictHostKeyChecking=no
    # HOST -p PORT 'REMOTE COMMAND' (-tt, keepalives: see backends/ssh.py)
    assert all(c["argv"][:5] == ["-tt", "-o", "ServerAliveInterval=3", "-o",
                                 "ServerAliveCountMax=3"] for c in ssh), ssh
    for c in ssh:
        del c["argv"][1:5]
    assert all(c["argv"][3] == "127.0.0.1" and c["argv"][4] == "-p" for c in ssh), ssh
    remote = [c["argv"][-1] for c in ssh]
    # dmlc: process i goes to host line i % len(hosts), the server first, so it gets line 0.
    ports = {re.search(r"export DMLC_ROLE=(\w+);", c["argv"][-1]).group(1) + c["argv"][5]
             for c in ssh}
    assert sorted(c["argv"][5] for c in ssh) == ["22", "2222", "2222"]
    assert "server2222" in ports
    assert sorted(re.search(r"export DMLC_ROLE=(\w+);", r).group(1) for r in remote) == \
        ["server", "worker", "worker"]
    for r in remote:
        for needle in ("export DMLC_NUM_WORKER=2;", "export DMLC_NUM_SERVER=1;",
                       "export DMLC_PS_ROOT_URI=127.0.0.1;", "export DMLC_NODE_HOST=127.0.0.1;",
                       f"PYTHONPATH={os.environ['PYTHONPATH']}", "MLFLOW_RUN_ID=run-ssh"):
            assert needle in r, (needle, r)
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_ssh_backend_worker_failure_tears_down(fakes: Path, tmp_path: Path,
                                              marker: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n127.0.0.1\n")
    out = Collector()
    started = time.monotonic()
    rc = run_job(JobSpec("ssh", [PY, WORKER, "--exit-code", "3", "--exit-rank", "0",
                                 "--sleep", "90"],
                         World(2), 1, hostfile=str(hosts), env={MARKER_VAR: marker},
                         host_ip="127.0.0.1", grace=5.0), out).exit_code
    returned = time.monotonic()
    assert rc == 3, out.text()
    # the kvstore rank from the scheduler's assignment, the host from the ssh target
    assert re.search(r"^\[launcher\] worker rank \d on 127\.0\.0\.1 exited with status 3",
                     out.text(), re.M), out.text()
    assert returned - out.first_time("kv_worker exiting with 3") < 30
    assert returned - started < 90
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_mpi_backend_runs_a_real_job_over_loopback(fakes: Path, tmp_path: Path,
                                                  marker: str) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=2\n")
    out = Collector()
    rc = run_job(JobSpec("mpi", [PY, WORKER, *REPORT], World(2), 1, hostfile=str(hosts),
                         env={"MLFLOW_RUN_ID": "run-mpi", "DMLC_INTERFACE": "lo",
                              MARKER_VAR: marker},
                         host_ip="127.0.0.1"), out).exit_code
    text = out.text()
    assert rc == 0, text
    for rank in (0, 1):
        assert re.search(rf"^\[workers via mpirun\] kv_worker sum OK rank={rank}$", text, re.M)
    mpirun = calls(fakes, "mpirun")
    # dmlc asks for the MPI flavour once per mpirun it builds.
    assert [c["argv"] for c in mpirun if c["argv"] == ["--version"]] == [["--version"]] * 2
    runs = {}
    for c in (c for c in mpirun if c["argv"] != ["--version"]):
        argv = c["argv"]
        xs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-x")
        runs[xs["DMLC_ROLE"]] = (argv, xs)
    assert set(runs) == {"worker", "server"}
    for role, n in (("worker", "2"), ("server", "1")):
        argv, xs = runs[role]
        assert argv[argv.index("-n") + 1] == n
        assert argv[argv.index("--hostfile") + 1] == str(hosts)
        assert (xs["DMLC_NUM_WORKER"], xs["DMLC_NUM_SERVER"]) == ("2", "1")
        assert xs["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        prog = argv[argv.index("--hostfile") + 2:]
        assert prog[0] == "env" and f"PYTHONPATH={os.environ['PYTHONPATH']}" in prog
        assert "DMLC_INTERFACE=lo" in prog and prog[-len(REPORT):] == REPORT
    # The fake mpirun gives ranks a clean environment: these came through the command line.
    assert_workers_saw(text, PYTHONPATH=os.environ["PYTHONPATH"], MLFLOW_RUN_ID="run-mpi",
                       DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1")
    assert_no_leftovers(marker)


@pytest.mark.timeout(120)
def test_slurm_sbatch_template_runs_a_real_job(fakes: Path, marker: str) -> None:
    """The template's ``python -m mxlarge.launcher`` logs into the run ``MLFLOW_RUN_ID`` names
    (one of the store's), and every process gets that id through srun."""
    from mlflow.tracking import MlflowClient

    store = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run_id = store.create_run(store.create_experiment("sbatch")).info.run_id
    env = {**os.environ, "MXLARGE_PYTHON": PY, "MXLARGE_WORKERS": "2", "MXLARGE_SERVERS": "1",
           "MXLARGE_HOST_IP": "127.0.0.1", "DMLC_INTERFACE": "lo",
           "MLFLOW_RUN_ID": run_id, MARKER_VAR: marker}
    proc = subprocess.run(["sbatch", str(REPO / "launch" / "slurm.sbatch"), "--", PY, WORKER,
                           *REPORT], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=100)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    for rank in (0, 1):
        assert re.search(rf"^\[workers via srun\] kv_worker sum OK rank={rank}$", text, re.M)
    assert_workers_saw(text, PYTHONPATH=os.environ["PYTHONPATH"], MLFLOW_RUN_ID=run_id,
                       DMLC_NUM_WORKER="2", DMLC_NUM_SERVER="1")
    assert store.get_run(run_id).data.params["launcher"] == "slurm"
    srun = {c["env"]["DMLC_ROLE"]: c for c in calls(fakes, "srun") if c["argv"] != ["--help"]}
    assert set(srun) == {"worker", "server"}
    for role, n in (("worker", "2"), ("server", "1")):
        argv, denv = srun[role]["argv"], srun[role]["env"]
        assert argv[argv.index("-n") + 1] == n and argv[argv.index("-N") + 1] == n
        assert (denv["DMLC_NUM_WORKER"], denv["DMLC_NUM_SERVER"]) == ("2", "1")
        assert denv["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert denv["DMLC_JOB_CLUSTER"] == "slurm"
        prog = argv[next(i for i, a in enumerate(argv) if not a.startswith("-")
                         and argv[i - 1] not in ("-n", "-N")):]
        assert prog[0] == "env" and f"MLFLOW_RUN_ID={run_id}" in prog
    assert calls(fakes, "sbatch")[0]["argv"][0].endswith("slurm.sbatch")
    assert_no_leftovers(marker)


# --------------------------------------------------------------------------- validation, facts

def test_cluster_argument_validation(fakes: Path, tmp_path: Path) -> None:
    cmd = [PY, WORKER]
    with pytest.raises(ValueError, match="needs a hostfile"):
        run_job(JobSpec("ssh", cmd, World(2), 1, hostfile=None))
    missing = tmp_path / "nope"
    with pytest.raises(ValueError, match=f"hostfile {missing} does not exist"):
        run_job(JobSpec("mpi", cmd, World(2), 1, hostfile=str(missing)))
    empty = tmp_path / "empty"
    empty.write_text("# only a comment\n\n")
    with pytest.raises(ValueError, match=f"hostfile {empty} lists no hosts"):
        run_job(JobSpec("ssh", cmd, World(2), 1, hostfile=str(empty)))
    named = tmp_path / "named"
    named.write_text("node1\nnode2\n")
    with pytest.raises(ValueError, match=r"needs IP addresses, not names \(node1, node2\)"):
        run_job(JobSpec("ssh", cmd, World(2), 1, hostfile=str(named)))
    one = tmp_path / "one"
    one.write_text("10.0.0.1\n")
    with pytest.raises(ValueError, match=rf"hostfile {one} lists 1 host\(s\) but 2 workers"):
        run_job(JobSpec("ssh", cmd, World(2), 1, hostfile=str(one)))
    with pytest.raises(ValueError, match=rf"hostfile {one} provides 1 slot\(s\).*need 3"):
        run_job(JobSpec("mpi", cmd, World(3), 1, hostfile=str(one)))
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_job(JobSpec("ssh", cmd, World(0), 1, hostfile=str(one)))
    with pytest.raises(ValueError, match="allocation"):
        run_job(JobSpec("slurm", cmd, World(1), 1, hostfile=str(one)))
    with pytest.raises(ValueError, match="DMLC_ROLE"):
        run_job(JobSpec("ssh", cmd, World(1), 1, hostfile=str(one), env={"DMLC_ROLE": "worker"}))
    with pytest.raises(ValueError, match="single quote"):
        run_job(JobSpec("ssh", [*cmd, "it's"], World(1), 1, hostfile=str(one)))
    with pytest.raises(ValueError, match="host_ip must be an IP address"):
        run_job(JobSpec("ssh", cmd, World(1), 1, hostfile=str(one), host_ip="login-node"))
    with pytest.raises(ValueError, match="for cluster launchers"):
        run_job(JobSpec("local", cmd, World(1), 1, hostfile=str(one)))
    assert calls(fakes, "ssh") == [] and calls(fakes, "mpirun") == []


def test_sge_and_yarn_are_refused_with_reasons() -> None:
    with pytest.raises(ValueError, match="logdir"):
        run_job(JobSpec("sge", [PY, WORKER], World(1), 1))
    with pytest.raises(ValueError, match="dmlc-yarn.jar"):
        run_job(JobSpec("yarn", [PY, WORKER], World(1), 1))


def test_pinned_dmlc_tracker_facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reasons behind the compat layer and the refusals; if one fails, revisit them."""
    from dmlc_tracker import mpi, opts, sge, slurm, ssh, tracker

    mxnet_spec = importlib.util.find_spec("mxnet")  # locate, without importing, the library
    assert mxnet_spec is not None and mxnet_spec.origin is not None

    # Python >= 3.9 has no Thread.isAlive, and the tracker still calls it (and setDaemon).
    assert not hasattr(threading.Thread, "isAlive")
    assert "isAlive()" in inspect.getsource(tracker)
    assert "setDaemon(True)" in inspect.getsource(tracker)
    set_daemon = threading.Thread.setDaemon
    with tracker_compat(), tracker_compat():
        assert threading.Thread.isAlive is threading.Thread.is_alive  # type: ignore[attr-defined]
        assert threading.Thread.setDaemon is not set_daemon
    assert not hasattr(threading.Thread, "isAlive")
    assert threading.Thread.setDaemon is set_daemon

    # Only the ssh backend passes --host-ip on to the tracker (hence scheduler_address).
    assert "hostIP=args.host_ip" in inspect.getsource(ssh)
    assert "hostIP" not in inspect.getsource(mpi) and "hostIP" not in inspect.getsource(slurm)

    # ps-lite in libmxnet.so reads DMLC_NODE_HOST/DMLC_INTERFACE; there is no DMLC_WORKER_ID.
    lib = Path(mxnet_spec.origin).with_name("libmxnet.so")  # type: ignore[arg-type]
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for name in (b"DMLC_NODE_HOST", b"DMLC_INTERFACE", b"DMLC_PS_ROOT_URI", b"DMLC_RANK"):
            assert m.find(name + b"\0") >= 0, name
        assert m.find(b"DMLC_WORKER_ID") < 0

    # sge.submit dies on an option its own parser never defines, before calling qsub.
    monkeypatch.chdir(tmp_path)
    args = opts.get_opts(["--cluster", "sge", "--num-workers", "1", "--num-servers", "1", "x"])
    with pytest.raises(AttributeError, match="logdir"):
        sge.submit(args)

    # yarn: the jar is not in the wheel and the container bootstrap is not executable.
    yarn_jar = Path(args.yarn_app_dir) / "dmlc-yarn.jar"
    assert not yarn_jar.exists()
    assert not os.access(Path(tracker.__file__).with_name("launcher.py"), os.X_OK)


@pytest.mark.timeout(60)
def test_pinned_ps_lite_binds_node_host_without_dns() -> None:
    """Why ssh hostfiles must list IP addresses: a worker with DMLC_NODE_HOST=localhost fails
    to bind before it ever contacts the scheduler."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLC_")}
    env.update({"DMLC_ROLE": "worker", "DMLC_NODE_HOST": "localhost", "DMLC_NUM_WORKER": "1",
                "DMLC_NUM_SERVER": "1", "DMLC_PS_ROOT_URI": "127.0.0.1",
                "DMLC_PS_ROOT_PORT": str(free_port())})
    proc = subprocess.run([PY, "-c", "import mxnet as mx; mx.kv.create('dist_sync')"], env=env,
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode != 0
    assert "bind failed" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mxnet_launch_py_local_job_listens_on_loopback_only(marker: str) -> None:
    """MXNet's launch.py through mxlarge.launcher.mxnet_launch: dmlc's local backend would
    put the scheduler on this host's outward address; every listening socket of the job,
    scheduler included, must be on loopback."""
    env = {**os.environ, MARKER_VAR: marker}
    for k in ("DMLC_NODE_HOST", "DMLC_INTERFACE"):
        env.pop(k, None)
    proc = subprocess.Popen(
        [PY, "-m", "mxlarge.launcher.mxnet_launch", "-n", "2", "-s", "1", "--launcher", "local",
         f"{PY} {WORKER} --sleep 20"], env=env, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    out = Collector()
    reader = threading.Thread(target=lambda: [out.write(line) for line in proc.stdout or []],
                              daemon=True)
    reader.start()
    try:
        wait_until(lambda: out.count(r"kv_worker ready") == 2, 90, "both workers ready")
        procs = marked_processes(marker)
        roles = {pid: e.get("DMLC_ROLE") for pid, e in procs.items()}
        sockets = listening_sockets(list(procs))
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()
    assert rc == 0, out.text()
    listening_roles = sorted(roles[pid] for pid, _, _ in sockets)
    assert listening_roles == ["scheduler", "server", "worker", "worker"], (sockets, roles)
    assert all(ipaddress.ip_address(addr).is_loopback for _, addr, _ in sockets), sockets
    assert_no_leftovers(marker)


def test_failed_rank_and_host_from_mpirun_and_srun_reports() -> None:
    """The lines are what Open MPI 4.1.4 and Slurm 22.05 printed on the namespace testbed
    (tests/cluster) for a rank killed with SIGKILL or exiting 3; the first report counts."""
    from mxlarge.launcher.backends.mpi import MpiBackend
    from mxlarge.launcher.backends.slurm import SlurmBackend
    from mxlarge.launcher.explain import Report as _Report
    from mxlarge.launcher.explain import ReportSink

    mpi = ReportSink(Collector(), MpiBackend.tool.reports)
    mpi.emit("servers via mpirun", "mpirun noticed that process rank 1 with PID 0 on node h2 "
                                   "exited on signal 9 (Killed).")
    mpi.emit("servers via mpirun", "mpirun noticed that process rank 0 with PID 0 on node h1 "
                                   "exited on signal 15 (Terminated).")
    mpi.emit("workers via mpirun", "  Process name: [[37071,1],1]")
    assert mpi.reports == {"servers via mpirun": _Report(1, "h2", -9),
                           "workers via mpirun": _Report(1, None, None)}
    slurm = ReportSink(Collector(), SlurmBackend.tool.reports)
    slurm.emit("workers via srun", "srun: error: h2: task 1: Killed")
    slurm.emit("servers via srun", "srun: error: h1: tasks 0-1: Exited with exit code 3")
    slurm.emit("other via srun", "srun: error: Unable to create step for job 4: busy")
    assert slurm.reports == {"workers via srun": _Report(1, "h2", -9),
                             "servers via srun": _Report(0, "h1", 3)}


@pytest.mark.timeout(60)
def test_launcher_process_settings_per_role_and_the_users_values_win(marker: str) -> None:
    """Local jobs: every role gets glibc's keep-freed-memory thresholds and the big-array bound
    of 100,000; OpenMP threads are 1 for
    the scheduler and servers and cores // workers for each worker; a variable the user sets
    wins; tuning=False adds none. (No MXNet: each role prints its settings and exits.)"""
    from mxlarge.launcher.tuning import COMMON

    names = [*COMMON, "OMP_NUM_THREADS"]
    script = ('echo "$DMLC_ROLE ' + " ".join(f"{n}=${{{n}:-unset}}" for n in names) + '"')
    threads = str(max(1, (os.cpu_count() or 1) // 2))

    def settings(tuning: bool, env: dict[str, str]) -> dict[str, set[str]]:
        out = Collector()
        outcome = run_local(["sh", "-c", script], workers=2, servers=2,
                            env={MARKER_VAR: marker, **env}, output=out, tuning=tuning,
                            shutdown_timeout=5.0)
        assert outcome.exit_code == 0, outcome.message
        seen: dict[str, set[str]] = {}
        for _, line in out.lines:
            # no store, so no kvstore ranks: labelled by the launch index
            m = re.match(r"^\[(?:scheduler|(?:server|worker) \(launch \d\))\] (\w+) (.*)$",
                         line)
            if m:
                seen.setdefault(m.group(1), set()).add(m.group(2))
        assert set(seen) == {"scheduler", "server", "worker"}
        return seen

    malloc = " ".join(f"{k}={v}" for k, v in COMMON.items())
    tuned = settings(True, {})
    assert tuned["scheduler"] == tuned["server"] == {f"{malloc} OMP_NUM_THREADS=1"}
    assert tuned["worker"] == {f"{malloc} OMP_NUM_THREADS={threads}"}
    user = settings(True, {"OMP_NUM_THREADS": "3", "MALLOC_TOP_PAD_": "0"})
    assert all(v == {malloc.replace("536870912", "0") + " OMP_NUM_THREADS=3"}
               for v in user.values())
    plain = settings(False, {})
    if "OMP_NUM_THREADS" not in os.environ and not set(COMMON) & set(os.environ):
        assert all(v == {" ".join(f"{n}=unset" for n in names)} for v in plain.values())
    assert_no_leftovers(marker)
