"""Process groups as the supervisor uses them: which are alive, signalling one, and the
kernel's last word when the launcher dies.

Every child of the launcher leads a process group of its own, so a group id is a child's
pid; a group is alive while one of its processes is not a zombie (read from ``/proc``,
so a zombie leader, which keeps the id reserved, does not count). Importing this module
imports nothing else of mxlarge.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import Any

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def parent_death_signal() -> Any:
    """A ``preexec_fn`` asking the kernel to SIGKILL the child when the launcher dies.

    The last line of defence for what no ``finally`` can cover: a SIGKILLed launcher.
    Linux sends the signal when the *thread* that forked the child exits; every spawn
    here happens in a thread that outlives its child (the supervising thread, or dmlc's
    thread that waits for it). It covers the direct child only; its descendants rely on
    normal teardown. Returns ``None`` where prctl is unavailable.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def live_process_groups() -> set[int]:
    """Process-group ids that have at least one process that is not a zombie."""
    groups: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may contain spaces and parentheses: split after the
        # last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 3 and fields[0] not in (b"Z", b"X"):
            groups.add(int(fields[2]))
    return groups


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
