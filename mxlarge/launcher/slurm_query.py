"""What the Slurm backend asks Slurm: whether srun knows ``--overlap``, the allocation's nodes,
which of them Slurm counts as not usable, and whether the allocation is ending.

Each is one short command (``srun --help``, ``scontrol show hostnames``, ``sinfo``, ``squeue``)
with a timeout; a Slurm that does not answer gives the conservative answer (no ``--overlap``,
the unexpanded node list, no node known bad, "still running"). Importing this module does not
import MXNet.
"""
from __future__ import annotations

import os
import subprocess


def srun_has_overlap() -> bool:
    """Whether this ``srun`` has ``--overlap`` (Slurm >= 20.11)."""
    try:
        r = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--overlap" in r.stdout


def slurm_nodes() -> list[str]:
    """The nodes of the current Slurm allocation, expanded by ``scontrol`` where possible."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not nodelist:
        return []
    try:
        r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return [nodelist]
    return r.stdout.split() if r.returncode == 0 and r.stdout.split() else [nodelist]


def bad_nodes(nodes: list[str]) -> dict[str, str]:
    """``{node: state}`` of the ``nodes`` Slurm counts as not usable: not responding (``*``
    after the state, e.g. ``idle*``), down, drained or failed (``sinfo -N -o "%N %T"``)."""
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
    """Why this Slurm allocation is ending (``scancel``, a SIGTERM to ``salloc`` revoking it),
    or ``None`` while it runs: then a failed step failed on its own (``--kill-on-bad-exit``
    ends only the step)."""
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
