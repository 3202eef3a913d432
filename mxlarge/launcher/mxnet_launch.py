"""MXNet's own ``tools/launch.py``, runnable on Python 3.11.

``python -m mxlarge.launcher.mxnet_launch -n 2 -s 1 --launcher local mxlarge train CFG`` runs
the unmodified launch.py from the installed wheel inside :func:`tracker_compat` (without it the
tracker crashes on ``Thread.isAlive`` after starting the scheduler and leaves it orphaned). For
``--launcher local`` it also sets ``DMLC_NODE_HOST=127.0.0.1`` unless set, so that the job stays
on loopback (the tracker otherwise advertises the primary NIC). The command is the same
``mxlarge train`` as everywhere: its scheduler and server roles start inside ``import mxnet``.

MXNet's local launcher neither prefixes output nor tears the job down when one process fails
(it retries); ``mxlarge launch`` does both and is the recommended front end.
"""
from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from mxlarge.launcher.cluster import tracker_compat


def launch_py() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mxnet is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "tools" / "launch.py"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "local" in argv:
        os.environ.setdefault("DMLC_NODE_HOST", "127.0.0.1")
        os.environ.setdefault("DMLC_INTERFACE", "lo")
    path = launch_py()
    sys.argv = [str(path), *argv]
    with tracker_compat():
        runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
