"""One attempt of a job on the chosen backend: what both front ends (``mxlarge launch`` and
``python -m mxlarge.launcher``) run, once per attempt of :func:`~mxlarge.launcher.restart.
run_with_restarts`.

The front ends turn argv into the arguments of :func:`run_attempt`; which backend runs the
processes (:func:`run_local` on loopback, dmlc_tracker's ``ssh``/``mpi``/``slurm`` through
:func:`cluster_run`) is decided here and nowhere else, and so is which ``--launcher`` names are
accepted (:func:`launcher_choice`). Importing this module does not import MXNet.
"""
from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from mxlarge.launcher._supervise import Outcome
from mxlarge.launcher.cluster import SUPPORTED, UNSUPPORTED, cluster_run
from mxlarge.launcher.firewall import local_refusal, refusal
from mxlarge.launcher.local import run_local

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


def run_attempt(launcher: str, command: Sequence[str], *, workers: int, servers: int,
                env: Mapping[str, str], stall_timeout: float | None, tuning: bool,
                firewall: str, port: int | None = None, hostfile: str | None = None,
                host_ip: str | None = None, grace: float = 10.0) -> Outcome:
    """Runs ``command`` once as a dist_sync job of ``workers`` workers and ``servers`` servers
    on backend ``launcher`` (:data:`BACKENDS`), supervised until it ends.

    ``port`` is the local backend's scheduler port; ``hostfile`` and ``host_ip`` (dmlc's
    ``--host-ip``) are the cluster backends'; ``firewall`` applies to cluster backends only.
    Both kinds of backend print the outcome's line themselves.
    """
    if launcher == "local":
        return run_local(command, workers=workers, servers=servers, port=port, env=env,
                         grace=grace, stall_timeout=stall_timeout, tuning=tuning)
    extra: dict[str, Any] = {"host_ip": host_ip} if host_ip else {}
    return cluster_run(launcher, command, workers=workers, servers=servers, hostfile=hostfile,
                       env=env, extra=extra, grace=grace, stall_timeout=stall_timeout,
                       tuning=tuning, firewall=firewall)
