"""A job as data (:class:`JobSpec`) and one attempt of it on the chosen backend
(:func:`run_job`): what both front ends (``mxlarge launch`` and ``python -m mxlarge.launcher``)
run, once per attempt of :func:`~mxlarge.launcher.restart.run_with_restarts`.

The front ends only turn argv into a :class:`JobSpec`; which backend runs the processes
(:func:`run_local` on loopback, dmlc_tracker's ``ssh``/``mpi``/``slurm`` through
:func:`cluster_run`) is decided here and nowhere else, and so is which ``--launcher`` names are
accepted (:func:`launcher_choice`). Importing this module does not import MXNet.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mxlarge.launcher._supervise import Outcome
from mxlarge.launcher.cluster import SUPPORTED, UNSUPPORTED, cluster_run
from mxlarge.launcher.firewall import local_refusal, refusal
from mxlarge.launcher.local import run_local
from mxlarge.plan import World

BACKENDS = ("local", *SUPPORTED)


def launcher_choice(name: str) -> str:
    """``--launcher NAME`` (an argparse ``type``): a backend that works; sge and yarn are
    refused with the reason (:data:`~mxlarge.launcher.cluster.UNSUPPORTED`)."""
    if name in UNSUPPORTED:
        raise argparse.ArgumentTypeError(f"{name!r} is not supported: {UNSUPPORTED[name]}")
    if name not in BACKENDS:
        raise argparse.ArgumentTypeError(f"{name!r}: expected one of {', '.join(BACKENDS)}")
    return name


def firewall_refusal(launcher: str, mode: str) -> str | None:
    """Why ``--firewall on`` cannot be honoured for ``launcher`` here (checked before any
    process starts), or None (``auto`` and ``off`` are never refused)."""
    if mode != "on":
        return None
    return refusal(launcher) or local_refusal()


@dataclass(frozen=True)
class JobSpec:
    """What a job runs, built once by a front end from its argv (an attempt of a restarted or
    elastic job is :func:`dataclasses.replace` of it); :func:`run_job` runs it.

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
        pass_world: ``command`` is an ``mxlarge train`` command, run with ``--world`` (a
            user's own command is run as given).

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
    pass_world: bool = False

    def __post_init__(self) -> None:
        try:  # an unknown or broken backend: refused with the reason
            launcher_choice(self.launcher)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None
        object.__setattr__(self, "command", tuple(self.command))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        if self.launcher == "local" and (self.hostfile or self.host_ip):
            raise ValueError("--hostfile/--host-ip are for cluster launchers")
        if self.launcher != "local" and self.port is not None:
            raise ValueError("--port is for the local launcher (dmlc_tracker picks the "
                             "scheduler port)")

    @property
    def argv(self) -> tuple[str, ...]:
        """What every role runs: ``command``, and with ``pass_world`` the world as
        ``--world PxDxSxN`` (:meth:`~mxlarge.plan.World.to_arg`), the one place it is written."""
        if not self.pass_world:
            return self.command
        return (*self.command, "--world", self.world.to_arg())


def run_job(spec: JobSpec) -> Outcome:
    """Runs ``spec`` once, supervised until it ends: :func:`run_local` for the local backend,
    :func:`cluster_run` (dmlc_tracker's ssh, mpi or slurm) for the others. Both print the
    outcome's line themselves."""
    if spec.launcher == "local":
        return run_local(spec.argv, workers=spec.world.processes, servers=spec.servers,
                         port=spec.port, env=spec.env, grace=spec.grace,
                         stall_timeout=spec.stall_timeout, tuning=spec.tuning)
    extra: dict[str, Any] = {"host_ip": spec.host_ip} if spec.host_ip else {}
    return cluster_run(spec.launcher, spec.argv, workers=spec.world.processes,
                       servers=spec.servers,
                       hostfile=spec.hostfile, env=spec.env, extra=extra, grace=spec.grace,
                       stall_timeout=spec.stall_timeout, tuning=spec.tuning,
                       firewall=spec.firewall)
