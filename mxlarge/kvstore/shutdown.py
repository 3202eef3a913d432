"""Leaving a dist job together: a worker's queued KVStore operations run before MXNet shuts down.

``import mxnet`` registers an ``atexit`` handler (``base._notify_shutdown``) that puts the engine
in its shutdown phase, in which every operation that has not started yet is *skipped*
(``ThreadedEngine::ExecuteOprBlock`` in MXNet 1.9.1 calls the completion callback without the
function), and then waits for the rest. A script that ends right after its last
``trainer.step()`` still has that step's pushpull queued. Where it had not started, it is
dropped: that gradient never reaches the server. The other workers, whose pushpulls were sent,
wait in that wait for the server's answer, and the worker that dropped its push waits for them
in the store's destructor (``~KVStoreDist``: wait, a worker barrier, rank 0 stops the servers,
``ps::Finalize``). Neither exits (issue 42: 4 hangs in 8 runs; gdb finds one worker in
``MXNotifyShutdown`` → ``WaitForAll``, the other in ``~KVStoreDist`` → ``Postoffice::Barrier``).
``gluon.Trainer`` on MXNet's own store does the same.

:func:`leave_together` (called by :func:`mxlarge.kvstore.sync.create` for every dist store it
hands out) registers, once per process, an ``atexit`` handler. It runs before MXNet's, because
``atexit`` runs handlers last in, first out and mxnet was imported first. It calls
``mx.nd.waitall()``, so this worker's pushes are sent and its pulls answered (which needs every
worker's pushes). Then comes a barrier of the workers, after which every worker's training is
over, and then the worker's heartbeat is marked finished
(:func:`mxlarge.protocol.heartbeat.finish_all`). What is left after that is MXNet's shutdown,
and a worker still running a grace period after every worker said finished is ended by the
launcher (:mod:`mxlarge.launcher.watchdog`). An uncaught exception never gets here: a dist store
comes with :func:`~mxlarge.protocol.failfast.install_fail_fast`, whose ``sys.excepthook``
(called before any ``atexit`` handler) ends the process at once. A wait or barrier on that path
would wait for peers that are themselves waiting in push/pull for this worker.
"""
from __future__ import annotations

import atexit
import weakref

import mxnet as mx

from mxlarge.protocol.failfast import install_fail_fast
from mxlarge.protocol.heartbeat import finish_all

_stores: list[weakref.ref[mx.kv.KVStore]] = []  # this process's dist store (one: sync.create)


def leave_together(kv: mx.kv.KVStore) -> None:
    """Make this process wait for ``kv``'s pending operations, and for every worker, at exit
    (module docstring). Idempotent; ``kv`` is a dist store of a worker."""
    install_fail_fast()
    if any(ref() is kv for ref in _stores):
        return
    if not _stores:
        atexit.register(_leave)
    _stores.append(weakref.ref(kv))


def _leave() -> None:
    mx.nd.waitall()
    for ref in _stores:
        kv = ref()
        if kv is not None:  # a store already freed has been through its own exit barrier
            kv._barrier()
    finish_all()
