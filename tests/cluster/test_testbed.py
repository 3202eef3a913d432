"""The testbed itself: isolated hosts, real ssh, mpirun and Slurm across them, nothing leaves."""
from __future__ import annotations

import errno
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from mxlarge.testbed import NET, Testbed

REPO = Path(__file__).resolve().parents[2]


def on(tb: Testbed, host: str, *cmd: str, cwd: Path | None = None,
       timeout: float = 60) -> str:
    r = subprocess.run(tb.on(host, *cmd), capture_output=True, text=True, timeout=timeout,
                       cwd=cwd or tb.root)
    assert r.returncode == 0, (cmd, r.stdout, r.stderr)
    return r.stdout


def test_hosts_are_isolated_with_only_their_own_range(testbed: Testbed) -> None:
    for h in testbed.hosts:
        assert on(testbed, h, "hostname").strip() == h
        addrs = on(testbed, h, "ip", "-o", "addr", "show").split("\n")
        inet = sorted(line.split()[3] for line in addrs if " inet" in line)
        assert inet == sorted(["127.0.0.1/8", f"{testbed.addr(h)}/24"]), addrs
        routes = [r.strip() for r in on(testbed, h, "ip", "route", "show").splitlines()]
        # the connected /24 only: no default route, nothing else is reachable
        assert routes == [f"{NET}.0/24 dev eth0 proto kernel scope link src {testbed.addr(h)}"]
        assert on(testbed, h, "sysctl", "-n", "net.ipv4.ip_forward").strip() == "0"
        # a per-host /tmp
        on(testbed, h, "sh", "-c", f"echo {h} > /tmp/whoami")
    for h in testbed.hosts:
        assert on(testbed, h, "cat", "/tmp/whoami").strip() == h


def test_root_namespace_cannot_send_to_the_range(testbed: Testbed) -> None:
    """The guard route: from outside a host, the range is unreachable locally (no packet)."""
    with socket.socket() as s, pytest.raises(OSError) as e:
        s.settimeout(5)
        s.connect((testbed.addr("h0"), 22))
    assert e.value.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH), e.value


def test_ssh_mpirun_and_slurm_reach_every_host(testbed: Testbed) -> None:
    assert on(testbed, "h0", "ssh", "h2", "hostname").strip() == "h2"
    assert on(testbed, "h1", "ssh", testbed.addr("h0"), "hostname").strip() == "h0"
    hostfile = testbed.root / "work" / "mpi-hosts"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in testbed.hosts))
    n = str(len(testbed.hosts))
    out = on(testbed, "h0", "mpirun", "-n", n, "--hostfile", str(hostfile), "hostname")
    assert sorted(out.split()) == testbed.hosts
    out = on(testbed, "h0", "srun", "-N", n, "-n", n, "hostname")
    assert sorted(out.split()) == testbed.hosts


def test_without_root_it_says_what_it_needs(testbed: Testbed) -> None:
    """One clear line and exit status 2, nothing created (run as nobody).

    The script (stdlib only) runs from a world-readable copy: the checkout itself may be
    private to root (a clone under ``mktemp -d`` is mode 700, so is pytest's tmp_path)."""
    with tempfile.TemporaryDirectory(prefix="mxlarge-nobody-") as tmp:
        copy = Path(tmp)
        copy.chmod(0o755)
        shutil.copy(REPO / "mxlarge" / "testbed.py", copy / "testbed.py")
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "/usr/bin/python3", str(copy / "testbed.py"), "--root",
                            str(testbed.root / "work" / "not-root"), "up"],
                           capture_output=True, text=True, timeout=60, cwd=copy)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "testbed: error: the cluster testbed needs root: it creates network namespaces and runs "
        "sshd, munged, slurmctld and slurmd"]
    assert not (testbed.root / "work" / "not-root").exists()
