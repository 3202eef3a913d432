"""What every launch backend implements (:class:`LaunchBackend`), and the job it reads
(:class:`Spec`, which :class:`~mxlarge.launcher.job.JobSpec` is).

A backend owns everything that differs between the ways a job's processes are started:
which options it refuses, its hosts and their probe for an elastic restart, whether the
packet filter applies, and how it runs one attempt. The front ends and
:func:`~mxlarge.launcher.job.run_job` only call these methods; none of them looks at a
backend's name. The dmlc_tracker backends share more
(:class:`mxlarge.launcher.backends.dmlc.DmlcBackend`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import IO, Any, ClassVar, Protocol

from mxlarge.launcher.hostfile import HostEntry
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.reports import Drawn
from mxlarge.launcher.restart import Elastic
from mxlarge.plan import World


class Spec(Protocol):
    """The fields of a job a backend reads (:class:`~mxlarge.launcher.job.JobSpec`)."""

    # read-only, as JobSpec is frozen
    @property
    def launcher(self) -> str: ...

    @property
    def world(self) -> World: ...

    @property
    def servers(self) -> int: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def stall_timeout(self) -> float | None: ...

    @property
    def tuning(self) -> bool: ...

    @property
    def firewall(self) -> str: ...

    @property
    def port(self) -> int | None: ...

    @property
    def hostfile(self) -> str | None: ...

    @property
    def host_ip(self) -> str | None: ...

    @property
    def grace(self) -> float: ...

    @property
    def shutdown_timeout(self) -> float | None: ...

    @property
    def server_hosts(self) -> tuple[str, ...]: ...

    @property
    def argv(self) -> tuple[str, ...]: ...


class LaunchBackend:
    """One way to start a job's processes (the subclasses: one per ``--launcher`` name)."""

    #: the ``--launcher`` name
    name: ClassVar[str]
    #: every process of the job runs on the launcher's machine (its system metrics are
    #: the job's)
    on_this_machine: ClassVar[bool] = False
    #: seconds the other processes may take to exit once the job ends (a spec's default)
    shutdown_timeout: ClassVar[float]

    def check_spec(self, spec: Spec) -> None:
        """Refuse an option this backend cannot apply (``ValueError`` with the reason)."""
        if spec.server_hosts:
            raise ValueError(f"dist.server_hosts = {', '.join(spec.server_hosts)}: expected "
                             f"none with --launcher {self.name} (server hosts are for the ssh, "
                             "mpi and slurm launchers; this one runs every process here)")

    def check_hosts(self, hostfile: str | None, workers: int, servers: int,
                    server_hosts: Sequence[str] = ()) -> list[HostEntry] | None:
        """The hostfile's lines, checked for this backend before anything starts
        (``None``: the backend takes no hostfile); ``server_hosts``
        (``dist.server_hosts``) and the file's ``role=server`` lines are the hosts that
        run servers only.

        Raises:
            ValueError: naming the file and what is missing.
        """
        return None

    def preflight(self, spec: Spec) -> None:
        """Checks that need the machine (a port taken), before any run or process starts."""

    def firewall_refusal(self) -> str | None:
        """Why the packet filter (:mod:`mxlarge.launcher.firewall`) is not offered here."""
        return None

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        """The world keeper of an ``--elastic`` job: its worker hosts and their probe.

        Raises:
            ValueError: this backend's hosts cannot be probed, or an option does not apply.
        """
        raise ValueError(f"--elastic with --launcher {self.name}: probing {self.name} hosts "
                         "is not built; elastic restarts run on local, ssh, mpi and slurm launches")

    def attempt_env(self, spec: Spec, declared_workers: int) -> Mapping[str, str]:
        """The environment of an attempt in a smaller world than the declared one."""
        return spec.env

    def attempt_hostfile(self, lines: list[HostEntry] | None, elastic: Elastic,
                         declared_servers: int, servers: int, workers: int) -> str | None:
        """The hostfile text of an elastic attempt with ``servers`` and ``workers``
        after :meth:`Elastic.replan` (``None``: the job's own hostfile)."""
        return None

    def run(self, spec: Spec, output: IO[str] | Any = None, drawn: Drawn | None = None
            ) -> Outcome:
        """Run one attempt of ``spec``, supervised until it ends (what the supervision
        loop asks of it: a :class:`~mxlarge.launcher.supervisor.Supervised` of the
        backend's own); prints the children's lines and the outcome's to ``output``
        (stdout if None); ``drawn`` gets every rank's parts while it runs
        (:class:`~mxlarge.launcher.reports.WorkerReports`)."""
        raise NotImplementedError
