"""Launch mxlarge jobs on MXNet's dist_sync parameter server (ps-lite).

* :func:`run_job` runs a :class:`JobSpec` once on its backend: ``local`` supervises 1
  scheduler, n servers and m workers on 127.0.0.1 (tests, a single multi-GPU machine);
  ``ssh``, ``mpi`` and ``slurm`` hand it to dmlc_tracker's backend of the same name (the engine
  shipped in the mxnet wheel) under the same supervision (:mod:`.supervisor`). ps-lite is the
  transport; the launcher only starts, watches, prefixes the output of and tears down processes.
* :func:`run_local` is ``run_job`` of a local job, by keywords.

``python -m mxlarge.launcher -n 2 -s 1 -- CMD ...`` is a small manual front end.
Importing this package does not import MXNet.
"""
from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562): ``python -m mxlarge.launcher.guard`` (the guard every
# cluster process runs under) then imports this package without importing ``probe``
# first, which runpy would warn about in every job's output, and without the launcher's
# other modules.
_FROM = {"SUPPORTED": "registry", "UNSUPPORTED": "registry",
         "forwarded_env": "environment", "tracker_compat": "dmlc_compat", "Outcome": "outcome",
         "ProcessFailure": "outcome", "JobSpec": "job", "run_job": "job", "run_local": "job",
         "PortInUseError": "backends.local", "free_port": "backends.local"}
_SUBMODULES = {"api", "backends", "dmlc_compat", "environment", "explain", "firewall", "flags",
               "guard", "hostfile", "job", "mxnet_launch", "outcome", "pgroups", "preflight",
               "pslog", "reach", "registry", "restart", "scheduler_port", "slurm_query",
               "supervisor", "tuning", "verdict", "watchdog"}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name in _FROM:
        return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
