"""MXNet's own ``tools/launch.py``, runnable on Python 3.11.

``python -m mxlarge.launcher.mxnet_launch -n 2 -s 1 --launcher local mxlarge train CFG`` runs
the unmodified launch.py from the installed wheel inside :func:`tracker_compat` (without it the
tracker crashes on ``Thread.isAlive`` after starting the scheduler and leaves it orphaned) and
:func:`claimed_scheduler_port` (two jobs started at once from one host would take the same
scheduler port). The command is the same ``mxlarge train`` as everywhere: its scheduler and
server roles start inside ``import mxnet``.

``--launcher local`` keeps every process on loopback. dmlc's local backend calls
``tracker.submit`` without an address, so the scheduler would bind (and advertise) the address of
this host's FQDN or of its outward interface, reachable from the network; here the tracker is
given 127.0.0.1 instead, and servers/workers get ``DMLC_NODE_HOST=127.0.0.1`` and
``DMLC_INTERFACE=lo`` unless set. Other launchers (``ssh``, ``mpi``) keep launch.py's own
address choice: the scheduler on the address of this host's name.

MXNet's local launcher neither prefixes output nor tears the job down when one process fails
(it retries); ``mxlarge launch`` does both and is the recommended front end.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
from pathlib import Path

from mxlarge.launcher.dmlc_compat import scheduler_address, tracker_compat
from mxlarge.launcher.local import LOOPBACK
from mxlarge.launcher.scheduler_port import claimed_scheduler_port


def launch_py() -> Path:
    """Path of ``tools/launch.py`` inside the installed mxnet wheel (mxnet is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mxnet is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tools" / "launch.py"


def launcher_of(argv: list[str]) -> str:
    """The ``--launcher`` launch.py will use (its default is ``ssh``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--launcher", default="ssh")
    known, _ = p.parse_known_args(argv)
    return str(known.launcher)


def main(argv: list[str] | None = None) -> int:
    """Run launch.py with ``argv``; returns 0 when it returns (it exits itself on errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    local = launcher_of(argv) == "local"
    if local:
        os.environ.setdefault("DMLC_NODE_HOST", LOOPBACK)
        os.environ.setdefault("DMLC_INTERFACE", "lo")
    path = launch_py()
    sys.argv = [str(path), *argv]
    with contextlib.ExitStack() as stack:
        stack.enter_context(tracker_compat())
        from dmlc_tracker import tracker
        stack.enter_context(claimed_scheduler_port(tracker))
        if local:
            stack.enter_context(scheduler_address(tracker, LOOPBACK))
        runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
