"""The large-minibatch update of Goyal et al. (2017), run through MXNet's own kernels.

MXNet's momentum SGD kernels (``sgd_mom_update``/``multi_sgd_mom_update``) implement eq. (10) of
the paper, with the learning rate inside the velocity::

    v ← m·v − η_t·(r·g + λ·w);   w ← w + v                                     (eq. 10)

whereas the update the paper analyses (and whose LR scaling rule holds) is eq. (9)::

    u ← m·u + (r·g + λ·w);       w ← w − η_t·u                                 (eq. 9)

With v = −η_t·u the two agree iff the velocity is rescaled by η_t/η_{t−1} whenever the
LR changes ("momentum correction"). Scaling v by that ratio before the kernel is the
same as passing the kernel the momentum m·η_t/η_{t−1}, so the correction costs nothing
and needs no stored LR: the ratio follows from the schedule and the step. ``r`` is
1/(k·n), the global batch, so that the summed gradient of k workers becomes the mean
over all k·n images.

MXNet's Nesterov kernel (``nag_mom_update``) is the eq. (10) form too (measured: v ← m·v
− η·d; w ← w + m·v − η·d with d = r·g + λw, whatever the ``NAG`` docstring says), so it
gets the same correction. Called in place (``out=weight``) it reads the *updated* weight
for the decay term of the velocity (measured), so the updater writes to a temporary and
copies.

LARS (You et al. 2017) rescales the LR of each decayed tensor by
η_l = η_t · eta · ‖w‖ / (‖r·g‖ + λ‖w‖) (left at η_t when a norm is zero), using MXNet's
``multi_sum_sq`` and ``multi_lars`` kernels. MXNet's own ``LARS`` optimizer is not reused
directly: it picks the excluded tensors by name suffix, and its momentum correction keeps the
previous LR in the object and so resets to 1 after the first aggregated group of a step.

Which kernel runs a tensor: on CPU (with momentum) a tensor of :data:`ALONE` elements or
more gets ``sgd_mom_update`` of its own and the smaller ones share the multi-tensor
kernel; on a GPU every tensor goes through the multi-tensor kernel. Both give bitwise
the same result (``tests/kvstore/test_updater.py``); why: docs/design/sync.md, "The
update's kernels".

**Mixed precision** (``multi_precision=True``, as MXNet's SGD): a float16 weight keeps a
float32 master copy and float32 momentum in its state ``(momentum, master)``; the
kernels are MXNet's multi-precision ones (``multi_mp_sgd_mom_update``,
``preloaded_multi_mp_sgd_mom_update``; NAG runs its float32 kernel on the master copy),
which update the master copy in float32 and write the float16 weight as its rounding,
with the same momentum correction and per-role decay: the master copies follow the
float32 update exactly (``tests/kvstore/test_updater.py``).

Every attribute is a plain Python value so the object survives MXNet's protocol-0
pickle.
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np
from mxnet import ndarray as nd
from mxnet import optimizer as mxopt

_CHUNK = 16  # tensors per multi-tensor kernel call (MXNet's aggregation is bounded)
#: On CPU, tensors of at least this many elements are updated by a kernel call of their
#: own (module docstring): about where one launch (~25 µs) costs what the multi-tensor
#: kernel's slower elements (~1.8 ns each) do.
ALONE = 1 << 14


class ScheduledLR:
    """MXNet's own LR accessors would answer from a stored LR that mxlarge's optimizers never
    use (their LR is ``schedule(step)``): they are refused instead of answering η(0) or
    ignoring a change."""

    @property
    def learning_rate(self) -> float:
        raise AttributeError("the LR of mxlarge's optimizer is a function of the step: read "
                             "trainer.learning_rate (or optimizer.lr_at(step))")

    def set_learning_rate(self, lr: float) -> None:
        raise AttributeError("the LR of mxlarge's optimizer is a function of the step: use "
                             "trainer.set_learning_rate(lr), which keeps the momentum correction")


@mxopt.register
class LargeBatchSGD(ScheduledLR, mxopt.Optimizer):
    """SGD with momentum, momentum correction, per-role weight decay and optional LARS.

    Args:
        schedule: ``schedule(step) -> lr``, a pure picklable function of the step.
        momentum: m.
        nesterov: use MXNet's NAG kernel.
        momentum_correction: rescale the velocity by η_t/η_{t−1} (eq. 9 instead of eq. 10).
        wd: λ for decayed tensors.
        no_decay: parameter indices that get no weight decay (BN γ/β, biases).
        lars: layer-wise trust ratio for decayed tensors.
        lars_eta: LARS trust coefficient.
        lars_eps: added to the LARS denominator.
        multi_precision: float16 weights get a float32 master copy and float32 momentum.
    """

    def __init__(self, schedule: Any, momentum: float = 0.9, nesterov: bool = False,
                 momentum_correction: bool = True, wd: float = 0.0,
                 no_decay: Sequence[int] = (), lars: bool = False, lars_eta: float = 0.001,
                 lars_eps: float = 0.0, multi_precision: bool = False, **kwargs: Any):
        if lars and nesterov:
            raise ValueError("LARS with Nesterov momentum is not supported")
        super().__init__(learning_rate=float(schedule(0)), wd=float(wd),
                         multi_precision=bool(multi_precision), **kwargs)
        self.schedule = schedule
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.momentum_correction = bool(momentum_correction)
        self.no_decay = tuple(sorted(int(i) for i in no_decay))
        self.lars = bool(lars)
        self.lars_eta = float(lars_eta)
        self.lars_eps = float(lars_eps)

    # -- pure functions of the step ----------------------------------------------------
    def lr_at(self, step: int) -> float:
        return float(self.schedule(step))

    def momentum_at(self, step: int) -> float:
        """m · η_t/η_{t−1} (the corrected momentum), or m without correction and at step 0."""
        if not self.momentum_correction or step == 0:
            return self.momentum
        prev = self.lr_at(step - 1)
        return self.momentum * self.lr_at(step) / prev if prev > 0 else self.momentum

    def wd_for(self, index: int) -> float:
        # no_decay is sorted: a binary search keeps the per-step weight-decay lookup
        # O(log n)
        j = bisect.bisect_left(self.no_decay, index)
        decayed = j == len(self.no_decay) or self.no_decay[j] != index
        return float(self.wd) if decayed else 0.0

    # -- MXNet optimizer protocol ------------------------------------------------------
    def create_state(self, index: int, weight: nd.NDArray) -> nd.NDArray | None:
        if self.momentum == 0.0:
            return None
        return nd.zeros(weight.shape, weight.context, dtype=weight.dtype)

    def create_state_multi_precision(self, index: int, weight: nd.NDArray) -> Any:
        """``(momentum, master)`` in float32 for a float16 weight under
        ``multi_precision`` (MXNet's layout, so its kernels and states files apply),
        else :meth:`create_state`."""
        if self.multi_precision and weight.dtype == np.float16:
            master = weight.astype(np.float32)
            return (self.create_state(index, master), master)
        return self.create_state(index, weight)

    @staticmethod
    def parts(state: Any, dtype: Any) -> dict[str, nd.NDArray]:
        """The named arrays of one state: ``momentum`` and ``master`` (either may be absent)."""
        momentum, master = state if isinstance(state, tuple) else (state, None)
        return {k: v for k, v in (("momentum", momentum), ("master", master)) if v is not None}

    def update(self, index: int | list[int] | tuple[int, ...], weight: Any, grad: Any,  # noqa: D401
               state: Any) -> None:  # MXNet's signature: one array each, or lists
        """MXNet's per-call entry (e.g. when run by ``gluon.Trainer`` or on a server).

        MXNet counts updates itself and its first count is 1, so the step is count − 1.
        """
        indices = index if isinstance(index, (list, tuple)) else [index]
        self._update_count(indices)
        step = self._index_update_count[indices[0]] - 1
        if not isinstance(index, (list, tuple)):
            weight = [weight]
            grad = [grad]
            state = [state]
        self.apply(step, indices, weight, grad, state, self.rescale_grad)

    def update_multi_precision(self, index: int | list[int] | tuple[int, ...], weight: Any,
                               grad: Any, state: Any) -> None:
        """The float16 weights' ``(momentum, master)`` states are handled by :meth:`apply`."""
        self.update(index, weight, grad, state)

    # -- the update --------------------------------------------------------------------
    def apply(self, step: int, indices: Sequence[int], weights: Sequence[nd.NDArray],
              grads: Sequence[nd.NDArray], states: Sequence[nd.NDArray | None],
              rescale_grad: float) -> None:
        """Applies update number ``step`` (0-based) to ``weights`` in place.

        Args:
            step: updates already applied; the LR is ``schedule(step)``.
            indices: parameter indices (for weight-decay roles).
            weights, grads, states: aligned lists; ``grads`` are the summed gradients.
            rescale_grad: r, normally 1 / global batch.
        """
        lr = self.lr_at(step)
        momentum = self.momentum_at(step)
        wds = [self.wd_for(i) for i in indices]
        rescale_grad = float(rescale_grad)
        mixed = [j for j, s in enumerate(states) if isinstance(s, tuple)]
        if mixed:
            if len(mixed) < len(states):  # float32 tensors beside float16 ones: each group
                plain = [j for j in range(len(states)) if not isinstance(states[j], tuple)]
                for part in (plain, mixed):
                    self.apply(step, [indices[j] for j in part], [weights[j] for j in part],
                               [grads[j] for j in part], [states[j] for j in part],
                               rescale_grad)
                return
            self._apply_mixed(weights, grads, states, lr, momentum, wds, rescale_grad, indices)
            return
        if self.nesterov:
            # The NAG kernel also uses m for the look-ahead term, so the correction is
            # applied to the velocity itself rather than folded into m.
            ratio = momentum / self.momentum if self.momentum > 0 else 1.0
            for w, g, s, wd in zip(weights, grads, states, wds):
                if s is None:
                    nd.sgd_update(w, g, out=w, lr=lr, wd=wd, rescale_grad=rescale_grad)
                else:
                    if ratio != 1.0:
                        s *= ratio
                    fresh = nd.nag_mom_update(w, g, s, lr=lr, wd=wd, momentum=self.momentum,
                                              rescale_grad=rescale_grad)
                    fresh.copyto(w)
            return
        if self.lars:
            self._apply_lars(indices, weights, grads, states, lr, momentum, wds, rescale_grad)
            return
        # sgd_update is not bitwise multi_sgd_update (measured), so without momentum
        # every tensor stays on the multi-tensor kernel.
        split = self.momentum > 0 and bool(weights) and weights[0].context.device_type == "cpu"
        shared = []
        for j, w in enumerate(weights):
            if split and w.size >= ALONE:
                nd.sgd_mom_update(w, grads[j], states[j], out=w, lr=lr, wd=wds[j],
                                  momentum=momentum, rescale_grad=rescale_grad)
            else:
                shared.append(j)
        for lo in range(0, len(shared), _CHUNK):
            part = shared[lo:lo + _CHUNK]
            w = [weights[j] for j in part]
            g = [grads[j] for j in part]
            kw = dict(out=w, num_weights=len(w), lrs=tuple([lr] * len(w)),
                      wds=tuple(wds[j] for j in part), rescale_grad=rescale_grad)
            if self.momentum > 0:
                s = [states[j] for j in part]
                nd.multi_sgd_mom_update(*_interleave(w, g, s), momentum=momentum, **kw)
            else:
                nd.multi_sgd_update(*_interleave(w, g), **kw)

    def _apply_mixed(self, weights: Sequence[nd.NDArray], grads: Sequence[nd.NDArray],
                     states: Sequence[Any], lr: float, momentum: float, wds: Sequence[float],
                     rescale_grad: float, indices: Sequence[int]) -> None:
        """Float16 weights with float32 ``(momentum, master)`` states: MXNet's mp kernels."""
        moms = [s[0] for s in states]
        masters = [s[1] for s in states]
        if self.nesterov:
            # the float32 path on the master copy (its NAG kernel, written to a
            # temporary: in place it would read the updated weight in its decay term),
            # then rounded
            ratio = momentum / self.momentum if self.momentum > 0 else 1.0
            for w, g, m, w32, wd in zip(weights, grads, moms, masters, wds):
                if m is None:
                    nd.mp_sgd_update(w, g, w32, out=w, lr=lr, wd=wd, rescale_grad=rescale_grad)
                    continue
                if ratio != 1.0:
                    m *= ratio
                fresh = nd.nag_mom_update(w32, g.astype(np.float32), m, lr=lr, wd=wd,
                                          momentum=self.momentum, rescale_grad=rescale_grad)
                fresh.copyto(w32)
                nd.cast(w32, dtype=np.float16, out=w)
            return
        if self.lars:
            self._apply_lars(indices, weights, grads, states, lr, momentum, wds, rescale_grad)
            return
        for lo in range(0, len(weights), _CHUNK):
            hi = min(lo + _CHUNK, len(weights))
            w = list(weights[lo:hi])
            kw = dict(out=w, num_weights=len(w), lrs=tuple([lr] * len(w)),
                      wds=tuple(wds[lo:hi]), rescale_grad=rescale_grad)
            if self.momentum > 0:
                nd.multi_mp_sgd_mom_update(
                    *_interleave(w, grads[lo:hi], moms[lo:hi], masters[lo:hi]),
                    momentum=momentum, **kw)
            else:
                nd.multi_mp_sgd_update(*_interleave(w, grads[lo:hi], masters[lo:hi]), **kw)

    def _apply_lars(self, indices: Sequence[int], weights: Sequence[nd.NDArray],
                    grads: Sequence[nd.NDArray], states: Sequence[Any], lr: float,
                    momentum: float, wds: Sequence[float], rescale_grad: float) -> None:
        ctx = weights[0].context
        lars_pos = [j for j, i in enumerate(indices) if i not in self.no_decay]
        mixed = bool(states) and isinstance(states[0], tuple)
        # the trust ratio of a float16 weight is taken on its float32 master copy
        norm_of = [s[1] for s in states] if mixed else weights
        lrs = nd.array([lr] * len(weights), ctx=ctx, dtype="float32")
        wd_arr = nd.array(wds, ctx=ctx, dtype="float32")
        if lars_pos:
            sel_lrs = nd.array([lr] * len(lars_pos), ctx=ctx, dtype="float32")
            w_sq = nd.multi_sum_sq(*[norm_of[j] for j in lars_pos], num_arrays=len(lars_pos))
            g_sq = nd.multi_sum_sq(*[grads[j] for j in lars_pos], num_arrays=len(lars_pos))
            nd.multi_lars(sel_lrs, w_sq, g_sq, nd.array([wds[j] for j in lars_pos], ctx=ctx),
                          eta=self.lars_eta, eps=self.lars_eps, rescale_grad=rescale_grad,
                          out=sel_lrs)
            lrs[nd.array(lars_pos, ctx=ctx)] = sel_lrs
        for lo in range(0, len(weights), _CHUNK):
            hi = min(lo + _CHUNK, len(weights))
            w = list(weights[lo:hi])
            g = list(grads[lo:hi])
            kw = dict(out=w, num_weights=len(w), rescale_grad=rescale_grad)
            if mixed:
                m = [s[0] for s in states[lo:hi]]
                w32 = [s[1] for s in states[lo:hi]]
                if self.momentum > 0:
                    nd.preloaded_multi_mp_sgd_mom_update(*_interleave(w, g, m, w32), lrs[lo:hi],
                                                         wd_arr[lo:hi], momentum=momentum, **kw)
                else:
                    nd.preloaded_multi_mp_sgd_update(*_interleave(w, g, w32), lrs[lo:hi],
                                                     wd_arr[lo:hi], **kw)
            elif self.momentum > 0:
                s = list(states[lo:hi])
                nd.preloaded_multi_sgd_mom_update(*_interleave(w, g, s), lrs[lo:hi],
                                                  wd_arr[lo:hi], momentum=momentum, **kw)
            else:
                nd.preloaded_multi_sgd_update(*_interleave(w, g), lrs[lo:hi], wd_arr[lo:hi], **kw)


def _interleave(*lists: Sequence[Any]) -> list[Any]:
    return [x for group in zip(*lists) for x in group]
