"""What the Slurm backend asks Slurm: whether srun knows ``--overlap``, the allocation's
nodes, which of them Slurm counts as not usable, whether the allocation is ending, and
which nodes an elastic restart can run on (:func:`silent_nodes`).

Each is one short command (``srun --help``, ``scontrol show hostnames``, ``sinfo``,
``squeue``, ``scontrol show config``) with a timeout; a Slurm that does not answer gives
the conservative answer (no ``--overlap``, the unexpanded node list, no node known bad,
"still running", the allocation as it started). Importing this module does not import
MXNet.
"""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Sequence

from mxlarge.launcher.reach import PROBE_TIMEOUT, each_host

SLURMD_PORT = 6818  # Slurm's default SlurmdPort


def srun_has_overlap() -> bool:
    """Whether this ``srun`` has ``--overlap`` (Slurm >= 20.11)."""
    try:
        r = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--overlap" in r.stdout


def slurm_nodes() -> list[str]:
    """The nodes of the current Slurm allocation, expanded by ``scontrol`` where possible."""
    return _expand(os.environ.get("SLURM_JOB_NODELIST", ""))


def _expand(nodelist: str) -> list[str]:
    """``h[1-2]`` -> ``["h1", "h2"]`` (``scontrol show hostnames``; else as given)."""
    if not nodelist:
        return []
    try:
        r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return [nodelist]
    return r.stdout.split() if r.returncode == 0 and r.stdout.split() else [nodelist]


def bad_nodes(nodes: list[str]) -> dict[str, str]:
    """``{node: state}`` of the ``nodes`` Slurm counts as not usable: not responding
    (``*`` after the state, e.g. ``idle*``), down, drained or failed (``sinfo -N -o "%N
    %T"``)."""
    if not nodes:
        return {}
    try:
        r = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    bad = {}
    for line in r.stdout.splitlines() if r.returncode == 0 else ():
        node, _, state = line.strip().partition(" ")
        if state.endswith("*") or state.startswith(("down", "drain", "fail")):
            bad[node] = state
    return bad


def allocation_ending() -> str | None:
    """Why this Slurm allocation is ending (``scancel``, a SIGTERM to ``salloc``
    revoking it), or ``None`` while it runs: then a failed step failed on its own
    (``--kill-on-bad-exit`` ends only the step)."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        r = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = r.stdout.strip()
    if r.returncode == 0 and state == "RUNNING":
        return None
    return (f"Slurm ended the allocation (job {job} {state or 'gone'}): the job was cancelled "
            "or its allocation revoked")


def _query(*cmd: str) -> str | None:
    """A Slurm command's standard output, ``None`` if it gave no answer within 30 s."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def silent_nodes(nodes: Sequence[str], timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """``{node: why}`` of the ``nodes`` a new job step cannot run on: no longer in the
    allocation (Slurm removed a failed node from a ``--no-kill`` allocation), not usable
    to Slurm (:func:`bad_nodes`), or whose slurmd accepts no TCP connection at its
    ``NodeAddr`` and ``SlurmdPort`` within ``timeout`` s (Slurm counts a cut-off node as
    not responding only after ``SlurmdTimeout``); all nodes probed at once."""
    job = os.environ.get("SLURM_JOB_ID")
    current = _query("squeue", "-h", "-j", job, "-o", "%N") if job else None
    held = set(_expand(current.strip())) if current and current.strip() else set(nodes)
    silent = {n: f"no longer in Slurm job {job}'s nodes" for n in nodes if n not in held}
    silent.update({n: f"Slurm has it {state} (sinfo)"
                   for n, state in bad_nodes([n for n in nodes if n not in silent]).items()})
    rest = [n for n in nodes if n not in silent]
    listed = _query("sinfo", "-h", "-N", "-n", ",".join(rest), "-o", "%N %o") if rest else ""
    addrs = dict(line.split()[:2] for line in (listed or "").splitlines() if line.split()[1:])
    config = _query("scontrol", "show", "config") or ""
    port = next((int(line.split("=")[1]) for line in config.splitlines()
                 if line.split("=")[0].strip() == "SlurmdPort"), SLURMD_PORT)
    silent.update(each_host({n: port for n in rest},
                            lambda n, p: _slurmd_silent(addrs.get(n, n), p, timeout), timeout))
    return silent


def _slurmd_silent(addr: str, port: int, timeout: float) -> str | None:
    """``None`` if slurmd at ``addr:port`` accepts a TCP connection within ``timeout`` s."""
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"slurmd at {addr}:{port}: no answer within {timeout:g} s"
    except OSError as e:
        return f"slurmd at {addr}:{port}: {e.strerror or e}"
