"""Fail fast: a failing dist_sync worker leaves at once instead of deadlocking in
ps-lite's exit barrier (docs/design/session.md). The functions are this process's
:class:`~mxlarge.protocol.session.WorkerSession`'s, so a failing worker's heartbeat is
settled first.

Usage in a worker's entry point (after ``import mxnet``)::

    from mxlarge.protocol.failfast import fail_fast
    with fail_fast():
        train()

Code that must run before such an exit (e.g. marking an MLflow run FAILED) belongs in an
``except`` inside the block: atexit handlers and finalizers do not run.
"""
from __future__ import annotations

from mxlarge.protocol.session import SESSION

#: ``with fail_fast():`` any exception, or ``sys.exit(n)`` with n ≠ 0, exits at once.
fail_fast = SESSION.fail_fast
#: A ``sys.excepthook`` that exits at once, for code that cannot be wrapped in
#: ``fail_fast``.
install_fail_fast = SESSION.install_fail_fast
#: Settle the heartbeats, flush stdio and logging, ``os._exit(code)``.
exit_now = SESSION.exit_now
