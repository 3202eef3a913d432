"""A real cluster on one Linux box: network namespaces as hosts, real sshd, Open MPI and Slurm.

    python -m mxlarge.testbed up [-n 3]     # as root; installs Debian packages if missing
    python -m mxlarge.testbed on h1 CMD...  # run CMD "on" host h1
    python -m mxlarge.testbed down

Host ``hI`` (I = 0..N-1) is the network namespace ``mxl-hI`` with ``eth0`` = 198.18.0.(10+I)/24
(RFC 2544's benchmarking range) and ``lo``, a veth whose peer sits on bridge ``br0`` in a
namespace of its own (``mxl-net``). Hosts have only the connected /24 route: no default route,
no forwarding, no NAT. The root namespace gets ``unreachable 198.18.0.0/24``, so a packet for
the range sent from outside a host fails locally instead of leaving the machine.

``bin/on hI CMD`` runs CMD as if on hI: in its namespace, under its own hostname (a UTS
namespace), with its own ``/tmp`` and ``/etc/hosts`` (names h0.. resolve to the hosts); the rest
of the file system is shared, like an NFS home. Every client (ssh, mpirun, srun, sbatch,
mxlarge launch) is started through it. Daemons: one sshd per host (root, key only, throwaway
keys), one munged (on h0; its unix socket is on the shared file system), slurmctld on h0 and one
slurmd per host. ``ssh`` on the hosts' PATH is a wrapper with the testbed's client config, and
Open MPI may run as root there (``OMPI_ALLOW_RUN_AS_ROOT``): the testbed runs as root.

Teardown ends only what the testbed started: the pids in its pid files, then whatever is still
running inside its own namespaces; then it removes the namespaces, the route, ``/etc/netns``
entries and its directory. ``up`` and ``down`` are idempotent; ``up`` after a crash tears the
leftovers down first.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NET = "198.18.0"
PREFIX = "mxl-"
BRIDGE_NS = f"{PREFIX}net"
GUARD_ROUTE = f"{NET}.0/24"
DEFAULT_ROOT = Path("/var/tmp/mxlarge-testbed")  # not under /tmp: /tmp is per host
#: Held (flock) by every user of the testbed for as long as it uses it: the cluster tests, the
#: cluster benchmarks. The namespaces have fixed names, so two users would tear down each
#: other's hosts.
LOCK = Path("/var/tmp/mxlarge-testbed.lock")

# Debian 12 packages and one executable that shows each is there.
PACKAGES = {
    "iproute2": "/usr/sbin/ip", "openssh-server": "/usr/sbin/sshd",
    "openssh-client": "/usr/bin/ssh", "openmpi-bin": "/usr/bin/mpirun",
    "slurm-wlm": "/usr/sbin/slurmctld", "munge": "/usr/sbin/munged",
    "util-linux": "/usr/bin/unshare",
    "nftables": "/usr/sbin/nft",  # the jobs' packet filter (mxlarge/launcher/firewall.py)
}


@contextmanager
def exclusive() -> Iterator[None]:
    """Holds :data:`LOCK` (waits for another user of the testbed to finish, saying so)."""
    with open(LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"testbed: waiting for the lock {LOCK} (in use)", file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TestbedError(RuntimeError):
    """The testbed cannot be brought up here (not root, packages, daemons)."""


def _run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def ensure_packages() -> None:
    """Install the missing Debian packages (``apt-get update`` once first); root only.

    Raises:
        TestbedError: not root, or apt-get failed; the message names the packages.
    """
    missing = sorted(p for p, exe in PACKAGES.items() if not os.path.exists(exe))
    if not missing:
        return
    if os.geteuid() != 0:
        raise TestbedError(f"the cluster testbed needs root (network namespaces, sshd, slurmd) "
                           f"and these Debian packages: {' '.join(missing)}; run as root, or "
                           f"apt-get install -y {' '.join(missing)} first")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise TestbedError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")


@dataclass(frozen=True)
class Testbed:
    """N namespace hosts under ``root``; see the module docstring."""

    __test__ = False  # a name starting with "Test", but not a pytest test class

    root: Path = DEFAULT_ROOT
    n: int = 3

    @property
    def hosts(self) -> list[str]:
        return [f"h{i}" for i in range(self.n)]

    @staticmethod
    def addr(host: str) -> str:
        """``h1`` -> ``198.18.0.11``."""
        return f"{NET}.{10 + int(host[1:])}"

    @staticmethod
    def netns(host: str) -> str:
        return PREFIX + host

    def on(self, host: str, *cmd: str) -> list[str]:
        """argv that runs ``cmd`` on ``host``."""
        return [str(self.root / "bin" / "on"), host, *cmd]

    @property
    def slurm_conf(self) -> Path:
        return self.root / "slurm" / "slurm.conf"

    # ----------------------------------------------------------------------------- up

    def up(self) -> None:
        """Bring the cluster up, or leave it as it is if it is already up and healthy."""
        ensure_packages()  # first: without root, its message names the missing packages too
        if os.geteuid() != 0:
            raise TestbedError("the cluster testbed needs root: it creates network namespaces "
                               "and runs sshd, munged, slurmctld and slurmd")
        if self.healthy():
            return
        self.down()
        try:
            self._network()
            self._files()
            self._sshd()
            self._slurm()
            self._wait_idle()
        except BaseException:
            self.down()
            raise

    def healthy(self) -> bool:
        """All namespaces exist, every host's sshd runs and every Slurm node answers idle."""
        if not (self.root / "hostlist").exists() or \
                (self.root / "hostlist").read_text().split() != self.hosts:
            return False
        if not set(map(self.netns, self.hosts)) <= set(our_namespaces()):
            return False
        for h in self.hosts:  # a testbed reused after another session lost an sshd: not healthy
            try:
                pid = int((self.root / "run" / f"sshd-{h}.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                return False
            if not Path(f"/proc/{pid}").exists():
                return False
        r = _run(*self.on("h0", "sinfo", "-h", "-o", "%T"), check=False, timeout=20)
        return r.returncode == 0 and r.stdout.split() == ["idle"]

    def _network(self) -> None:
        # The guard first: from here on, nothing for the range can leave through the default
        # route of the root namespace.
        _run("ip", "route", "replace", "unreachable", GUARD_ROUTE)
        _run("ip", "netns", "add", BRIDGE_NS)
        _run("ip", "-n", BRIDGE_NS, "link", "set", "lo", "up")
        _run("ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", BRIDGE_NS, "link", "set", "br0", "up")
        for i, h in enumerate(self.hosts):
            ns = self.netns(h)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", f"v{i}", "netns", BRIDGE_NS, "type", "veth",
                 "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", BRIDGE_NS, "link", "set", f"v{i}", "master", "br0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            # IPv6 link-local addresses would give every job a second, unplanned network.
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")

    def _files(self) -> None:
        r = self.root
        for d in ("bin", "keys", "run", "log", "munge", "slurm/ctld", "work"):
            (r / d).mkdir(parents=True, exist_ok=True)
        r.chmod(0o755)
        (r / "munge").chmod(0o755)  # munge clients need o+x on the socket's directories
        (r / "keys").chmod(0o700)
        (r / "hostlist").write_text(" ".join(self.hosts) + "\n")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{self.addr(h)} {h}\n" for h in self.hosts)
        for h in self.hosts:
            etc = Path("/etc/netns") / self.netns(h)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts)  # ip netns exec bind-mounts it on /etc/hosts
            tmp = r / "nodes" / h / "tmp"
            tmp.mkdir(parents=True, exist_ok=True)
            tmp.chmod(0o1777)
        # "on hX CMD": the namespace, then a UTS namespace with hostname hX and hX's own /tmp.
        # A checkout under /tmp (mktemp -d) stays visible on every host: bound into the host's
        # own /tmp at the same path before that replaces /tmp.
        repo = Path(__file__).resolve().parents[1]  # the checkout holding this package
        keep = ""
        if repo.is_relative_to("/tmp"):
            inner = f"{r}/nodes/$0/tmp/{repo.relative_to('/tmp')}"
            keep = f'mkdir -p "{inner}" && mount --bind "{repo}" "{inner}" && '
        _write_exe(r / "bin" / "on", f"""#!/bin/sh
# on HOST CMD...: run CMD on a testbed host (network namespace {PREFIX}HOST).
h=$1; shift
export PATH="{r}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" SLURM_CONF="{self.slurm_conf}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec ip netns exec "{PREFIX}$h" unshare --uts sh -c \\
  'hostname "$0" && {keep}mount --rbind "{r}/nodes/$0/tmp" /tmp && exec "$@"' "$h" "$@"
""")
        _write_exe(r / "bin" / "ssh", f'#!/bin/sh\nexec /usr/bin/ssh -F "{r}/ssh_config" "$@"\n')

    def _sshd(self) -> None:
        r = self.root
        session_env = (f"PATH={r}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin "
                       f"SLURM_CONF={self.slurm_conf} "
                       "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
        for name in ("host_key", "id_ed25519"):
            if not (r / "keys" / name).exists():
                _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "mxlarge-testbed",
                     "-f", str(r / "keys" / name))
        shutil.copy(r / "keys" / "id_ed25519.pub", r / "keys" / "authorized_keys")
        (r / "sshd_config").write_text(f"""HostKey {r}/keys/host_key
AuthorizedKeysFile {r}/keys/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
SetEnv {session_env}
""")
        (r / "ssh_config").write_text(f"""Host h* {NET}.*
  User root
  IdentityFile {r}/keys/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
""")
        privsep = Path("/run/sshd")
        if not privsep.exists():
            privsep.mkdir(mode=0o755)
            (r / "run" / "created-run-sshd").touch()
        for h in self.hosts:
            _run(*self.on(h, "/usr/sbin/sshd", "-f", str(r / "sshd_config"),
                          "-o", f"PidFile={r}/run/sshd-{h}.pid", "-E", f"{r}/log/sshd-{h}.log"))

    def _slurm(self) -> None:
        r = self.root
        s = self.root / "slurm"
        key = r / "keys" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
        _run(*self.on("h0", "munged", f"--key-file={key}", f"--socket={r}/munge/munge.sock",
                      f"--pid-file={r}/run/munged.pid", f"--log-file={r}/log/munged.log",
                      f"--seed-file={r}/keys/munged.seed"))
        nodes = "".join(f"NodeName={h} NodeAddr={self.addr(h)}\n" for h in self.hosts)
        self.slurm_conf.write_text(f"""ClusterName=mxltb
SlurmctldHost=h0({self.addr('h0')})
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.sock
StateSaveLocation={s}/ctld
SlurmdSpoolDir={s}/spool-%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=30
KillWait=5
MinJobAge=60
NodeName=DEFAULT CPUs=4 RealMemory=1000 State=UNKNOWN
{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # slurmd 22.05 always initialises a cgroup plugin, and autodetection fails because
        # `ip netns exec` remounts /sys; v1 without automount is loaded and never used
        # (proctrack/linuxproc, task/none): the machine's cgroups are not touched.
        (s / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        _run(*self.on("h0", "slurmctld", "-f", str(self.slurm_conf)))
        for h in self.hosts:
            _run(*self.on(h, "slurmd", "-f", str(self.slurm_conf), "-N", h))

    def _wait_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        answer = "sinfo never ran"  # a timeout <= 0
        while time.monotonic() < deadline:
            r = _run(*self.on("h0", "sinfo", "-h", "-o", "%T"), check=False, timeout=20)
            if r.returncode == 0 and r.stdout.split() == ["idle"]:
                return
            answer = f"{r.stdout}{r.stderr}"
            time.sleep(0.5)
        raise TestbedError(f"Slurm nodes not idle after {timeout:g} s: {answer}; "
                           f"see {self.root}/log")

    # ----------------------------------------------------------------------------- links

    def link(self, host: str, up: bool) -> None:
        """Cut ``host`` off (its ``eth0`` down) or reconnect it, leaving Slurm as it was.

        A host silent to slurmctld for a while is "not responding" to it (DOWN after
        SlurmdTimeout), and slurmctld pings such nodes again only every 100 s: until then an
        allocation that asks for the host waits. So on reconnecting, every slurmd is told to
        register again (``scontrol reconfigure``) and this returns once Slurm sees ``host``
        responding.

        Raises:
            TestbedError: the node still not responding 30 s after the reconnection.
        """
        _run("ip", "-n", self.netns(host), "link", "set", "eth0", "up" if up else "down")
        if not up:
            return
        _run(*self.on("h0", "scontrol", "reconfigure"), check=False, timeout=30)
        deadline = time.monotonic() + 30
        while True:
            r = _run(*self.on("h0", "sinfo", "-h", "-n", host, "-o", "%T"), check=False,
                     timeout=20)
            state = r.stdout.strip()
            if r.returncode == 0 and state and not state.endswith("*") and "down" not in state:
                return
            if time.monotonic() > deadline:
                raise TestbedError(f"Slurm node {host} {state or r.stderr.strip()} 30 s after "
                                   f"its link came back; see {self.root}/log")
            time.sleep(0.5)

    def strays(self, host: str) -> list[str]:
        """``pid cmdline`` of every process in ``host``'s namespace that is not one of the
        testbed's daemons (its pid files): what jobs left there (sshd sessions, shells, step
        daemons, ranks)."""
        daemons = set()
        for pidfile in (self.root / "run").glob("*.pid"):
            with contextlib.suppress(ValueError, IndexError, OSError):
                daemons.add(int(pidfile.read_text().split()[0]))
        pids = _pids_in([self.netns(host)]).get(self.netns(host), [])
        return [f"{p} {_cmdline(p)}" for p in pids if p not in daemons and _cmdline(p) != "?"]

    # ----------------------------------------------------------------------------- down

    def down(self) -> list[str]:
        """Tear everything down; returns what had to be killed as leftovers (for the log)."""
        run = self.root / "run"
        for pidfile in sorted(run.glob("*.pid")) if run.is_dir() else []:
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            except (ValueError, IndexError, ProcessLookupError, PermissionError):
                pass
        namespaces = our_namespaces()
        leftovers: list[str] = []
        deadline = time.monotonic() + 15  # slurmd may wait for a step daemon on a loaded box
        while time.monotonic() < deadline and _pids_in(namespaces):
            time.sleep(0.1)
        for ns, pids in _pids_in(namespaces).items():
            leftovers.append(f"{ns}: {', '.join(f'{p} {_cmdline(p)}' for p in pids)}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _pids_in(namespaces):
            time.sleep(0.1)
        for ns in namespaces:
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        if Path("/etc/netns").is_dir() and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()
        _run("ip", "route", "del", "unreachable", GUARD_ROUTE, check=False)
        if (run / "created-run-sshd").exists():
            shutil.rmtree("/run/sshd", ignore_errors=True)
        shutil.rmtree(self.root, ignore_errors=True)
        return leftovers


def our_namespaces() -> list[str]:
    r = _run("ip", "netns", "list", check=False)
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    return [n for n in names if n.startswith(PREFIX)]


def _pids_in(namespaces: list[str]) -> dict[str, list[int]]:
    out = {}
    for ns in namespaces:
        r = _run("ip", "netns", "pids", ns, check=False)
        pids = [int(p) for p in r.stdout.split()]
        if pids:
            out[ns] = pids
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def _write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxlarge.testbed", description=__doc__
                                .split("\n\n")[0])
    p.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    sub = p.add_subparsers(dest="verb", required=True)
    u = sub.add_parser("up")
    u.add_argument("-n", "--hosts", type=int, default=3)
    sub.add_parser("down")
    o = sub.add_parser("on")
    o.add_argument("host")
    o.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.verb == "up" and not 1 <= a.hosts <= 200:
        p.error(f"-n {a.hosts}: expected 1..200 hosts")
    tb = Testbed(a.root, a.hosts if a.verb == "up" else 3)
    try:
        if a.verb == "up":
            tb.up()
            print(f"up: {', '.join(f'{h}={tb.addr(h)}' for h in tb.hosts)}; run things with "
                  f"{tb.root}/bin/on HOST CMD")
        elif a.verb == "down":
            for line in tb.down():
                print(f"killed leftover processes in {line}")
        else:
            os.execv(tb.on(a.host)[0], [*tb.on(a.host), *a.command])
    except TestbedError as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
