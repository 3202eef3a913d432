"""A job as data (:class:`JobSpec`) and one attempt of it on the chosen backend
(:func:`run_job`): what both front ends (``mxlarge launch`` and ``python -m
mxlarge.launcher``) run, once per attempt of
:func:`~mxlarge.launcher.restart.run_with_restarts`.

The front ends only turn argv into a :class:`JobSpec`; the backend that runs it is
looked up once, by its name, in :mod:`mxlarge.launcher.registry` (which also decides
which ``--launcher`` names are accepted, :func:`launcher_choice`), and everything after
that asks the backend object (:class:`~mxlarge.launcher.backends.base.LaunchBackend`).
Importing this module does not import MXNet.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import IO, Any

from mxlarge.launcher.firewall import local_refusal
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.registry import BACKENDS, backend_for, launcher_choice
from mxlarge.launcher.reports import Drawn
from mxlarge.launcher.restart import Attempt
from mxlarge.plan import SIMULATED_ENV, World

__all__ = ["BACKENDS", "JobSpec", "attempt_spec", "firewall_refusal", "launcher_choice",
           "run_attempt", "run_job", "run_local"]


def firewall_refusal(launcher: str, mode: str) -> str | None:
    """Why ``--firewall on`` cannot be honoured for ``launcher`` here (checked before
    any process starts), or None (``auto`` and ``off`` are never refused)."""
    if mode != "on":
        return None
    return backend_for(launcher).firewall_refusal() or local_refusal()


@dataclass(frozen=True)
class JobSpec:
    """What a job runs, built once by a front end from its argv (an attempt of a
    restarted or elastic job is :func:`dataclasses.replace` of it); :func:`run_job` runs
    it.

    Attributes:
        launcher: the backend (:data:`BACKENDS`).
        command: argv run for every role (without the world: :attr:`argv`).
        world: the job's world, decided once by the front end; its ``processes`` are the
            worker processes (and ``DMLC_NUM_WORKER``).
        servers: server processes (>= 1).
        env: extra environment for every process (read-only).
        stall_timeout: seconds without progress that stop the job; ``None`` the default rule,
            0 off (:mod:`mxlarge.launcher.watchdog`).
        tuning: add :mod:`mxlarge.launcher.tuning`'s process settings.
        firewall: ``auto``, ``on`` or ``off``: the cluster backends' packet filter.
        port: the local backend's scheduler port (``None``: a free one).
        hostfile: the ssh and mpi backends' hosts.
        host_ip: the address the scheduler of a cluster job binds (dmlc's ``--host-ip``).
        grace: seconds between SIGTERM and SIGKILL during teardown.
        shutdown_timeout: seconds the other processes may take to exit once the job ends (the
            workers, or the scheduler on a cluster); ``None`` the backend's default.
        pass_world: ``command`` is an ``mxlarge train`` command, run with ``--world`` (a
            user's own command is run as given).
        server_hosts: hosts that run servers only (``dist.server_hosts``; the cluster
            backends'); empty: the hostfile's ``role=server`` lines, else co-located.

    Raises:
        ValueError: an option the backend cannot apply (``port`` on a cluster backend,
            ``hostfile``/``host_ip`` on the local one), an unknown backend.
    """

    launcher: str
    command: tuple[str, ...]
    world: World
    servers: int
    env: Mapping[str, str] = field(default_factory=dict)
    stall_timeout: float | None = None
    tuning: bool = True
    firewall: str = "off"
    port: int | None = None
    hostfile: str | None = None
    host_ip: str | None = None
    grace: float = 10.0
    shutdown_timeout: float | None = None
    pass_world: bool = False
    server_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        backend = backend_for(self.launcher)  # an unknown or broken one: the reason
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "server_hosts", tuple(self.server_hosts))
        backend.check_spec(self)

    @property
    def argv(self) -> tuple[str, ...]:
        """What every role runs: ``command``, and with ``pass_world`` the world as
        ``--world PxDxSxN`` (:meth:`~mxlarge.plan.World.to_arg`), the one place it is
        written."""
        if not self.pass_world:
            return self.command
        return (*self.command, "--world", self.world.to_arg())


def run_job(spec: JobSpec, output: IO[str] | Any = None, drawn: Drawn | None = None
            ) -> Outcome:
    """Runs ``spec`` once on its backend, supervised until it ends; the children's lines
    and the outcome's go to ``output`` (stdout if None); ``drawn`` gets every rank's parts
    while it runs (:class:`~mxlarge.launcher.reports.WorkerReports`: the run's picture,
    :meth:`~mxlarge.launcher.record.JobRecord.breakdown`)."""
    return backend_for(spec.launcher).run(spec, output, drawn)


def attempt_spec(spec: JobSpec, attempt: Attempt) -> JobSpec:
    """The spec of one attempt: ``spec`` in the attempt's world with its servers (and the
    backend's environment for a world other than the declared one). A command of the user's
    own learns its simulated workers from :data:`~mxlarge.plan.SIMULATED_ENV` (an ``mxlarge
    train`` command from ``--world``). Its server hosts are the declared ones that answered
    (at most one per server): the backend adds a server host its hostfile lacks, so a lost
    one would get servers again."""
    homes = tuple(h for h in spec.server_hosts if h not in attempt.lost)[:attempt.servers]
    out = dataclasses.replace(spec, server_hosts=homes)
    if attempt.world == spec.world:
        return out
    env = dict(backend_for(spec.launcher).attempt_env(spec, spec.world.processes))
    if not spec.pass_world:
        env[SIMULATED_ENV] = str(attempt.world.simulated)
    return dataclasses.replace(out, world=attempt.world, servers=attempt.servers, env=env)


def run_attempt(spec: JobSpec, attempt: Attempt, emit: Callable[[str], None],
                output: IO[str] | Any = None, drawn: Drawn | None = None) -> Outcome:
    """Runs an attempt's ``spec`` (:func:`attempt_spec`, :func:`run_job`), from the hostfile
    the backend wrote for its answering hosts, if any (a temporary file, said in one
    line)."""
    if attempt.hostfile is None:
        return run_job(spec, output, drawn)
    emit(f"restart {attempt.number}: hosts " + ", ".join(attempt.hostfile.splitlines())
         + f" ({spec.servers} server(s), {spec.world.processes} worker(s); lost: "
         f"{', '.join(attempt.lost)})")
    fd, hostfile = tempfile.mkstemp(prefix="mxlarge-hosts-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(attempt.hostfile)
        return run_job(dataclasses.replace(spec, hostfile=hostfile), output, drawn)
    finally:
        os.unlink(hostfile)


def run_local(command: Sequence[str], *, workers: int, servers: int, port: int | None = None,
              env: Mapping[str, str] | None = None, grace: float = 10.0,
              output: IO[str] | Any = None, shutdown_timeout: float | None = None,
              stall_timeout: float | None = None, tuning: bool = True) -> Outcome:
    """:func:`run_job` of a local job of ``workers`` worker processes (the
    :class:`JobSpec` fields by keyword; ``output`` stdout if None)."""
    spec = JobSpec("local", tuple(command), World(processes=workers), servers, env=env or {},
                   stall_timeout=stall_timeout, tuning=tuning, port=port, grace=grace,
                   shutdown_timeout=shutdown_timeout)
    return run_job(spec, sys.stdout if output is None else output)
