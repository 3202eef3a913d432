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
from mxlarge.launcher.cluster import (
    SUPPORTED,
    UNSUPPORTED,
    cluster_run,
    cluster_submit,
    forwarded_env,
    tracker_compat,
)
from mxlarge.launcher.local import Outcome, PortInUseError, free_port, run_local

__all__ = [
    "SUPPORTED",
    "UNSUPPORTED",
    "Outcome",
    "PortInUseError",
    "cluster_run",
    "cluster_submit",
    "forwarded_env",
    "free_port",
    "run_local",
    "tracker_compat",
]
