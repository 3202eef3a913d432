"""The local backend: 1 scheduler, n servers and m workers on 127.0.0.1
(:func:`mxlarge.launcher.local.run_local`).

Every process listens on loopback only, so nothing outside this machine reaches the job (no
packet filter to install), and the launcher starts each process itself: no hostfile, no
scheduler address to choose. An elastic job's "hosts" are its worker processes,
``worker-<i>``; :func:`local_probe` takes as lost for good the names listed in a file
(``--local-lost FILE``): how a test, or a user rehearsing, tells a local job that a machine is
gone.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from mxlarge.launcher.backends.base import LaunchBackend, Spec
from mxlarge.launcher.firewall import LOOPBACK_ONLY
from mxlarge.launcher.hostfile import HostEntry
from mxlarge.launcher.local import ensure_port_free, run_local
from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.restart import Elastic, Probe
from mxlarge.launcher.tuning import local_role_env
from mxlarge.plan import World


def local_hosts(workers: int) -> list[str]:
    """A local job's hosts: each worker process is its own, ``worker-<i>`` (launch index i)."""
    return [f"worker-{i}" for i in range(workers)]


def local_probe(lost: str | Path | None) -> Probe:
    """A local job's :data:`~mxlarge.launcher.restart.Probe`: every host lives but those named
    in the file ``lost`` (one name a line, read at each probe; a missing file names none)."""
    def probe(hosts: Sequence[str]) -> list[str]:
        gone: set[str] = set()
        if lost is not None and Path(lost).is_file():
            gone = {line.strip() for line in Path(lost).read_text().splitlines()}
        return [h for h in hosts if h not in gone]
    return probe


class LocalBackend(LaunchBackend):
    """``--launcher local``."""

    name = "local"
    on_this_machine = True

    def check_spec(self, spec: Spec) -> None:
        super().check_spec(spec)
        if spec.hostfile or spec.host_ip:
            raise ValueError("--hostfile/--host-ip are for cluster launchers")

    def preflight(self, spec: Spec) -> None:
        """A ``--port`` already taken (:class:`~mxlarge.launcher.local.PortInUseError`)."""
        if spec.port is not None:
            ensure_port_free(spec.port)

    def firewall_refusal(self) -> str | None:
        return LOOPBACK_ONLY

    def elastic(self, world: World, servers: int, lines: list[HostEntry] | None,
                min_workers: int, local_lost: str | None) -> Elastic:
        return Elastic(world, local_hosts(world.processes), local_probe(local_lost),
                       min_workers)

    def attempt_env(self, spec: Spec, declared_workers: int) -> Mapping[str, str]:
        # CPU kernels reduce in an order that depends on the OpenMP team: every worker keeps
        # the declared world's (tests/e2e/test_simulate.py)
        if not spec.tuning:
            return spec.env
        return {**local_role_env("worker", declared_workers, {**os.environ, **spec.env}),
                **spec.env}

    def run(self, spec: Spec, output: IO[str] | Any = None) -> Outcome:
        where = {} if output is None else {"output": output}
        return run_local(spec.argv, workers=spec.world.processes, servers=spec.servers,
                         port=spec.port, env=spec.env, grace=spec.grace,
                         stall_timeout=spec.stall_timeout, tuning=spec.tuning, **where)
