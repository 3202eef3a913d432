"""The job flags both front ends take (``mxlarge launch`` and ``python -m
mxlarge.launcher``), declared once (:func:`add_job_flags`). Importing this module does
not import MXNet."""
from __future__ import annotations

import argparse

from mxlarge.launcher.firewall import MODES
from mxlarge.launcher.registry import BACKENDS, launcher_choice
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
