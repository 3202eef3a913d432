"""The slurm backend: dmlc_tracker's ``slurm`` starts two ``srun`` job steps (servers, workers)
inside the current allocation; the nodes are the allocation's.

dmlc's step flags ``srun --share --exclusive=user`` are refused by Slurm >= 20.11, and without
``--overlap`` the server step waits for the worker step to end, which never happens: where srun
knows ``--overlap``, the two flags become ``--overlap`` and both steps run side by side.
``--kill-on-bad-exit=1``: a task that dies ends its step (else srun waits on);
``--input=all``: the guards' lease reaches every task. A failed task is named from srun's own
report (``srun: error: H: task R: Killed``), so the guards ``--reraise``. With server hosts
(``dist.server_hosts``: node names of the allocation) the servers' step runs on them
(``-w``) and the workers' on the other nodes (``-x``): one allocation, two node lists.

A Slurm cancellation (``scancel``, a SIGTERM to ``salloc``) ends the steps and signals the
launcher at about the same time: a failed step first waits a moment for that signal and asks
Slurm whether the allocation is ending, so the cancellation, not the step it ended, is named
(and not restarted). No packet filter: slurmctld, which may run outside the job, calls srun
back on ports in the same ranges.
"""
from __future__ import annotations

import re
import signal
from collections.abc import Sequence

from mxlarge.launcher._supervise import Child
from mxlarge.launcher.backends.base import Spec
from mxlarge.launcher.cluster import DmlcBackend
from mxlarge.launcher.explain import FailureContext, terminated
from mxlarge.launcher.hostfile import HostEntry, Layout, check_server_hosts
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.preflight import HostCheckError
from mxlarge.launcher.restart import Elastic
from mxlarge.launcher.slurm_query import (
    allocation_ending,
    bad_nodes,
    slurm_nodes,
    srun_has_overlap,
)
from mxlarge.plan import World

_SRUN_DMLC_FLAGS = "srun --share --exclusive=user "
# dmlc's step: "srun --share --exclusive=user -N <nodes> -n <tasks> <command>"
_STEP = re.compile(r"srun --share --exclusive=user -N (?P<nodes>\d+) -n (?P<tasks>\d+) ")
# srun: a failed task ends its step; stdin (the lease) to every task (srun's default, stated)
_SRUN_FLAGS = "--kill-on-bad-exit=1 --input=all "
# How long a failed step waits for the launcher's termination signal (module docstring).
_TERMINATION_WAIT = 1.0

REFUSAL = ("not offered for --launcher slurm: slurmctld, which may run on a host outside "
           "the job, calls srun back on ports in the same ranges; use the cluster's own "
           "network policy")


class SlurmBackend(DmlcBackend):
    """``--launcher slurm``."""

    name = "slurm"
    tool = "srun"
    # srun says what happened in strsignal(3)'s words ("Killed") or "Exited with exit code N"
    report_patterns = (
        re.compile(r"srun: error: (?P<host>[^:\s]+): tasks? (?P<rank>\d+)[-,\d]*: "
                   r"(?P<what>.+?)\s*$"),
    )

    def __init__(self) -> None:
        self._overlap = False
        self._homes: list[str] = []  # server hosts: nodes of the allocation for servers only

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> None:
        if hostfile is not None:
            raise ValueError("the slurm launcher takes its nodes from the allocation; "
                             "pass hostfile=None")
        homes = list(dict.fromkeys(server_hosts))
        if homes:
            nodes = slurm_nodes()
            outside = [h for h in homes if h not in nodes]
            if outside:
                have = ", ".join(nodes) or "none: no SLURM_JOB_NODELIST"
                raise ValueError(f"dist.server_hosts: {', '.join(outside)} not among the "
                                 f"allocation's nodes ({have}); expected node names of the "
                                 f"allocation (allocate them with the workers' nodes)")
            check_server_hosts([HostEntry(h, None, None, True) for h in homes], servers,
                               "of dist.server_hosts")
            if len(nodes) == len(homes):
                raise ValueError(f"dist.server_hosts: every node of the allocation "
                                 f"({', '.join(nodes)}) is a server host; expected at least "
                                 f"one node left for the workers")
        self._homes = homes
        return None

    def preflight(self, spec: Spec) -> None:
        """No node of the allocation that Slurm counts as not usable (``HostCheckError``);
        outside an allocation srun itself says why it cannot run."""
        bad = bad_nodes(slurm_nodes())
        if bad:
            node, state = next(iter(bad.items()))
            raise HostCheckError(f"host {node} (the Slurm allocation): Slurm has it {state} "
                                 "(sinfo); nothing started")

    def firewall_refusal(self) -> str | None:
        return REFUSAL

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        raise ValueError("--elastic with --launcher slurm: not built yet: a restart would "
                         "need the steps started so that a lost node does not end the "
                         "allocation (salloc/sbatch --no-kill) and the next steps placed on "
                         "the nodes scontrol shows responding (-w), and neither is done; "
                         "elastic restarts run on local, ssh and mpi launches")

    def guard_flags(self) -> dict[str, bool]:
        return {"reraise": True}

    def hosts(self, entries: list[HostEntry] | None) -> list[str]:
        return slurm_nodes()

    def prepare(self) -> None:
        self._overlap = srun_has_overlap()

    def fix_command(self, command: str) -> str:
        """``--overlap``, ``--kill-on-bad-exit`` and ``--input=all`` (module docstring); with
        server hosts, the servers' step on them (``-w``) and the workers' off them (``-x``)."""
        flags = "srun --overlap " if self._overlap else _SRUN_DMLC_FLAGS
        if self._homes:
            step = _STEP.search(command)
            if step is not None:
                tasks = int(step.group("tasks"))
                nodes = (len(self._homes) if "DMLC_ROLE=server " in command else
                         min(tasks, len(slurm_nodes()) - len(self._homes)))
                where = "-w" if "DMLC_ROLE=server " in command else "-x"
                command = (command[:step.start("nodes")] +
                           f"{nodes} {where} {','.join(self._homes)}" +
                           command[step.end("nodes"):])
        return command.replace(_SRUN_DMLC_FLAGS, flags + _SRUN_FLAGS)

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """The allocation's nodes: with server hosts the servers' and the others."""
        nodes = slurm_nodes()
        others = tuple(n for n in nodes if n not in self._homes)
        return Layout(scheduler, servers, workers, tuple(self._homes) or tuple(nodes), others)

    def before_explain(self, context: FailureContext) -> Outcome | None:
        if context.stop.wait(_TERMINATION_WAIT):
            received = context.received
            return terminated(received[0] if received else signal.SIGTERM, context.host_ip)
        ending = allocation_ending()
        if ending is not None:
            return context.failed(128 + signal.SIGTERM, f"{ending}; job torn down", "launcher",
                                  None, None, context.host_ip, -signal.SIGTERM)
        return None

    def explain(self, context: FailureContext, child: Child) -> Outcome:
        return context.explain_reported(child, "task")
