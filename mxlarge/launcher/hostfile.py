"""Hostfiles as the backends read them: ``host``, ``host:port`` (ssh) or ``host:slots``
(MPICH), ``slots=N``, ``#`` comments.

Each backend states which reading of ``host:N`` it uses and what it requires of the lines
(:meth:`~mxlarge.launcher.backends.base.LaunchBackend.check_hosts`); the parsing and the checks
every backend shares (a file that exists and lists hosts) are here. Importing this module does
not import MXNet.
"""
from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class HostEntry:
    """One host line: ``host``, ``host:port`` (ssh) / ``host:slots`` (MPICH), ``slots=N``."""

    host: str
    port: str | None
    slots: int | None


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
        try:
            for tok in tokens[1:]:
                key, _, value = tok.partition("=")
                if key == "slots":
                    slots = int(value)
            if after:
                if colon == "slots":
                    slots = int(after)
                else:
                    port = str(int(after))
        except ValueError as e:
            raise ValueError(f"hostfile {path}, line {lineno}: cannot parse {line!r}") from e
        if not host:
            raise ValueError(f"hostfile {path}, line {lineno}: no host in {line!r}")
        entries.append(HostEntry(host, port, slots))
    return entries


def listed_hosts(path: str | None, launcher: str, colon: str = "port") -> list[HostEntry]:
    """The lines of the hostfile ``launcher`` was given, checked for what every backend needs.

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
