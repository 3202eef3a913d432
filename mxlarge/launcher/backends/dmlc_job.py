"""A dmlc job's parts, decided before anything starts
(:meth:`~mxlarge.launcher.backends.dmlc.DmlcBackend.run` reads them): the backend's
tool, each command as launched, every process's environment, the job's heartbeat and
report directories, dmlc's ``args`` and the frozen :class:`Submission`."""
from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mxlarge.launcher.backends.base import Spec
from mxlarge.launcher.dmlc_compat import guess_host_ip
from mxlarge.launcher.environment import forwarded_env
from mxlarge.launcher.hostfile import HostEntry, Layout, is_ip
from mxlarge.launcher.pslog import verbose_env
from mxlarge.launcher.tuning import cluster_env
from mxlarge.protocol.heartbeat import ENV as HEARTBEAT_ENV
from mxlarge.protocol.reports import ENV as REPORTS_ENV


@dataclass(frozen=True)
class Tool:
    """The program a dmlc backend starts (``ssh``, ``mpirun``, ``srun``; it must be on PATH),
    what it prints about the rank that failed (``reports``: named groups ``rank``, ``host`` and
    ``signal`` or ``what``, first match per child; ``rank_word``: how the launcher line names
    that rank) and the guard's flags for its processes
    (:func:`~mxlarge.launcher.guard.guard_command`)."""

    command: str
    reports: tuple[re.Pattern[str], ...] = ()
    rank_word: str = "rank"
    reraise: bool = False
    from_first_byte: bool = False


@dataclass(frozen=True)
class Launched:
    """One command dmlc starts, as the launcher labels it: its role, launch index (None:
    one tool process for every process of the role), its label (None: by its role,
    launch index and kvstore rank once known, then ``where``: ``worker 1 via ssh h:22``)
    and the host it runs on, if it names one (ssh)."""

    role: str
    index: int | None
    label: str | None
    host: str | None = None
    where: str = ""


@dataclass(frozen=True)
class Submission:
    """One job as dmlc submits it: the spec, the job id, dmlc's ``args``, the hosts it
    may run on, the heartbeat and report directories, whether ps-lite's verbose lines
    are the launcher's, the hosts' ssh ports, the layout, the hosts found cut off
    (filled during the job), the seconds the rest may take once the scheduler exited and
    the ``ip:port`` of the job's processes (filled when it ends: the packet filter's
    count)."""

    spec: Spec
    job_id: str
    args: Any
    hosts: list[str]
    beats: str
    reports: str
    hide_ps_verbose: bool
    ports: Mapping[str, int]
    layout: Layout
    cut: dict[str, str]
    shutdown_timeout: float
    own: set[str] = field(default_factory=set)


def job_env(spec: Spec, entries: list[HostEntry] | None) -> tuple[dict[str, str], bool]:
    """Every process's environment, and whether ps-lite's verbose lines are the launcher's."""
    # Unbuffered so that lines arrive through ssh/mpirun/srun as they are printed; no
    # __pycache__ written into the (shared) checkout by the job's processes.
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **forwarded_env(spec.env)}
    # ps-lite names its port (pslog); those lines are not shown unless the user asked
    # for them
    ps_verbose = verbose_env({**os.environ, **env})
    env.update(ps_verbose)
    if spec.tuning:
        env.update(cluster_env({**os.environ, **env}))
    env["MXLARGE_JOB_ID"] = uuid.uuid4().hex[:12]
    if spec.server_hosts or any(e.server for e in entries or ()):
        env["MXLARGE_SERVER_HOSTS"] = "1"  # the exchange's order (mxlarge.kvstore.order)
    return env, bool(ps_verbose)


def job_dirs(spec: Spec, env: dict[str, str]) -> tuple[str, str]:
    """Where workers write their heartbeats and their reports: ``.mxlarge-heartbeat/<job
    id>`` and ``.mxlarge-reports/<job id>`` here, which the ssh backend also ``cd``s to
    on every host (a filesystem every host shares, or the watchdog stays unarmed and no
    timeline is merged)."""
    if spec.stall_timeout is not None and spec.stall_timeout < 0:
        raise ValueError(f"stall_timeout must be >= 0 (0 disables), got {spec.stall_timeout}")
    beats = os.path.abspath(os.path.join(".mxlarge-heartbeat", env["MXLARGE_JOB_ID"]))
    reports = os.path.abspath(os.path.join(".mxlarge-reports", env["MXLARGE_JOB_ID"]))
    env[HEARTBEAT_ENV] = beats
    env[REPORTS_ENV] = reports
    return beats, reports


def dmlc_args(name: str, spec: Spec, words: Sequence[str]) -> Any:
    """dmlc's ``args`` namespace for ``spec`` (what ``tools/launch.py`` would build)."""
    from dmlc_tracker import opts  # late: only cluster jobs need dmlc_tracker

    args = opts.get_opts(["--cluster", name, "--num-workers", str(spec.world.processes),
                          "--num-servers", str(spec.servers), "placeholder"])
    args.command = list(words)
    if not spec.host_ip:
        args.host_ip = guess_host_ip()
    elif not is_ip(spec.host_ip):
        # The scheduler binds DMLC_PS_ROOT_URI itself: same no-DNS rule as the hostfile.
        raise ValueError(f"host_ip must be an IP address (the scheduler binds it), "
                         f"got {spec.host_ip!r}")
    else:
        args.host_ip = spec.host_ip
    return args


def remove_if_empty(directory: str) -> None:
    with contextlib.suppress(OSError):  # not empty: another job's heartbeats are there
        os.rmdir(directory)
