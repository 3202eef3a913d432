"""Any other MXNet optimizer (Adam, LAMB, RMSProp, ...) under the recipe's schedule and
roles.

:class:`~mxlarge.kvstore.updater.LargeBatchSGD` reproduces the momentum-SGD family with
its own kernels; every other optimizer runs MXNet's own ``update_multi_precision`` on
the summed gradients, called as ``mx.optimizer.Updater`` calls it under
``gluon.Trainer`` (grouped by dtype, in chunks of ``aggregate_num``), with three things
set before each call:

* the LR: ``lr = η(t)``, the Trainer's schedule (scaling, warmup, the user's ``lr_scheduler``),
  with the optimizer's own scheduler detached (a stateful scheduler would count twice);
* the update count: every index's count is set to t, so MXNet's ``_update_count`` makes it
  t + 1, the count Adam/LAMB's bias correction 1 − β^t reads (a pure function of the step, so
  a resume continues exactly);
* the decay roles: ``wd_mult[i] = 0`` for the tensors without weight decay (BN γ/β, biases),
  read by MXNet's ``_get_wds``; ``rescale_grad = 1/(k·n)``.

Momentum correction (Goyal's η_t/η_{t−1} on the velocity) applies to optimizers whose
state carries the LR (eq. 10); Adam-family moments carry none (the LR multiplies m/√v at
the update, eq. 9's form already), so nothing is corrected here.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np
from mxnet import ndarray as nd
from mxnet import optimizer as mxopt

from mxlarge.kvstore.updater import ScheduledLR

#: Optimizers that cannot keep the replicas identical or resume, with the reason.
REFUSED = {
    "SGLD": "it adds random noise on every worker, so the replicas would drift apart",
    "Nadam": "its m_schedule is a product kept in the optimizer object over every update "
             "call (per tensor and device), which a states file cannot carry",
}


class MXNetUpdate(ScheduledLR, mxopt.Optimizer):
    """Runs ``optimizer`` (an ``mx.optimizer`` instance, copied) at η(t) (module
    docstring).

    Args:
        schedule: ``schedule(step) -> lr``.
        optimizer: the MXNet optimizer to run; the caller's object is not changed.
    """

    def __init__(self, schedule: Any, optimizer: mxopt.Optimizer):
        super().__init__(learning_rate=float(schedule(0)),
                         multi_precision=bool(optimizer.multi_precision))
        self.schedule = schedule
        inner = copy.copy(optimizer)
        inner.lr_scheduler = None
        inner.param_dict = {}
        inner.idx2name = {}
        inner.lr_mult = {}
        inner.wd_mult = {}
        inner._all_index_update_counts = {0: {}}
        inner._index_update_count = inner._all_index_update_counts[0]
        self.inner = inner
        self.momentum = 0.0  # no velocity that carries the LR (module docstring)
        self._no_decay: tuple[int, ...] = ()

    @property
    def no_decay(self) -> tuple[int, ...]:
        """Parameter indices without weight decay."""
        return self._no_decay

    @no_decay.setter
    def no_decay(self, indices: Sequence[int]) -> None:
        self._no_decay = tuple(sorted(int(i) for i in indices))
        self.inner.wd_mult = dict.fromkeys(self._no_decay, 0.0)

    def lr_at(self, step: int) -> float:
        return float(self.schedule(step))

    def create_state_multi_precision(self, index: int, weight: nd.NDArray) -> Any:
        return self.inner.create_state_multi_precision(index, weight)

    def parts(self, state: Any, dtype: Any) -> dict[str, nd.NDArray]:
        """The named arrays of one state (``mxlarge.trainer.states``): ``master``
        (MXNet's base layout ``(master, state)`` for a ``dtype`` float16 weight under
        ``multi_precision``) and ``state0``, ``state1``, ... the optimizer's arrays in
        order (Adam: mean, var)."""
        out = {}
        if self.multi_precision and np.dtype(dtype) == np.float16:
            out["master"], state = state
        out.update({f"state{j}": a for j, a in enumerate(_leaves(state))})
        return out

    def update(self, index: Any, weight: Any, grad: Any,  # noqa: D401 - MXNet's signature
               state: Any) -> NoReturn:
        raise AttributeError("mxlarge's optimizer runs through Trainer.update (the step comes "
                             "from the Trainer's count)")

    def apply(self, step: int, indices: Sequence[int], weights: Sequence[nd.NDArray],
              grads: Sequence[nd.NDArray], states: Sequence[Any], rescale_grad: float) -> None:
        """Applies update number ``step`` (0-based) to ``weights`` (one device) in place."""
        inner = self.inner
        if weights:
            inner._set_current_context(weights[0].context.device_id)
        inner.lr = self.lr_at(step)
        inner.rescale_grad = float(rescale_grad)
        for i in indices:
            inner._index_update_count[i] = step
        inner.num_update = step
        by_dtype: dict[Any, list[int]] = {}
        for j, w in enumerate(weights):
            by_dtype.setdefault(w.dtype, []).append(j)
        chunk = inner.aggregate_num
        for group in by_dtype.values():
            if chunk <= 0:
                for j in group:
                    inner.update_multi_precision(indices[j], weights[j], grads[j], states[j])
                continue
            for lo in range(0, len(group), chunk):
                part = group[lo:lo + chunk]
                inner.update_multi_precision([indices[j] for j in part],
                                             [weights[j] for j in part],
                                             [grads[j] for j in part],
                                             [states[j] for j in part])


def _leaves(state: Any) -> list[nd.NDArray]:
    if state is None:
        return []
    if isinstance(state, (tuple, list)):
        return [a for s in state for a in _leaves(s)]
    return [state]
