"""The launcher's public API: a job as data, one attempt of it, and how it ended.

    from mxlarge.launcher.api import JobSpec, run_job
    from mxlarge.plan import World

    outcome = run_job(JobSpec("local", ["python", "train.py"], World(2), servers=1))
    if outcome.failure is not None:
        print(outcome.failure.role, outcome.failure.kvstore_rank, outcome.failure.host)

:class:`JobSpec` names the backend (``local``, ``ssh``, ``mpi``, ``slurm``) and what
every process runs; :func:`run_job` runs it once, supervised, and returns the
:class:`Outcome`, whose :class:`ProcessFailure` is the one record of the process the job
failed in (the kvstore rank, the launch index, the host, pid, status, step and last
lines of output). Restarts are :func:`run_with_restarts` under a :class:`RestartPolicy`.
Importing this module does not import MXNet.
"""
from __future__ import annotations

from mxlarge.launcher.job import BACKENDS, JobSpec, run_job
from mxlarge.launcher.outcome import Outcome, ProcessFailure, failure_tags
from mxlarge.launcher.restart import RestartPolicy, run_with_restarts

__all__ = ["BACKENDS", "JobSpec", "Outcome", "ProcessFailure", "RestartPolicy", "failure_tags",
           "run_job", "run_with_restarts"]
