"""The mpi backend: dmlc_tracker's ``mpi`` starts two ``mpirun --hostfile`` calls (servers,
workers) over the same hostfile; mpirun places the ranks and resolves host names itself.

With server hosts (``role=server`` lines, ``dist.server_hosts``) the servers' mpirun gets a
hostfile of its own (:meth:`MpiBackend.dmlc_hostfile`), the workers' the other lines.

mpirun runs with ``--stdin all`` (otherwise only rank 0 gets the guards' lease; the others'
stdin is /dev/null, an end of file that ends their guards at once), and, unless the user chose
mpirun's remote agent or its arguments, with the ssh backend's keepalive for the ssh clients it
starts its remote daemons with (they sit in process groups of their own, out of the launcher's
teardown: one talking to a cut-off host would outlive the job). A failed rank is named from
mpirun's own report (``process rank R ... on node H exited on signal N``), which is why the
guards ``--reraise``: the report stays what it would be unguarded. Open MPI 4.1's ``--stdin
all`` gives ranks on mpirun's own host no byte, so their lease runs from the first one
(``--from-first-byte``); mpirun, here, ends them itself.
"""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections import Counter
from collections.abc import Sequence

from mxlarge.launcher._supervise import Child
from mxlarge.launcher.cluster import DmlcBackend
from mxlarge.launcher.explain import FailureContext
from mxlarge.launcher.hostfile import (
    HostEntry,
    Layout,
    check_server_hosts,
    layout_of,
    listed_hosts,
    place,
    with_server_hosts,
)
from mxlarge.launcher.outcome import Outcome

_MPIRUN_FLAGS = "mpirun --stdin all "
# Same keepalive as the ssh backend's; not added when the user chose mpirun's remote agent or
# its arguments (measured without it: still there 28 s after the job's end, 75 s after a cut).
_MPIRUN_SSH_KEEPALIVE = '--mca plm_rsh_args "-o ServerAliveInterval=3 -o ServerAliveCountMax=3" '
# dmlc's servers' mpirun (get_mpi_env: Open MPI's -x, MPICH's -env)
_SERVER_ROLE = ("-x DMLC_ROLE=server ", "-env DMLC_ROLE server ")
_MPIRUN_AGENT_VARS = ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_rsh_agent")


class MpiBackend(DmlcBackend):
    """``--launcher mpi``."""

    name = "mpi"
    tool = "mpirun"
    report_patterns = (
        re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) "
                   r"exited on signal (?P<signal>\d+)"),
        re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]"),
    )

    def __init__(self) -> None:
        self._servers = 0
        self._files: tuple[str, str] | None = None  # (workers' hostfile, servers') with homes

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> list[HostEntry]:
        entries = with_server_hosts(listed_hosts(hostfile, self.name, colon="slots"),
                                    server_hosts, str(hostfile))
        homes = check_server_hosts(entries, servers, str(hostfile))
        self._servers = servers
        # Workers and servers are two separate mpirun calls: over the same hostfile, or with
        # server hosts the workers over the other lines and the servers over theirs.
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

    def dmlc_hostfile(self, hostfile: str | None, entries: list[HostEntry] | None,
                      stack: contextlib.ExitStack) -> str | None:
        """With server hosts, two hostfiles: the workers' lines (what dmlc reads) and one line
        per server host with as many slots as servers go there (:meth:`fix_command` gives it
        to the servers' mpirun); else the user's own."""
        if not any(e.server for e in entries or ()):
            return hostfile
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="mxlarge-hosts-"))
        homes = Counter(e.host for e in place(entries or [], self._servers, 0)[0])
        files = (os.path.join(tmp, "workers"), os.path.join(tmp, "servers"))
        texts = ("".join(f"{e.host}" + (f" slots={e.slots}" if e.slots else "") + "\n"
                         for e in entries or () if not e.server),
                 "".join(f"{h} slots={n}\n" for h, n in homes.items()))
        for path, text in zip(files, texts):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        self._files = files
        return files[0]

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """mpirun's by-slot placement: each host's slots in order (a line without ``slots=``
        has one); with server hosts the servers' own file (:meth:`dmlc_hostfile`)."""
        lines = entries or []
        homes = [e for e in lines if e.server]
        others = [e for e in lines if not e.server] if homes else lines
        server_lines = place(lines, servers, 0)[0] if homes else _fill(others, servers)
        return layout_of(scheduler, server_lines, _fill(others, workers))

    def probes_with_ssh(self) -> bool:
        # mpirun reaches its hosts with ssh unless told otherwise
        return not any(v in os.environ for v in _MPIRUN_AGENT_VARS)

    def guard_flags(self) -> dict[str, bool]:
        return {"reraise": True, "from_first_byte": True}

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

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        return context.explain_reported(child, "mpi rank")


def _fill(lines: Sequence[HostEntry], n: int) -> list[HostEntry]:
    """The line of each of ``n`` ranks, mpirun's by-slot mapping (a line's ``slots``, else
    1, in order; round-robin again past the capacity, which the checks do not allow)."""
    slots = [e for e in lines for _ in range(e.slots if e.slots is not None else 1)]
    return [slots[i % len(slots)] for i in range(n)] if slots else []
