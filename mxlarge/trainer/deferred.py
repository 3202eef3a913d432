"""Gluon's deferred initialisation, watched: a callback the moment a parameter gets its
data.

A parameter built without its shape gets its data inside the first forward (Gluon's
``Parameter._init_impl``), or when weights are loaded. The Trainer must give it rank 0's
value right then, before the forward reads it and before any gradient of it can be
pushed (what Horovod-MXNet does for such parameters): so the instance's ``_init_impl``
is wrapped once.
"""
from __future__ import annotations

from collections.abc import Callable

import mxnet as mx


def on_init(param: mx.gluon.Parameter, callback: Callable[[], None]) -> None:
    """Runs ``callback()`` right after ``param``'s next ``_init_impl``, then unwraps it."""
    init_impl = param._init_impl

    def hook(data: mx.nd.NDArray, ctx_list: list) -> None:
        init_impl(data, ctx_list)
        del param._init_impl  # the class's method again
        callback()

    param._init_impl = hook
