"""Launch mxlarge jobs on MXNet's dist_sync parameter server (ps-lite).

* :func:`run_local` supervises 1 scheduler, n servers and m workers on 127.0.0.1 (tests, a
  single multi-GPU machine). ps-lite is the transport; this module only starts, watches, prefixes
  the output of and tears down processes.
* :func:`cluster_submit` hands a job to dmlc_tracker's ``ssh``, ``mpi`` or ``slurm`` backend
  (the engine shipped in the mxnet wheel) with a Python 3.11 compatibility layer, environment
  forwarding and the same supervision.

``python -m mxlarge.launcher -n 2 -s 1 -- CMD ...`` is a small manual front end. Importing this
package does not import MXNet.
"""
from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use (PEP 562): ``python -m mxlarge.launcher.guard`` (the guard every cluster
# process runs under) then imports this package without importing ``probe`` first, which runpy
# would warn about in every job's output, and without the launcher's other modules.
_FROM = {"SUPPORTED": "registry", "UNSUPPORTED": "registry", "cluster_run": "registry",
         "cluster_submit": "registry", "forwarded_env": "environment",
         "tracker_compat": "dmlc_compat", "Outcome": "outcome", "ProcessFailure": "outcome",
         "JobSpec": "job", "run_job": "job", "PortInUseError": "local",
         "free_port": "local", "run_local": "local"}
_SUBMODULES = {"api", "backends", "cluster", "dmlc_compat", "environment", "explain",
               "firewall", "guard", "hostfile", "job", "local", "mxnet_launch", "outcome",
               "pgroups", "preflight", "pslog", "reach", "registry", "restart",
               "scheduler_port", "slurm_query", "tuning", "watchdog", "_supervise"}

__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name in _FROM:
        return getattr(importlib.import_module(f"{__name__}.{_FROM[name]}"), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
