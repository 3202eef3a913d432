"""The mpi backend: dmlc_tracker's ``mpi`` starts two ``mpirun --hostfile`` calls (servers,
workers) over the same hostfile; mpirun places the ranks and resolves host names itself.

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

import os
import re

from mxlarge.launcher._supervise import Child
from mxlarge.launcher.cluster import DmlcBackend
from mxlarge.launcher.explain import FailureContext
from mxlarge.launcher.hostfile import HostEntry, listed_hosts
from mxlarge.launcher.outcome import Outcome

_MPIRUN_FLAGS = "mpirun --stdin all "
# Same keepalive as the ssh backend's; not added when the user chose mpirun's remote agent or
# its arguments (measured without it: still there 28 s after the job's end, 75 s after a cut).
_MPIRUN_SSH_KEEPALIVE = '--mca plm_rsh_args "-o ServerAliveInterval=3 -o ServerAliveCountMax=3" '
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

    def check_hosts(self, hostfile: str | None, workers: int, servers: int
                    ) -> list[HostEntry]:
        entries = listed_hosts(hostfile, self.name, colon="slots")
        # Workers and servers are two separate mpirun calls over the same hostfile.
        capacity = sum(e.slots if e.slots is not None else 1 for e in entries)
        need = max(workers, servers)
        if capacity < need:
            raise ValueError(
                f"hostfile {hostfile} provides {capacity} slot(s) on {len(entries)} host(s) but "
                f"{workers} workers and {servers} servers need {need} (add slots=N to a line "
                f"to run several processes on one host)")
        return entries

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
        return (_MPIRUN_FLAGS + ("" if chosen else _MPIRUN_SSH_KEEPALIVE) +
                command[len("mpirun "):])

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        return context.explain_reported(child, "mpi rank")
