"""The job flags both front ends take (``mxlarge launch`` and ``python -m
mxlarge.launcher``), declared once (:func:`add_job_flags`, :func:`add_elastic_flags`), and
the world keeper ``--elastic`` asks for (:func:`elastic_of`). Importing this module does
not import MXNet."""
from __future__ import annotations

import argparse
from typing import Any

from mxlarge.errors import InputError
from mxlarge.launcher.firewall import MODES
from mxlarge.launcher.registry import BACKENDS, launcher_choice
from mxlarge.launcher.restart import Elastic
from mxlarge.launcher.watchdog import STALL_HELP, stall_seconds


def add_job_flags(p: argparse.ArgumentParser, *, servers: str, restarts: str) -> None:
    """Adds ``-s/--servers``, ``--launcher``, ``-H/--hostfile``, ``--port``,
    ``--stall-timeout``, ``--no-tuning``, ``--firewall`` and ``--max-restarts`` to
    ``p``; ``servers`` and ``restarts`` are the help of the two whose meaning is the
    front end's."""
    for names, options in (
        (("-s", "--servers"), {"type": int, "default": None, "help": servers}),
        (("--launcher",), {"default": "local", "type": launcher_choice,
                           "metavar": "{" + ",".join(BACKENDS) + "}",
                           "help": "how processes are started (sge and yarn are refused: "
                                   "dmlc_tracker's backends cannot run a parameter-server job "
                                   "on MXNet 1.9.1)"}),
        (("-H", "--hostfile"), {"default": None, "help": "hosts for ssh/mpi (slurm: nodes of "
                                                         "the allocation to run on)"}),
        (("--port",), {"type": int, "default": None,
                       "help": "scheduler port (local only; default: a free one)"}),
        (("--stall-timeout",), {"type": stall_seconds, "default": None, "metavar": "SECONDS",
                                "help": STALL_HELP}),
        (("--no-tuning",), {"action": "store_true",
                            "help": "add no process settings (malloc, big-array bound, OpenMP "
                                    "threads; see mxlarge.launcher.tuning): MXNet's and "
                                    "glibc's defaults"}),
        (("--firewall",), {"choices": MODES, "default": "auto",
                           "help": "cluster launchers: let only the job's hosts reach its "
                                   "ports while it runs (nftables on every host; needs root "
                                   "there): auto = where the launcher can, on = or refuse, "
                                   "off = never; see mxlarge/launcher/firewall.py"}),
        (("--max-restarts",), {"type": int, "default": 0, "metavar": "N", "help": restarts}),
    ):
        p.add_argument(*names, **options)


def add_elastic_flags(p: argparse.ArgumentParser) -> None:
    """Adds ``--elastic``, ``--min-workers`` and ``--local-lost`` to ``p``."""
    p.add_argument("--elastic", action="store_true",
                   help="with --max-restarts: before each restart find the live worker hosts "
                        "and relaunch in a world of the same global batch (2 workers -> 1 "
                        "worker x 2 simulated workers), bitwise the same training; refused "
                        "with the reason when none fits (local, ssh, mpi and slurm launches; "
                        "a command of your own resumes through mxlarge.resume and runs "
                        "trainer.units(); see mxlarge/launcher/restart.py)")
    p.add_argument("--min-workers", type=int, default=None, metavar="M",
                   help="with --elastic: never fewer than M worker processes (default 1)")
    p.add_argument("--local-lost", default=None, metavar="FILE",
                   help="with --elastic on a local launch: worker-<i> names listed in FILE "
                        "(read before each restart) are hosts lost for good (for tests and "
                        "rehearsals)")


def elastic_of(args: argparse.Namespace, backend: Any, world: Any, servers: int,
               lines: list[Any] | None) -> Elastic | None:
    """``--elastic``'s world keeper, or None; options that cannot apply are refused.

    The hosts and their probe are the backend's
    (:meth:`~mxlarge.launcher.backends.base.LaunchBackend.elastic`): an ssh or mpi job's are
    its hostfile's ``lines``, probed over ssh; a Slurm job's its allocation's nodes, probed by
    asking Slurm and their slurmd; a local job's its worker processes, probed with
    ``--local-lost``.

    Raises:
        InputError: an option without ``--elastic``, ``--elastic`` without restarts, or a
            world the backend cannot keep.
    """
    if not args.elastic:
        for flag, value in (("--min-workers", args.min_workers), ("--local-lost", args.local_lost)):
            if value is not None:
                raise InputError(f"{flag}: expected together with --elastic")
        return None
    if args.max_restarts < 1:
        raise InputError("--elastic: expected --max-restarts N >= 1 (the world changes at a "
                         "restart)")
    try:
        return backend.elastic(world, servers, lines, args.min_workers or 1, args.local_lost)
    except ValueError as exc:
        raise InputError(str(exc)) from None
