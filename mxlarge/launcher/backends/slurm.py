"""The slurm backend: dmlc_tracker's ``slurm`` starts two ``srun`` job steps (servers,
workers) inside the current allocation; the nodes are the allocation's.

dmlc's step flags ``srun --share --exclusive=user`` are refused by Slurm >= 20.11, and without
``--overlap`` the server step waits for the worker step to end, which never happens: where srun
knows ``--overlap``, the two flags become ``--overlap`` and both steps run side by side.
``--kill-on-bad-exit=1``: a task that dies ends its step (else srun waits on);
``--input=all``: the guards' lease reaches every task. A failed task is named from srun's own
report (``srun: error: H: task R: Killed``), so the guards ``--reraise``. With server hosts
(``dist.server_hosts``: node names of the allocation) the servers' step runs on them
(``-w``) and the workers' on the other nodes (``-x``): one allocation, two node lists.

A Slurm cancellation (``scancel``, a SIGTERM to ``salloc``) ends the steps and signals
the launcher at about the same time: a failed step first waits a moment for that signal
and asks Slurm whether the allocation is ending, so the cancellation, not the step it
ended, is named (and not restarted). No packet filter: slurmctld, which may run outside
the job, calls srun back on ports in the same ranges.

A hostfile (``-H``) names the nodes of the allocation to run on (node names, one per
line): the steps leave the others out (``-x``), and a step with more tasks than its
nodes overcommits (``--overcommit``: the allocation may grant one CPU per node). That is
how an elastic restart (``--elastic``) runs on the survivors: before it, every node of
the job is probed (:func:`~mxlarge.launcher.slurm_query.silent_nodes`: still in the
allocation, usable to Slurm, its slurmd answering), and the restart's hostfile lists the
answering ones. The allocation must outlive a failed node (``salloc``/``sbatch
--no-kill``): without it Slurm ends the allocation once it counts the node down
(``SlurmdTimeout``), the restart with it.
"""
from __future__ import annotations

import contextlib
import re
import signal
from collections.abc import Sequence

from mxlarge.launcher.backends.base import Spec
from mxlarge.launcher.backends.dmlc import DmlcBackend
from mxlarge.launcher.backends.dmlc_job import Tool
from mxlarge.launcher.explain import FailureContext, terminated
from mxlarge.launcher.hostfile import HostEntry, Layout, check_server_hosts, listed_hosts
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.preflight import HostCheckError
from mxlarge.launcher.restart import Elastic
from mxlarge.launcher.slurm_query import (
    allocation_ending,
    bad_nodes,
    silent_nodes,
    slurm_nodes,
    srun_has_overlap,
)
from mxlarge.plan import World

# srun says what happened in strsignal(3)'s words ("Killed") or "Exited with exit code
# N"
_REPORTS = (re.compile(r"srun: error: (?P<host>[^:\s]+): tasks? (?P<rank>\d+)[-,\d]*: "
                       r"(?P<what>.+?)\s*$"),)
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
    # a failed task is named from srun's own report, so the guards --reraise (docstring)
    tool = Tool("srun", _REPORTS, "task", reraise=True)

    def __init__(self) -> None:
        self._overlap = False
        self._nodes: list[str] = []  # the nodes to run on: the allocation's, or the hostfile's
        self._left_out: list[str] = []  # the allocation's other nodes
        self._homes: list[str] = []  # server hosts: nodes of the allocation for servers only

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> None:
        """The nodes to run on (the hostfile's, all nodes of the allocation) and the
        server hosts among them, checked; the steps are placed from them
        (:meth:`fix_command`)."""
        allocation = slurm_nodes()
        have = ", ".join(allocation) or "none: no SLURM_JOB_NODELIST"
        nodes = allocation
        if hostfile is not None:
            entries = listed_hosts(hostfile, self.name)
            odd = next((e for e in entries if e.port or e.slots is not None or e.server), None)
            if odd is not None:
                raise ValueError(f"hostfile {hostfile}: {odd.host}: expected node names only "
                                 f"(the steps' tasks per node are Slurm's; server hosts: "
                                 f"dist.server_hosts)")
            nodes = list(dict.fromkeys(e.host for e in entries))
            outside = [n for n in nodes if n not in allocation]
            if outside:
                raise ValueError(f"hostfile {hostfile}: {', '.join(outside)} not among the "
                                 f"allocation's nodes ({have}); expected nodes to run on, of "
                                 f"the allocation")
        homes = list(dict.fromkeys(server_hosts))
        if homes:
            outside = [h for h in homes if h not in nodes]
            if outside:
                raise ValueError(f"dist.server_hosts: {', '.join(outside)} not among the "
                                 f"allocation's nodes ({have}); expected node names of the "
                                 f"allocation (allocate them with the workers' nodes)")
            check_server_hosts([HostEntry(h, None, None, True) for h in homes], servers,
                               "of dist.server_hosts")
            if len(nodes) == len(homes):
                raise ValueError(f"dist.server_hosts: every node of the allocation "
                                 f"({', '.join(nodes)}) is a server host; expected at least "
                                 f"one node left for the workers")
        self._nodes = nodes
        self._homes = homes
        self._left_out = [n for n in allocation if n not in nodes]
        return None

    def preflight(self, spec: Spec) -> None:
        """No node to run on that Slurm counts as not usable (``HostCheckError``);
        outside an allocation srun itself says why it cannot run."""
        self.check_hosts(spec.hostfile, spec.world.processes, spec.servers, spec.server_hosts)
        bad = bad_nodes(self._nodes)
        if bad:
            node, state = next(iter(bad.items()))
            raise HostCheckError(f"host {node} (the Slurm allocation): Slurm has it {state} "
                                 "(sinfo); nothing started")

    def firewall_refusal(self) -> str | None:
        return REFUSAL

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        """The workers' nodes (one worker each, in the allocation's order) and the
        others, probed with :func:`~mxlarge.launcher.slurm_query.silent_nodes`."""
        if local_lost is not None:
            raise ValueError("--local-lost: expected with --launcher local (a Slurm job asks "
                             "Slurm and each node's slurmd)")
        if not self._nodes:
            raise ValueError("--elastic with --launcher slurm: no Slurm allocation (no "
                             "SLURM_JOB_NODELIST); expected the launch inside salloc --no-kill "
                             "or sbatch --no-kill")
        free = [n for n in self._nodes if n not in self._homes]
        if len(free) < world.processes:
            raise ValueError(f"--elastic with --launcher slurm: {world.processes} workers on "
                             f"{len(free)} worker node(s) ({', '.join(free) or 'none'}); "
                             f"expected a node per worker (srun -N {world.processes})")
        hosts = free[:world.processes]
        return Elastic(world, hosts, _probe, min_workers,
                       others=[n for n in self._nodes if n not in hosts])

    def attempt_hostfile(self, lines: list[HostEntry] | None, elastic: Elastic,
                         declared_servers: int, servers: int, workers: int) -> str | None:
        if not elastic.lost:
            return None
        return "".join(f"{n}\n" for n in self._nodes if n in elastic.answering)

    def prepare(self, hostfile: str | None, entries: list[HostEntry] | None,
                stack: contextlib.ExitStack) -> tuple[str | None, list[str]]:
        """The nodes to run on; whether srun knows ``--overlap`` (:meth:`fix_command`)."""
        self._overlap = srun_has_overlap()
        return hostfile, self._nodes

    def fix_command(self, command: str) -> str:
        """``--overlap``, ``--kill-on-bad-exit`` and ``--input=all`` (module docstring);
        with server hosts, the servers' step on them (``-w``) and the workers' off them
        (``-x``); nodes left out (a hostfile) left out of both (``-x``)."""
        flags = ("srun --overlap " if self._overlap else _SRUN_DMLC_FLAGS) + _SRUN_FLAGS
        step = _STEP.search(command)
        if step is not None and (self._homes or self._left_out):
            tasks = int(step.group("tasks"))
            server = "DMLC_ROLE=server " in command
            if server and self._homes:
                nodes = len(self._homes)
                where = f"-w {','.join(self._homes)}"
            else:
                out = self._left_out + ([] if server else self._homes)
                nodes = min(tasks, len(self._nodes) - (0 if server else len(self._homes)))
                where = f"-x {','.join(out)}"
            if tasks > nodes:
                flags += "--overcommit "
            command = (command[:step.start("nodes")] + f"{nodes} {where}" +
                       command[step.end("nodes"):])
        return command.replace(_SRUN_DMLC_FLAGS, flags)

    def layout(self, entries: list[HostEntry] | None, servers: int, workers: int,
               scheduler: str) -> Layout:
        """The nodes to run on: with server hosts the servers' and the others."""
        others = tuple(n for n in self._nodes if n not in self._homes)
        return Layout(scheduler, servers, workers, tuple(self._homes) or tuple(self._nodes),
                      others)

    def before_explain(self, context: FailureContext) -> Outcome | None:
        if context.stop.wait(_TERMINATION_WAIT):
            received = context.received
            return terminated(received[0] if received else signal.SIGTERM, context.host_ip)
        ending = allocation_ending()
        if ending is not None:
            return context.failed(128 + signal.SIGTERM, f"{ending}; job torn down", "launcher",
                                  None, None, context.host_ip, -signal.SIGTERM)
        return None


def _probe(nodes: Sequence[str]) -> list[str]:
    """A Slurm job's :data:`~mxlarge.launcher.restart.Probe`: the nodes a new step can run on."""
    silent = silent_nodes(list(dict.fromkeys(nodes)))
    return [n for n in nodes if n not in silent]
