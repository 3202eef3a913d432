"""Watch a job's processes from outside: which host (network namespace) each ran in, and where
each listened. The test process sees every namespace's processes through /proc (one kernel)."""
from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mxlarge.testbed import Testbed

# Every ps-lite process of a test's jobs lives for seconds and listens all its life: a sample
# every 0.5 s sees each one, and takes less of the 2-core box from the jobs than one every 0.2 s.
EVERY = 0.5


@dataclass
class Proc:
    """One ps-lite process as seen in /proc."""

    pid: int
    role: str
    host: str | None  # testbed host of its network namespace; None if in no testbed host
    listen: set[str] = field(default_factory=set)  # addresses of its listening TCP sockets
    ports: set[tuple[str, int]] = field(default_factory=set)  # (address, port) of those
    malloc: str | None = None  # its MALLOC_MMAP_THRESHOLD_ (the launcher's tuning reached it)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets in LISTEN state that ``pid`` holds (its own
    namespace's /proc/PID/net/tcp, matched by socket inode)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            m = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            continue
        if m:
            inodes.add(m.group(1))
    out = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        next(f)
        for row in f:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                addr, port = cols[1].split(":")
                out.add((str(ipaddress.IPv4Address(bytes.fromhex(addr)[::-1])), int(port, 16)))
    return out


def job_processes(marker: str, exe: str | None = None) -> list[int]:
    """Live (not zombie) processes with a ``DMLC_ROLE`` whose argv or environment contains
    ``marker``; with ``exe``, only those running that executable (ps-lite processes, not the
    ``srun``/``mpirun``/``ssh`` that carry the same variables, nor the ssh backend's guard,
    ``python -m mxlarge.launcher.guard guard``, which runs the same Python)."""
    real = os.path.realpath(exe) if exe else None
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            # the executable first: one readlink rules out most processes (sshd, shells, ...)
            # before their environment is read
            if real is not None and os.readlink(d / "exe") != real:
                continue
            env = (d / "environ").read_bytes()
            argv = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"DMLC_ROLE=" in env and marker.encode() in env + argv and state != "Z" \
                and b"mxlarge.launcher.guard" not in argv:
            found.append(int(d.name))
    return found


class Observer:
    """Samples a job's processes every :data:`EVERY` s in a thread until :meth:`stop`."""

    def __init__(self, tb: Testbed, marker: str) -> None:
        """Watch the processes of ``sys.executable`` with a ``DMLC_ROLE`` and ``marker``."""
        self.marker = marker
        self.procs: dict[int, Proc] = {}
        self._hosts = {os.stat(f"/run/netns/{tb.netns(h)}").st_ino: h for h in tb.hosts}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in job_processes(self.marker, sys.executable):
                try:
                    p = self.procs.get(pid)
                    if p is None:
                        env = _environ(pid)
                        host = self._hosts.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
                        p = self.procs[pid] = Proc(pid, env.get("DMLC_ROLE", "?"), host)
                        p.malloc = env.get("MALLOC_MMAP_THRESHOLD_")
                    p.ports |= _listening(pid)
                    p.listen |= {addr for addr, _ in p.ports}
                except OSError:
                    continue  # it exited meanwhile
            self._stop.wait(EVERY)

    def stop(self) -> dict[int, Proc]:
        self._stop.set()
        self._thread.join(5)
        return self.procs

    def by_role(self, role: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.role == role]


@dataclass
class Job:
    """A command started on a testbed host, output to a file."""

    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"job still running after {timeout:g} s:\n"
                                 f"{self.text()[-3000:]}") from None


def start(tb: Testbed, host: str, argv: list[str], cwd: Path, log_name: str = "job.log",
          env: dict[str, str] | None = None) -> Job:
    """Start ``argv`` on ``host`` with ``cwd`` (which must be on the shared file system)."""
    log = cwd / log_name
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("DMLC_", "MLFLOW_", "MXLARGE_", "SLURM_"))}
    full.update(env or {})
    with open(log, "wb") as f:
        proc = subprocess.Popen(tb.on(host, *argv), cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=full)
    return Job(proc, log, time.monotonic())


def wait_until(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
