"""The pre-flight check of a cluster job: every host answers, is the host its name says,
and can take the packet filter when ``--firewall on`` asks for it, before any run or
process starts.

Without it an unreachable or misnamed host is found only once the job runs: the packet
filter's guard cannot reach it and ``--firewall auto`` switches the filter off for every
host, the other hosts' processes start, and the job dies 20-40 s later with ssh's status
255 (and a FAILED run). The check is one short probe of every host at once
(:func:`check_hosts`): a TCP connect to its ssh port
(:func:`mxlarge.launcher.reach.unreachable_hosts`), then one ``ssh host`` that reports
the host's IPv4 addresses, whether ``nft`` is there and whether it runs as root. A host
fails it when it does not answer, when ssh does not let the probe through, or when the
address its name has here is not one of its own addresses (a stale ``/etc/hosts`` line,
a typo'd address that belongs to another machine: ps-lite would bind an address the host
does not have). The scheduler's address (``--host-ip``) must be an address of the
launching host.

Jobs whose every host is loopback (the tests' fake clusters) are not probed, as they get
no packet filter: there is no other host. Importing this module does not import MXNet.
"""
from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from mxlarge.launcher.hostfile import is_ip, is_loopback
from mxlarge.launcher.reach import (
    PROBE_TIMEOUT,
    SSH_PROBE_TIMEOUT,
    each_host,
    ssh_run,
    unreachable_hosts,
)

# What the probe prints on the host: "addr A" per IPv4 address, "nft" if nft is there,
# "uid N".
_FACTS = ("PATH=$PATH:/usr/sbin:/sbin; "
          "ip -4 -o addr show 2>/dev/null | awk '{sub(/\\/.*/, \"\", $4); print \"addr \" $4}'; "
          "command -v nft >/dev/null 2>&1 && echo nft; echo uid $(id -u)")


class HostCheckError(ValueError):
    """A host failed the pre-flight check (the message names it and why); nothing started."""


@dataclass(frozen=True)
class HostFacts:
    """What the probe found on one host."""

    addresses: frozenset[str]
    nft: bool
    root: bool


def host_facts(host: str, port: int = 22, timeout: float = SSH_PROBE_TIMEOUT
               ) -> HostFacts | str:
    """The facts of ``host`` from one ``ssh -p port host`` (non-interactive), or why ssh
    did not give them within ``timeout`` s."""
    r = ssh_run(host, port, _FACTS, timeout)
    if isinstance(r, str):
        return f"ssh: {r}"
    if r.returncode != 0:
        said = r.stderr.strip().splitlines()
        return f"ssh exited with status {r.returncode}" + (f" ({said[-1]})" if said else "")
    words = [line.split() for line in r.stdout.splitlines() if line.strip()]
    return HostFacts(frozenset(w[1] for w in words if w[0] == "addr" and len(w) == 2),
                     ["nft"] in words, ["uid", "0"] in words)


def _address_here(host: str) -> str | None:
    """The IPv4 address ``host`` has from this host (itself, for an address)."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(host)
    return None


def local_address(address: str) -> bool:
    """Whether ``address`` is one of this host's own (a socket can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:
                return False
            raise
    return True


def check_hosts(hosts: Mapping[str, int], where: str, *, firewall: str = "off",
                host_ip: str | None = None, ssh: bool = True) -> None:
    """The module docstring's check of ``hosts`` (``{host: ssh port}``, as listed in
    ``where``: the hostfile or the allocation) and of the scheduler's ``host_ip``; with
    ``ssh=False`` (mpirun told to reach its hosts otherwise) only the connect.

    Raises:
        HostCheckError: the first failing host (in the given order), with the reason.
    """
    if host_ip is not None and is_ip(host_ip) and not local_address(host_ip):
        raise HostCheckError(f"--host-ip {host_ip}: not an address of this host (the scheduler "
                             "binds it here)")
    if all(is_loopback(h) for h in hosts):
        return
    silent = unreachable_hosts(hosts, PROBE_TIMEOUT)
    for h in hosts:
        if h in silent:
            raise HostCheckError(f"host {h} ({where}): {silent[h]}; nothing started")
    if not ssh:
        return
    facts: dict[str, HostFacts | str] = {}

    def probe(host: str, port: int) -> str | None:
        facts[host] = host_facts(host, port)
        return None

    late = each_host(hosts, probe, SSH_PROBE_TIMEOUT)
    for h in hosts:
        found = facts.get(h, late.get(h, "no verdict"))
        if isinstance(found, str):
            raise HostCheckError(f"host {h} ({where}): {found}; nothing started")
        address = _address_here(h)
        if address is None:
            raise HostCheckError(f"host {h} ({where}): the name does not resolve here; "
                                 "nothing started")
        # 127.x is on the host's loopback, whatever `ip` lists (Debian names itself
        # 127.0.1.1)
        if address not in found.addresses and not is_loopback(address):
            raise HostCheckError(
                f"host {h} ({where}): {address} is not an address of the host that answers "
                f"there (its addresses: {', '.join(sorted(found.addresses)) or 'none'}); "
                "nothing started")
        if firewall == "on" and not (found.nft and found.root):
            why = "nft is not installed there" if not found.nft else "ssh logs in as non-root"
            raise HostCheckError(f"host {h} ({where}): --firewall on: {why} (nft needs root); "
                                 "nothing started")
