"""Hostfiles as the backends read them: ``host``, ``host:port`` (ssh) or ``host:slots``
(MPICH), ``slots=N``, ``role=server``, ``#`` comments; and the job's layout
(:class:`Layout`).

A ``role=server`` line (or a host in ``dist.server_hosts`` / ``--server-hosts``,
:func:`with_server_hosts`) is a *server host*: it runs parameter servers only, and the
workers run on the other lines. Without one, servers share the worker hosts (co-located,
MXNet's default). :func:`place` is where each server and worker goes.

Each backend states which reading of ``host:N`` it uses and what it requires of the
lines (:meth:`~mxlarge.launcher.backends.base.LaunchBackend.check_hosts`); the parsing
and the checks every backend shares (a file that exists and lists hosts) are here.
Importing this module does not import MXNet.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROLES = ("worker", "server")


@dataclass(frozen=True)
class HostEntry:
    """One host line: ``host``, ``host:port`` (ssh) / ``host:slots`` (MPICH), ``slots=N``,
    ``role=server`` (``server``: the host runs servers only)."""

    host: str
    port: str | None
    slots: int | None
    server: bool = False


def read_hostfile(path: str, colon: str = "port") -> list[HostEntry]:
    """Parse a hostfile; ``#`` starts a comment. ``colon`` is what ``host:N`` means:
    ``"port"`` (dmlc's ssh backend) or ``"slots"`` (MPICH's hostfiles, for mpirun).

    Raises:
        ValueError: if the file is missing, unreadable or malformed.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise ValueError(f"hostfile {path} cannot be read: {e.strerror}") from e
    entries = []
    for lineno, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        tokens = line.split()
        host, _, after = tokens[0].partition(":")
        slots: int | None = None
        port: str | None = None
        role = "worker"
        try:
            for tok in tokens[1:]:
                key, _, value = tok.partition("=")
                if key == "slots":
                    slots = int(value)
                elif key == "role":
                    role = value
            if after:
                if colon == "slots":
                    slots = int(after)
                else:
                    port = str(int(after))
        except ValueError as e:
            raise ValueError(f"hostfile {path}, line {lineno}: cannot parse {line!r}") from e
        if not host:
            raise ValueError(f"hostfile {path}, line {lineno}: no host in {line!r}")
        if role not in ROLES:
            raise ValueError(f"hostfile {path}, line {lineno}: role={role}: expected "
                             f"role=server or role=worker")
        entries.append(HostEntry(host, port, slots, role == "server"))
    return entries


def listed_hosts(path: str | None, launcher: str, colon: str = "port") -> list[HostEntry]:
    """The lines of the hostfile ``launcher`` was given, checked for what every backend
    needs.

    Raises:
        ValueError: naming the file and what is missing (no file given, none there, no hosts).
    """
    if path is None:
        raise ValueError(f"the {launcher} launcher needs a hostfile (one host per line)")
    if not os.path.isfile(path):
        raise ValueError(f"hostfile {path} does not exist")
    entries = read_hostfile(path, colon)
    if not entries:
        raise ValueError(f"hostfile {path} lists no hosts")
    return entries


def with_server_hosts(entries: Sequence[HostEntry], server_hosts: Sequence[str],
                      source: str) -> list[HostEntry]:
    """The hostfile's lines with ``server_hosts`` (``dist.server_hosts``) as server
    lines: every line of such a host becomes one, a host the file does not list is
    added.

    Raises:
        ValueError: the file has ``role=server`` lines of other hosts (two answers to one
            question), or no worker line is left.
    """
    out = list(entries)
    if server_hosts:
        marked = {e.host for e in out if e.server}
        if marked and marked != set(server_hosts):
            raise ValueError(f"hostfile {source}: role=server lines name "
                             f"{', '.join(sorted(marked))} but dist.server_hosts is "
                             f"{', '.join(server_hosts)}: expected one of the two, or the same "
                             f"hosts")
        out = [dataclasses.replace(e, server=e.host in server_hosts) for e in out]
        out += [HostEntry(h, None, None, True) for h in dict.fromkeys(server_hosts)
                if h not in {e.host for e in out}]
    if any(e.server for e in out) and all(e.server for e in out):
        raise ValueError(f"hostfile {source}: every line is a server host; expected at least "
                         f"one worker line (a line without role=server)")
    return out


def check_server_hosts(entries: Sequence[HostEntry], servers: int, source: str) -> list[str]:
    """The server hosts of ``entries`` (in order, each once), checked against
    ``servers``.

    Raises:
        ValueError: more server hosts than servers (a host would run nothing).
    """
    homes = list(dict.fromkeys(e.host for e in entries if e.server))
    if len(homes) > servers:
        raise ValueError(f"hostfile {source}: {len(homes)} server hosts "
                         f"({', '.join(homes)}) but {servers} server(s): expected -s/--servers "
                         f">= {len(homes)} (each server host runs at least one server)")
    return homes


def place(entries: Sequence[HostEntry], servers: int, workers: int
          ) -> tuple[list[HostEntry], list[HostEntry]]:
    """Where each server and worker goes: (each server's line, each worker's line).

    With server lines (``role=server``), server i goes on server line i mod S and worker
    j on worker line j mod W. Without, dmlc's own round-robin (co-located): process i,
    servers first, on line i mod L of all L lines.
    """
    homes = [e for e in entries if e.server]
    if not homes:
        n = len(entries)
        return ([entries[i % n] for i in range(servers)],
                [entries[(servers + i) % n] for i in range(workers)])
    others = [e for e in entries if not e.server]
    return ([homes[i % len(homes)] for i in range(servers)],
            [others[i % len(others)] for i in range(workers)])


@dataclass(frozen=True)
class Layout:
    """Where a job's processes run: the scheduler's host, the hosts of its ``servers``
    and ``workers`` (in order, each once), and whether the servers have hosts of their
    own."""

    scheduler: str
    servers: int
    workers: int
    server_hosts: tuple[str, ...]
    worker_hosts: tuple[str, ...]

    @property
    def dedicated(self) -> bool:
        """Servers on hosts of their own: no worker host runs a server."""
        return not set(self.server_hosts) & set(self.worker_hosts)

    def describe(self) -> str:
        """The launcher's layout line: where each role runs and what each worker host
        moves per step each way, |g| the gradient's bytes and n the worker hosts: |g|
        with server hosts (it pushes |g| and pulls |g|), 2(n-1)/n·|g| co-located (the
        (n-1)/n of its pushes that leave it, and the slices its server sends to the n-1
        other workers)."""
        where, moves = (("on their own host(s)", "|g|") if self.dedicated else
                        ("co-located with the workers", "2(n-1)/n·|g|"))
        return (f"layout: scheduler on {self.scheduler}; {self.servers} server(s) {where}: "
                f"{', '.join(self.server_hosts)}; {self.workers} worker(s) on "
                f"{', '.join(self.worker_hosts)}; each worker host sends and receives {moves} "
                f"per step")


def layout_of(scheduler: str, server_lines: Sequence[HostEntry],
              worker_lines: Sequence[HostEntry]) -> Layout:
    """The :class:`Layout` of each server's and each worker's line (:func:`place`)."""
    return Layout(scheduler, len(server_lines), len(worker_lines),
                  tuple(dict.fromkeys(e.host for e in server_lines)),
                  tuple(dict.fromkeys(e.host for e in worker_lines)))


def hostfile_text(entries: Iterable[HostEntry]) -> str:
    """``host`` or ``host:port`` lines, one per entry, without comments or slots."""
    return "".join(f"{e.host}:{e.port}\n" if e.port else f"{e.host}\n" for e in entries)


def is_ip(host: str) -> bool:
    """Whether ``host`` is an IP address (not a name)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback IP address."""
    return is_ip(host) and ipaddress.ip_address(host).is_loopback
