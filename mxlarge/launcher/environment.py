"""What reaches a cluster job's processes: the forwarded environment and the quoted
command.

``ssh`` forwards only a handful of variables (not PYTHONPATH), ``mpirun`` only its
``-x`` list. So the variables of :func:`forwarded_env` are put on the command line
itself, as ``env K=V ... command`` (:func:`render_command`), which every backend (and
the local scheduler) runs unchanged. Values on a command line are visible to ``ps`` on
every host, so names with PASSWORD, TOKEN or SECRET are never forwarded automatically.

dmlc's ssh backend wraps the whole remote command in single quotes, so our own quoting
(:func:`shell_word`) uses double quotes only: the words parse the same in one shell
layer (scheduler, mpirun, srun) and in two (the local shell, then the remote one behind
ssh).
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV
from mxlarge.protocol.reports import ENV as REPORTS_ENV

# Forwarded to every process when set in the launcher's environment; ``env`` adds to
# this.
FORWARD_VARS = frozenset({
    "PYTHONPATH", "OMP_NUM_THREADS", "DMLC_INTERFACE", "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID",
    "MXLARGE_PIECES", "MXLARGE_LEAD",  # the exchange's knobs (mxlarge.kvstore)
})
FORWARD_PREFIXES = ("MLFLOW_", "MXNET_")
# Never forwarded automatically: they would appear in process listings on every host.
_SECRET_WORDS = ("PASSWORD", "TOKEN", "SECRET")

# Set by dmlc_tracker per process or by us; overriding them from ``env`` (which is
# applied after the tracker's own exports) would break the job.
OWNED_ENV = frozenset({
    "DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER",
    "DMLC_NODE_HOST", "DMLC_RANK", "DMLC_TASK_ID", "DMLC_JOB_CLUSTER", "MXLARGE_JOB_ID",
    HEARTBEAT_ENV, REPORTS_ENV,
})

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SHELL_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def _auto_forward(name: str) -> bool:
    if not (name in FORWARD_VARS or name.startswith(FORWARD_PREFIXES)):
        return False
    return not any(word in name for word in _SECRET_WORDS)


def forwarded_env(env: Mapping[str, str] | None = None,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a cluster job's processes receive on top of what the backend sets.

    ``PYTHONPATH``, ``OMP_NUM_THREADS``, ``DMLC_INTERFACE``, ``MLFLOW_*`` and
    ``MXNET_*`` from ``environ`` (default: this process's environment), except names
    containing PASSWORD, TOKEN or SECRET, then ``env`` on top.

    Raises:
        ValueError: if ``env`` sets a variable the tracker owns or an invalid name.
    """
    environ = os.environ if environ is None else environ
    out = {k: v for k, v in environ.items() if _auto_forward(k)}
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(f"invalid environment variable name {key!r}")
        if key in OWNED_ENV:
            raise ValueError(f"env may not set {key}: dmlc_tracker/the launcher set it per "
                             f"process")
        out[key] = str(value)
    return out


def shell_word(word: str) -> str:
    """Quote ``word`` for a POSIX shell without using single quotes.

    dmlc's ssh backend wraps the whole remote command in single quotes, so our own
    quoting must use double quotes; the result parses the same in one shell layer
    (scheduler, mpirun, srun) and in two (the local shell, then the remote one behind
    ssh).
    """
    if SHELL_SAFE.match(word):
        return word
    return '"' + re.sub(r'([\\"$`])', r"\\\1", word) + '"'


def render_command(command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """``env K=V ... command``, every word quoted with :func:`shell_word`."""
    words = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *command]
    return [shell_word(w) for w in words]
