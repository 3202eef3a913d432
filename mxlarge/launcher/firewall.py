"""The packet filter of a cluster job: only the job's own hosts reach the job's ports
(nftables).

While a job runs, every host of the job gets one table ``mxlarge_<job id>_<guard pid>``
that rejects new TCP connections to :data:`SCHEDULER_PORTS`, :data:`PS_LITE_PORTS` and
the ephemeral range from any address but the job hosts', and counts those attempts per
port, so that a job reports the ones at its own ports only (another job's table on a
shared host may be the one that refused them); a guard process per host (:data:`GUARD`)
installs it and deletes it when its input ends or its lease stops. ``mode``: ``auto``
where it can, ``on`` or :class:`FirewallError`, ``off``. The table, its lifetime and the
rights it needs: docs/design/firewall.md. Importing this module does not import MXNet.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import queue
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from mxlarge.launcher.guard import LEASE_EVERY
from mxlarge.launcher.reach import PROBE_TIMEOUT, unreachable_hosts

MODES = ("auto", "on", "off")
#: dmlc_tracker's ``PSTracker(port=9091, port_end=9999)``: the scheduler takes the first
#: free one.
SCHEDULER_PORTS = (9091, 9998)
#: ps-lite's ``ZMQVan::Bind`` retries ``10000 + rand() % 40000`` when its first port is
#: taken.
PS_LITE_PORTS = (10000, 49999)
# How long a guard may take to report and to install (ssh login included).
_TIMEOUT = 30.0
_REMOVE_TIMEOUT = 10.0  # a host that does not answer is left to the next job (stale)
_CONFIRM_FIRST = 1.0  # then a host that has not confirmed is probed (_close)

# $0 and $1 are "mxlarge-guard" and the job id: they are in the guard's command line,
# which is how a later guard on the same host tells a live table (its guard runs) from a
# stale one.
GUARD = r"""PATH=$PATH:/usr/sbin:/sbin
t=mxlarge_$1_$$
ours='s/^table ip \(mxlarge_[0-9a-f]*_[0-9]*\)$/\1/p'
for s in $(nft list tables ip 2>/dev/null | sed -n "$ours"); do
  j=${s#mxlarge_}; j=${j%_*}
  tr '\0' ' ' < /proc/${s##*_}/cmdline 2>/dev/null | grep -q " mxlarge-guard $j " ||
    { nft delete table ip "$s" && echo "removed stale $s"; }
done
echo "table $t"
echo "addresses $(ip -4 -o addr show 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4}' |
  tr '\n' ' ')"
echo "ephemeral $(cat /proc/sys/net/ipv4/ip_local_port_range)"
rules=
while IFS= read -r line && [ "$line" != . ]; do rules="$rules$line
"; done
[ -n "$rules" ] || exit 0
printf '%s' "$rules" | nft -f - 2>&1 || exit 3
echo "installed $t"
lost=
while :; do  # the launcher's lease: a byte a second; none for 10 s: it or the link is gone
  b=$(timeout 10 head -c 1) || { lost=1; break; }
  [ -n "$b" ] || break
done
n=$(nft list set ip "$t" refused | tr '\n' ' ' | grep -o '[0-9]* counter packets [0-9]*' |
  awk '{printf "%s:%s ", $1, $4}')
nft delete table ip "$t" && echo "removed $t rejected $n"
# the lease lost over ssh: our sshd session would wait for a client that is gone
[ -n "$lost" ] && [ "$(cat /proc/$PPID/comm 2>/dev/null)" = sshd ] && kill "$PPID"
"""


class FirewallError(RuntimeError):
    """The packet filter cannot be installed on a host (the message names it and why)."""


@dataclass(frozen=True)
class Host:
    """Where a guard runs: ``prefix`` is the argv that runs a command there (empty: here)."""

    name: str
    prefix: tuple[str, ...] = ()
    port: int | None = None  # its ssh port (a remote host: what the removal probes)

    @classmethod
    def ssh(cls, host: str, port: str | None = None) -> Host:
        """A host reached as dmlc's ssh backend reaches it (BatchMode: never a prompt)."""
        return cls(host, ("ssh", "-o", "StrictHostKeyChecking=no", "-o", "BatchMode=yes",
                          "-p", port or "22", host), int(port or 22))


def local_refusal() -> str | None:
    """Why the filter cannot be installed from this process, or ``None``."""
    if os.geteuid() != 0:
        return "the launcher does not run as root (nft needs CAP_NET_ADMIN)"
    if shutil.which("nft") is None and not os.path.exists("/usr/sbin/nft"):
        return "nft is not installed here (Debian: apt-get install nftables)"
    return None


#: Why there is nothing to filter for a job whose every process is on 127.0.0.1.
LOOPBACK_ONLY = ("a local job listens on 127.0.0.1 only: nothing outside this machine reaches "
                 "its ports, so there is nothing to filter")


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted union of inclusive port ranges, overlapping or adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def ruleset(table: str, allowed: Sequence[str], ports: Sequence[tuple[int, int]]) -> str:
    """The nft script of the module docstring for one host: a chain that counts new
    connections from outside the job's hosts per port (set ``refused``), before every
    job's chain that rejects them (a base chain that rejects ends the packet's way through the
    others: a count there would miss what another job's table refused first)."""
    spans = ", ".join(f"{lo}-{hi}" if lo != hi else str(lo) for lo, hi in merge_ranges(ports))
    outside = ('    iif "lo" accept\n'
               "    ct state established,related accept\n"
               "    ip saddr @job_hosts accept\n")
    return (f"table ip {table} {{\n"
            f"  set job_hosts {{ type ipv4_addr; elements = {{ {', '.join(allowed)} }} }}\n"
            "  set refused { type inet_service; flags dynamic; size 65536; counter; }\n"
            "  chain count {\n"
            "    type filter hook input priority filter - 20; policy accept;\n"
            f"{outside}"
            f"    tcp dport {{ {spans} }} ct state new add @refused {{ tcp dport }}\n"
            "  }\n"
            "  chain input {\n"
            "    type filter hook input priority filter - 10; policy accept;\n"
            f"{outside}"
            f"    tcp dport {{ {spans} }} reject with tcp reset\n"
            "  }\n"
            "}\n")


def refusals(said: str, addresses: Collection[str], own: Collection[str]) -> tuple[int, bool]:
    """The connection attempts a host's guard counted at the job's own ports: ``said``
    is its ``port:attempts ...`` (:data:`GUARD`), ``addresses`` the host's, ``own`` the
    job's processes' ``ip:port``. Returns (the sum, whether the job's ports there were
    known; if not, the sum over every port)."""
    counted = {int(p): int(n) for p, _, n in (x.partition(":") for x in said.split()) if n}
    mine = {int(a.rsplit(":", 1)[1]) for a in own if a.rsplit(":", 1)[0] in addresses}
    if not mine:
        return sum(counted.values()), False
    return sum(n for p, n in counted.items() if p in mine), True


class _Guard:
    """One host's guard process and the lines it prints."""

    def __init__(self, host: Host, job_id: str) -> None:
        self.host = host
        cmd = ["sh", "-c", GUARD, "mxlarge-guard", job_id]
        argv = [*host.prefix, shlex.join(cmd)] if host.prefix else cmd
        # Its own session: a Ctrl-C or the job's teardown must not kill it before it
        # cleans up.
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.said: list[str] = []
        self.addresses: list[str] = []  # the host's, as its guard reported them
        threading.Thread(target=self._read, daemon=True, name=f"guard {host.name}").start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, emit: Callable[[str], None]) -> str:
        """The rest of the next line starting with ``word``; raises on the guard's end."""
        while True:
            try:
                line = self.lines.get(timeout=_TIMEOUT)
            except queue.Empty:
                raise FirewallError(f"{self.host.name}: no answer from the packet filter's "
                                    f"guard within {_TIMEOUT:g} s") from None
            if line is None:
                rc = self.proc.wait()
                said = "; ".join(self.said[-5:]) or f"exit status {rc}"
                raise FirewallError(f"{self.host.name}: {said}")
            if line.startswith(word + " "):
                return line[len(word) + 1:]
            if line.startswith("removed stale "):
                emit(f"packet filter: {self.host.name}: {line} (its job's guard is gone)")
            else:
                self.said.append(line)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def beat(self) -> None:
        """One byte of the lease (:data:`GUARD` ends the table without one for 10 s)."""
        with contextlib.suppress(OSError, ValueError):
            self.send(".")

    def end_input(self) -> None:
        """End of file for the guard: it removes its table and exits."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()

    def finish(self, emit: Callable[[str], None], timeout: float = _REMOVE_TIMEOUT,
               cut: str | None = None, own: Collection[str] = ()) -> None:
        """Wait for the guard (after :meth:`end_input`) up to ``timeout`` s, not at all
        for a host found ``cut`` off (why); report what it removed and the attempts at
        the job's own ports (``own``, :func:`refusals`) it refused."""
        try:
            if cut is not None:
                raise subprocess.TimeoutExpired(self.proc.args, 0)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # e.g. the host is cut off: a later job cleans up
            self.proc.kill()
            self.proc.wait()
            said = (f"is cut off ({cut}): not waiting for it to confirm the removal" if cut
                    else f"did not confirm the removal within {_REMOVE_TIMEOUT:g} s")
            emit(f"packet filter: {self.host.name} {said}; its guard removes the table 10 s "
                 "after its last word from here, else the next job there or `python -m "
                 "mxlarge.launcher.firewall clean`")
        while (line := self._next()) is not None:
            if line.startswith("removed mxlarge_"):
                table, _, said = line[len("removed "):].partition(" rejected")
                n, known = refusals(said, self.addresses, own)
                emit(f"packet filter removed from {self.host.name} ({table}; {n} connection "
                     "attempt(s) from outside the job refused" + (
                         "" if known else " at any job's ports there: the job's own were "
                         "not known") + ")")
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def _next(self) -> str | None:
        try:
            return self.lines.get(timeout=5)
        except queue.Empty:
            return None


@contextlib.contextmanager
def packet_filter(job_id: str, hosts: Sequence[Host], scheduler_ports: tuple[int, int],
                  emit: Callable[[str], None], cut: Mapping[str, str] | None = None,
                  own: Collection[str] = ()) -> Iterator[list[str]]:
    """The job's filter on every host of ``hosts`` while the block runs; yields the
    allowed addresses. Removed when the block ends, however it ends (see the module
    docstring); a host in ``cut`` (found not answering during the job: why) is not
    waited for; the attempts reported are those at ``own``, the job's processes'
    ``ip:port`` (filled while it runs).

    Raises:
        FirewallError: a host could not take it; then it is on none of them.
    """
    guards: list[_Guard] = []
    try:
        for host in hosts:
            guards.append(_Guard(host, job_id))
        heads = [(g.expect("table", emit), g.expect("addresses", emit).split(),
                  g.expect("ephemeral", emit).split()) for g in guards]
        for g, (_, addresses, _) in zip(guards, heads):
            g.addresses = addresses
        allowed = sorted({a for _, addrs, _ in heads for a in addrs if not a.startswith("127.")},
                         key=lambda a: tuple(map(int, a.split("."))))
        if not allowed:
            raise FirewallError("no host reported an IPv4 address (is `ip` installed?)")
        spans = []
        for g, (table, _, eph) in zip(guards, heads):
            spans = merge_ranges([scheduler_ports, PS_LITE_PORTS, (int(eph[0]), int(eph[1]))])
            g.send(ruleset(table, allowed, spans) + ".\n")
        for g in guards:
            g.expect("installed", emit)
    except BaseException:
        _close(guards, emit)
        raise
    ports = ", ".join(f"{lo}-{hi}" for lo, hi in spans)
    emit(f"packet filter: on {', '.join(h.name for h in hosts)}, new TCP connections to ports "
         f"{ports} only from the job's hosts ({', '.join(allowed)}) while the job runs "
         f"(nftables tables ip mxlarge_{job_id}_*)")
    stop = threading.Event()
    lease = threading.Thread(target=_lease, args=(guards, stop), daemon=True,
                             name="packet filter lease")
    lease.start()
    try:
        yield allowed
    finally:
        stop.set()
        lease.join(LEASE_EVERY + 1)
        _close(guards, emit, cut or {}, own)


def _lease(guards: Sequence[_Guard], stop: threading.Event) -> None:
    while not stop.wait(LEASE_EVERY):
        for g in guards:
            g.beat()


def _close(guards: Sequence[_Guard], emit: Callable[[str], None],
           known: Mapping[str, str] | None = None, own: Collection[str] = ()) -> None:
    """End every guard at once (a slow host does not hold up the others); a host
    ``known`` not to answer is not waited for, nor is a remote one that has not
    confirmed within :data:`_CONFIRM_FIRST` s and does not answer a probe (it cannot
    answer: the cut-off host's guard ends itself by its lease)."""
    known = dict(known or {})
    for g in guards:
        g.end_input()
    deadline = time.monotonic() + _CONFIRM_FIRST
    for g in guards:
        if g.host.name not in known:
            with contextlib.suppress(subprocess.TimeoutExpired):
                g.proc.wait(max(0.0, deadline - time.monotonic()))
    slow = {g.host.name: g.host.port for g in guards if g.proc.poll() is None
            and g.host.port is not None and g.host.name not in known}
    cut = {**known, **(unreachable_hosts(slow) if slow else {})}
    rest = _REMOVE_TIMEOUT - _CONFIRM_FIRST - (PROBE_TIMEOUT if slow else 0.0)
    for g in guards:
        g.finish(emit, max(0.0, rest), cut.get(g.host.name), own)


@contextlib.contextmanager
def job_filter(mode: str, refused: str | None, job_id: str, hosts: Sequence[Host],
               scheduler_ports: tuple[int, int], emit: Callable[[str], None],
               loopback: bool = False, cut: Mapping[str, str] | None = None,
               own: Collection[str] = ()) -> Iterator[list[str] | None]:
    """:func:`packet_filter` as ``mode`` asks (see the module docstring); yields the allowed
    addresses, or ``None`` when the job runs without a filter (``auto`` says why in a line).
    ``refused``: why the job's backend is not offered the filter (its
    :meth:`~mxlarge.launcher.backends.base.LaunchBackend.firewall_refusal`); ``loopback``:
    every process of the job is on 127.0.0.1 (:data:`LOOPBACK_ONLY`, nothing said); ``cut``
    and ``own``: the hosts found not answering during the job and the job's processes'
    addresses, as :func:`packet_filter` takes them.

    Raises:
        ValueError: an unknown mode.
        FirewallError: ``mode="on"`` where the filter cannot be had (the reason).
    """
    if mode not in MODES:
        raise ValueError(f"firewall mode {mode!r}: expected one of {', '.join(MODES)}")
    if loopback:
        refused = LOOPBACK_ONLY
    why = None if mode == "off" else (refused or local_refusal())
    if why is not None and mode == "on":
        raise FirewallError(f"--firewall on: {why}")
    with contextlib.ExitStack() as stack:
        allowed = None
        if why is not None and not loopback:
            emit(f"packet filter: off ({why}); the job's ports take connections from anywhere "
                 f"(see 'Who can reach a job' in docs/security.md)")
        elif why is None and mode != "off":
            try:
                allowed = stack.enter_context(packet_filter(job_id, hosts, scheduler_ports,
                                                            emit, cut, own))
            except FirewallError as e:
                if mode == "on":
                    raise
                emit(f"packet filter: off ({e}); the job's ports take connections from "
                     "anywhere (see 'Who can reach a job' in docs/security.md)")
        yield allowed


def main(argv: list[str] | None = None) -> int:
    """``python -m mxlarge.launcher.firewall clean [HOST[:SSH_PORT] ...]``: remove the stale
    ``mxlarge_*`` tables (their guard is gone) here and on those hosts (over ssh, as root);
    tables of running jobs stay."""
    p = argparse.ArgumentParser(prog="python -m mxlarge.launcher.firewall",
                                description=main.__doc__)
    p.add_argument("verb", choices=["clean"])
    p.add_argument("hosts", nargs="*", metavar="HOST[:SSH_PORT]")
    a = p.parse_args(argv)
    hosts = [Host("this host")] + [Host.ssh(*h.split(":", 1)) for h in a.hosts]
    failed = 0
    for host in hosts:  # a guard that gets end of file before any rules removes stale ones only
        guard = _Guard(host, "0")
        try:
            guard.expect("ephemeral", print)
        except FirewallError as e:
            print(f"mxlarge.launcher.firewall: {e}", file=sys.stderr)
            failed = 1
        _close([guard], print)
    return failed


if __name__ == "__main__":
    sys.exit(main())
