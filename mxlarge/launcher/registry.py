"""The one place a backend is looked up by its ``--launcher`` name.

:data:`REGISTRY` maps each name that works to its class
(:mod:`mxlarge.launcher.backends`); sge and yarn, which dmlc_tracker also names, are
refused with the reason (:data:`UNSUPPORTED`). Everything else asks the backend object,
never its name. Importing this module does not import MXNet.
"""
from __future__ import annotations

import argparse

from mxlarge.launcher.backends.base import LaunchBackend
from mxlarge.launcher.backends.dmlc import DmlcBackend
from mxlarge.launcher.backends.local import LocalBackend
from mxlarge.launcher.backends.mpi import MpiBackend
from mxlarge.launcher.backends.slurm import SlurmBackend
from mxlarge.launcher.backends.ssh import SshBackend

REGISTRY: dict[str, type[LaunchBackend]] = {
    "local": LocalBackend, "ssh": SshBackend, "mpi": MpiBackend, "slurm": SlurmBackend}
#: the dmlc_tracker backends that work
SUPPORTED = tuple(n for n, c in REGISTRY.items() if issubclass(c, DmlcBackend))
BACKENDS = tuple(REGISTRY)

UNSUPPORTED: dict[str, str] = {
    "sge": (
        "dmlc_tracker's sge backend (MXNet 1.9.1) cannot run a parameter-server job: submit() "
        "reads args.logdir and args.vcores, which its option parser never defines "
        "(AttributeError before anything is submitted); it builds '-S /bin/bash-q QUEUE' for a "
        "non-default queue; and it never sets DMLC_ROLE, so no array task could tell whether "
        "it is a server or a worker. On an SGE cluster, request the nodes as a parallel job "
        "and use the 'ssh' or 'mpi' launcher from inside it (see docs/launching.md)."
    ),
    "yarn": (
        "dmlc_tracker's yarn backend (MXNet 1.9.1) cannot run: dmlc-yarn.jar and its build "
        "script are not shipped in the mxnet wheel, and the container bootstrap "
        "dmlc_tracker/launcher.py is neither executable nor runnable as a script (relative "
        "import), which is also how the scheduler is started."
    ),
}


def launcher_choice(name: str) -> str:
    """``--launcher NAME`` (an argparse ``type``): a backend that works; sge and yarn
    are refused with the reason (:data:`UNSUPPORTED`)."""
    if name in UNSUPPORTED:
        raise argparse.ArgumentTypeError(f"{name!r} is not supported: {UNSUPPORTED[name]}")
    if name not in BACKENDS:
        raise argparse.ArgumentTypeError(f"{name!r}: expected one of {', '.join(BACKENDS)}")
    return name


def backend_for(name: str) -> LaunchBackend:
    """A fresh backend object for ``--launcher name``.

    Raises:
        ValueError: an unknown or unsupported name (the reason).
    """
    try:
        return REGISTRY[launcher_choice(name)]()
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None
