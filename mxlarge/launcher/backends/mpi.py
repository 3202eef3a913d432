"""The mpi backend: dmlc_tracker's ``mpi`` starts two ``mpirun --hostfile`` calls
(servers, workers) over the same hostfile; mpirun places the ranks and resolves host
names itself.

With server hosts (``role=server`` lines, ``dist.server_hosts``) the servers' mpirun
gets a hostfile of its own (:meth:`MpiBackend.prepare`), the workers' the other lines.

mpirun runs with ``--stdin all`` (otherwise only rank 0 gets the guards' lease; the others'
stdin is /dev/null, an end of file that ends their guards at once), and, unless the user chose
mpirun's remote agent or its arguments, with the ssh backend's keepalive for the ssh clients it
starts its remote daemons with (they sit in process groups of their own, out of the launcher's
teardown: one talking to a cut-off host would outlive the job). A failed rank is named from
mpirun's own report (``process rank R ... on node H exited on signal N``), which is why the
guards ``--reraise``: the report stays what it would be unguarded. Open MPI 4.1's ``--stdin
all`` gives ranks on mpirun's own host no byte, so their lease runs from the first one
(``--from-first-byte``); mpirun, here, ends them itself.

An elastic job (``--elastic``) probes the hostfile's hosts with ``ssh host true``, as
mpirun reaches them (:func:`~mxlarge.launcher.backends.ssh.ssh_probe`; refused when the
user chose mpirun's remote agent), and runs a restart from a hostfile of the answering
hosts only (:func:`survivors_hostfile`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Collection, Sequence

from mxlarge.launcher.backends.dmlc import DmlcBackend
from mxlarge.launcher.backends.dmlc_job import Tool
from mxlarge.launcher.backends.ssh import ssh_probe
from mxlarge.launcher.hostfile import (
    HostEntry,
    Layout,
    check_server_hosts,
    layout_of,
    listed_hosts,
    place,
    with_server_hosts,
)
from mxlarge.launcher.restart import Elastic
from mxlarge.plan import World

_MPIRUN_FLAGS = "mpirun --stdin all "
# Same keepalive as the ssh backend's; not added when the user chose mpirun's remote
# agent or its arguments (measured without it: still there 28 s after the job's end, 75
# s after a cut).
_MPIRUN_SSH_KEEPALIVE = '--mca plm_rsh_args "-o ServerAliveInterval=3 -o ServerAliveCountMax=3" '
# dmlc's servers' mpirun (get_mpi_env: Open MPI's -x, MPICH's -env)
_SERVER_ROLE = ("-x DMLC_ROLE=server ", "-env DMLC_ROLE server ")
# mpirun's report of a failed rank
_REPORTS = (re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) "
                       r"exited on signal (?P<signal>\d+)"),
            re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]"))
_MPIRUN_AGENT_VARS = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_rsh_agent")


@functools.cache
def _open_mpi() -> bool:
    """Whether ``mpirun`` is Open MPI's (what dmlc's ``get_mpi_env`` asks too)."""
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False  # dmlc's own mpirun call then fails with its message
    return b"Open MPI" in out


class MpiBackend(DmlcBackend):
    """``--launcher mpi``."""

    name = "mpi"
    # a failed rank is named from mpirun's own report, so the guards --reraise
    # (docstring)
    tool = Tool("mpirun", _REPORTS, "mpi rank", reraise=True, from_first_byte=True)

    def __init__(self) -> None:
        self._servers = 0
        self._files: tuple[str, str] | None = None  # (workers' hostfile, servers') with homes

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> list[HostEntry]:
        entries = with_server_hosts(listed_hosts(hostfile, self.name, colon="slots"),
                                    server_hosts, str(hostfile))
        homes = check_server_hosts(entries, servers, str(hostfile))
        self._servers = servers
        # Workers and servers are two separate mpirun calls: over the same hostfile, or
        # with server hosts the workers over the other lines and the servers over
        # theirs.
        lines = [e for e in entries if not e.server]
        capacity = sum(e.slots if e.slots is not None else 1 for e in lines)
        need = workers if homes else max(workers, servers)
        if capacity < need:
            what = f"{workers} workers" if homes else f"{workers} workers and {servers} servers"
            raise ValueError(
                f"hostfile {hostfile} provides {capacity} slot(s) on {len(lines)} "
                f"{'worker ' if homes else ''}host(s) but {what} need {need} (add slots=N to "
                f"a line to run several processes on one host)")
        return entries

    def prepare(self, hostfile: str | None, entries: list[HostEntry] | None,
                stack: contextlib.ExitStack) -> tuple[str | None, list[str]]:
        """The hosts as listed, and the hostfile mpirun reads: with server hosts two,
        the workers' lines (what dmlc reads) and one line per server host with as many
        slots as servers go there (:meth:`fix_command` gives it to the servers' mpirun).
        Else the user's own, unless Open MPI runs it and a line has no slot count: Open
        MPI gives such a line as many slots as its host has cores, where the job's
        layout (and MPICH) counts one, so mpirun gets a copy with ``slots=1`` there."""
        hosts = [e.host for e in entries or ()]
        if not any(e.server for e in entries or ()):
            if all(e.slots is not None for e in entries or ()) or not _open_mpi():
                return hostfile, hosts
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mxlarge-hosts-"))
            path = os.path.join(tmp, "hosts")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(f"{e.host} slots={e.slots or 1}\n" for e in entries or ()))
            return path, hosts
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mxlarge-hosts-"))
        homes = Counter(e.host for e in place(entries or [], self._servers, 0)[0])
        files = (os.path.join(tmp, "workers"), os.path.join(tmp, "servers"))
        texts = ("".join(f"{e.host} slots={e.slots or 1}\n"
                         for e in entries or () if not e.server),
                 "".join(f"{h} slots={n}\n" for h, n in homes.items()))
        for path, text in zip(files, texts):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        self._files = files
        return files[0], hosts

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """mpirun's by-slot placement (:func:`mpi_slots`)."""
        return layout_of(scheduler, *mpi_slots(entries or [], servers, workers))

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        if local_lost is not None:
            raise ValueError("--local-lost: expected with --launcher local (an mpi job probes "
                             "its hosts with ssh)")
        chosen = [v for v in _MPIRUN_AGENT_VARS if v in os.environ]
        if chosen:
            raise ValueError(f"--elastic with --launcher mpi: {chosen[0]} is set (mpirun's "
                             "remote agent or its arguments), so ssh host true is not how "
                             "mpirun reaches the hosts and cannot tell which of them are "
                             "alive; expected it unset")
        assert lines is not None
        server_lines, worker_lines = mpi_slots(lines, servers, world.processes)
        # port 22: an mpi hostfile has no port column, and mpirun's ssh is given none
        # here
        return Elastic(world, [e.host for e in worker_lines], ssh_probe({}), min_workers,
                       others=[e.host for e in server_lines])

    def attempt_hostfile(self, lines: list[HostEntry] | None, elastic: Elastic,
                         declared_servers: int, servers: int, workers: int) -> str | None:
        if lines is None or not elastic.lost:
            return None
        return survivors_hostfile(lines, elastic.declared.processes, elastic.answering,
                                  servers, workers)

    def probes_with_ssh(self) -> bool:
        # mpirun reaches its hosts with ssh unless told otherwise
        return not any(v in os.environ for v in _MPIRUN_AGENT_VARS)

    def fix_command(self, command: str) -> str:
        """``--stdin all`` and the keepalive (module docstring)."""
        if not command.startswith("mpirun "):
            return command
        chosen = any(v in os.environ for v in _MPIRUN_AGENT_VARS)
        if self._files is not None and any(r in command for r in _SERVER_ROLE):
            # the servers' mpirun: their own hosts' file
            command = command.replace(f"--hostfile {self._files[0]} ",
                                      f"--hostfile {self._files[1]} ", 1)
        return (_MPIRUN_FLAGS + ("" if chosen else _MPIRUN_SSH_KEEPALIVE) +
                command[len("mpirun "):])


def mpi_slots(lines: Sequence[HostEntry], servers: int, workers: int
              ) -> tuple[list[HostEntry], list[HostEntry]]:
    """Where mpirun puts a job: (each server's line, each worker's line). Each of the
    two mpiruns fills its hosts' slots in order (:func:`_fill`); with server hosts
    (``role=server`` lines) the servers go round-robin over those
    (:func:`~mxlarge.launcher.hostfile.place`, :meth:`MpiBackend.prepare`), the workers
    over the other lines."""
    homes = [e for e in lines if e.server]
    others = [e for e in lines if not e.server] if homes else list(lines)
    server_lines = place(lines, servers, 0)[0] if homes else _fill(others, servers)
    return server_lines, _fill(others, workers)


def survivors_hostfile(lines: Sequence[HostEntry], declared_workers: int,
                       answering: Collection[str], servers: int, workers: int) -> str:
    """The mpi hostfile of an attempt with ``servers`` servers and ``workers`` workers
    on the ``answering`` hosts only. The workers take the first ``workers`` of the
    declared workers' slots (:func:`mpi_slots`) whose host answers: one ``host slots=k``
    line per such host, k its workers, in order, so that mpirun's by-slot fill puts them
    there again. Server hosts that answer stay ``role=server`` lines (at most
    ``servers`` of them); if none does, the servers share the workers' lines, whose last
    gets the slots the servers need beyond the workers' (max(servers, workers) in all;
    after the workers' own, so their fill is as said).

    Raises:
        ValueError: fewer answering worker slots than ``workers`` (the world does not fit).
    """
    declared = mpi_slots(lines, 0, declared_workers)[1]
    live = [e.host for e in declared if e.host in answering]
    if len(live) < workers:
        raise ValueError(f"{workers} worker(s) but {len(live)} answering worker slot(s)")
    slots = Counter(live[:workers])
    homes = [h for h in dict.fromkeys(e.host for e in lines if e.server) if h in answering]
    if not homes:
        last = live[workers - 1]
        slots[last] += max(0, servers - workers)
    text = "".join(f"{h} slots={n}\n" for h, n in slots.items())
    return text + "".join(f"{h} role=server\n" for h in homes[:servers])


def _fill(lines: Sequence[HostEntry], n: int) -> list[HostEntry]:
    """The line of each of ``n`` ranks, mpirun's by-slot mapping (a line's ``slots``,
    else 1, in order; round-robin again past the capacity, which the checks do not
    allow)."""
    slots = [e for e in lines for _ in range(e.slots if e.slots is not None else 1)]
    return [slots[i % len(slots)] for i in range(n)] if slots else []
