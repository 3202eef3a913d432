"""The one place a backend is looked up by its ``--launcher`` name.

:data:`REGISTRY` maps each name that works to its class (:mod:`mxlarge.launcher.backends`);
sge and yarn, which dmlc_tracker also names, are refused with the reason
(:data:`UNSUPPORTED`). Everything else asks the backend object, never its name. Importing this
module does not import MXNet.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from mxlarge.launcher.backends.base import LaunchBackend
from mxlarge.launcher.backends.local import LocalBackend
from mxlarge.launcher.backends.mpi import MpiBackend
from mxlarge.launcher.backends.slurm import SlurmBackend
from mxlarge.launcher.backends.ssh import SshBackend
from mxlarge.launcher.cluster import DmlcBackend, dmlc_run
from mxlarge.launcher.outcome import Outcome

REGISTRY: dict[str, type[LaunchBackend]] = {
    "local": LocalBackend, "ssh": SshBackend, "mpi": MpiBackend, "slurm": SlurmBackend}
#: the dmlc_tracker backends that work
SUPPORTED = tuple(n for n, c in REGISTRY.items() if issubclass(c, DmlcBackend))
BACKENDS = tuple(REGISTRY)

UNSUPPORTED: dict[str, str] = {
    "sge": (
        "dmlc_tracker's sge backend (MXNet 1.9.1) cannot run a parameter-server job: submit() "
        "reads args.logdir and args.vcores, which its option parser never defines "
        "(AttributeError before anything is submitted); it builds '-S /bin/bash-q QUEUE' for a "
        "non-default queue; and it never sets DMLC_ROLE, so no array task could tell whether "
        "it is a server or a worker. On an SGE cluster, request the nodes as a parallel job "
        "and use the 'ssh' or 'mpi' launcher from inside it (see docs/launching.md)."
    ),
    "yarn": (
        "dmlc_tracker's yarn backend (MXNet 1.9.1) cannot run: dmlc-yarn.jar and its build "
        "script are not shipped in the mxnet wheel, and the container bootstrap "
        "dmlc_tracker/launcher.py is neither executable nor runnable as a script (relative "
        "import), which is also how the scheduler is started."
    ),
}


def launcher_choice(name: str) -> str:
    """``--launcher NAME`` (an argparse ``type``): a backend that works; sge and yarn are
    refused with the reason (:data:`UNSUPPORTED`)."""
    if name in UNSUPPORTED:
        raise argparse.ArgumentTypeError(f"{name!r} is not supported: {UNSUPPORTED[name]}")
    if name not in BACKENDS:
        raise argparse.ArgumentTypeError(f"{name!r}: expected one of {', '.join(BACKENDS)}")
    return name


def backend_for(name: str) -> LaunchBackend:
    """A fresh backend object for ``--launcher name``.

    Raises:
        ValueError: an unknown or unsupported name (the reason).
    """
    try:
        return REGISTRY[launcher_choice(name)]()
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


def cluster_submit(launcher: str, command: Sequence[str], *, workers: int, servers: int,
                   hostfile: str | None, env: Mapping[str, str] | None = None,
                   extra: Mapping[str, Any] | None = None, grace: float = 10.0,
                   output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 60.0,
                   stall_timeout: float | None = None, heartbeat_dir: str | None = None) -> int:
    """:func:`cluster_run` that returns only the exit code."""
    return cluster_run(launcher, command, workers=workers, servers=servers, hostfile=hostfile,
                       env=env, extra=extra, grace=grace, output=output,
                       shutdown_timeout=shutdown_timeout, stall_timeout=stall_timeout,
                       heartbeat_dir=heartbeat_dir).exit_code


def cluster_run(launcher: str, command: Sequence[str], *, workers: int, servers: int,
                hostfile: str | None, env: Mapping[str, str] | None = None,
                extra: Mapping[str, Any] | None = None, grace: float = 10.0,
                output: IO[str] | Any = sys.stdout, shutdown_timeout: float = 60.0,
                stall_timeout: float | None = None,
                heartbeat_dir: str | None = None, tuning: bool = True,
                firewall: str = "off") -> Outcome:
    """Run ``command`` as a dist_sync job through dmlc_tracker's ``launcher`` backend.

    The scheduler runs on this host (that is how dmlc_tracker works), servers and workers where
    the backend puts them: ``ssh`` round-robin over the hostfile (servers first, one process
    per line), ``mpi`` with two ``mpirun --hostfile`` calls, ``slurm`` with two ``srun`` job
    steps inside the current allocation.

    Args:
        launcher: ``"ssh"``, ``"mpi"`` or ``"slurm"``.
        command: argv run for every role; it must exist at the same path on every host.
        workers: number of workers (>= 1).
        servers: number of servers (>= 1).
        hostfile: required for ssh and mpi (``IP`` or ``IP:port`` for ssh, which needs
            addresses, not names; ``host slots=N`` for mpi; ``#`` comments allowed); must be
            ``None`` for slurm.
        env: extra variables for every process, on top of :func:`forwarded_env` and
            ``PYTHONUNBUFFERED=1``; passed on the command line as ``env K=V ... command``.
        extra: overrides of dmlc_tracker options by their ``args`` attribute name, e.g.
            ``{"host_ip": "10.0.0.1"}`` (address the scheduler binds and workers dial; default:
            this host's primary address), ``{"sync_dst_dir": ...}`` (ssh rsync),
            ``{"slurm_worker_nodes": 4, "slurm_server_nodes": 4}``.
        grace: seconds between SIGTERM and SIGKILL during teardown.
        output: text stream for the processes' prefixed output.
        shutdown_timeout: seconds the remaining processes may take to exit after the scheduler.
        stall_timeout: the stall watchdog's timeout as for :func:`run_local` (``None`` the
            default rule, 0 off).
        heartbeat_dir: where workers write their heartbeats; it must be on a filesystem shared
            by every host and this one, or the watchdog never hears from remote workers and
            stays unarmed (default: ``.mxlarge-heartbeat/<job id>`` in the current directory,
            which the ssh backend also ``cd``s to on every host). Removed afterwards.
        tuning: add :mod:`mxlarge.launcher.tuning`'s settings (malloc, big-array bound) where
            ``env`` and this process's environment leave them unset.
        firewall: ``"auto"``, ``"on"`` or ``"off"``: the job's packet filter, which lets only
            the job's hosts reach its ports while it runs (:mod:`mxlarge.launcher.firewall`;
            ssh and mpi, as root on every host; ``auto`` installs it where it can; the front
            ends' default is ``auto``, a library call changes no host's rules unless asked).

    Returns:
        The :class:`~mxlarge.launcher._supervise.Outcome` (with the job's ``hosts``); its exit
        code is 0 if every process started here exited 0, else that of the first failure
        (128 + n for a signal n, 124 for a stall).

    Raises:
        ValueError: invalid arguments, hostfile missing/empty/too short.
        NotImplementedError: ``sge`` or ``yarn`` (see :data:`UNSUPPORTED`).
        FileNotFoundError: the backend's tool (ssh, mpirun, srun) is not on PATH.
        RuntimeError: dmlc_tracker itself failed, or another submission is running.
        FirewallError: ``firewall="on"`` and a host cannot take the filter; nothing started.
    """
    if name_refused := UNSUPPORTED.get(launcher):
        raise NotImplementedError(name_refused)
    backend = REGISTRY.get(launcher)
    if backend is LocalBackend:
        raise ValueError("use mxlarge.launcher.run_local for local jobs")
    if backend is None or not issubclass(backend, DmlcBackend):
        raise ValueError(f"unknown launcher {launcher!r}; choose one of {', '.join(SUPPORTED)}")
    return dmlc_run(backend(), command, workers=workers, servers=servers, hostfile=hostfile,
                    env=env, extra=extra, grace=grace, output=output,
                    shutdown_timeout=shutdown_timeout, stall_timeout=stall_timeout,
                    heartbeat_dir=heartbeat_dir, tuning=tuning, firewall=firewall)
