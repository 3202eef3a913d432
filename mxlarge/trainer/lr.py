"""The Trainer's learning-rate control: η(t) as a pure function of the update count.

η(t) = Join(main, Constant(lr₁), …)(t) where each ``set_learning_rate(lrⱼ)`` starts a
constant part at the update count tⱼ it was called at, and ``main`` is the given
schedule (explicit form) or, in the Gluon form, warmed_up(ρ·η_user(t), warmup_steps,
warmup_lr) with ρ = scaled_lr(1, reference_batch, B, scaling), fixed once the global
batch B is known. The momentum correction η_t/η_{t−1} therefore applies at every change.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mxlarge import schedulers
from mxlarge.plan import World, scaled_down
from mxlarge.schedulers import Schedule


class LearningRate:
    """Writes η(t) (module docstring) into ``updater.schedule``.

    Args:
        updater: the optimizer that runs the update (its ``schedule`` and ``num_update``).
        base: the given schedule (explicit form) or η_user (Gluon form).
        large_batch: the Gluon form's (reference_batch, scaling, warmup_steps, warmup_lr), or
            None for the explicit form (a final schedule).
        mxnet_optimizer: the MXNet optimizer the Gluon form was given, whose refusals apply.
    """

    def __init__(self, updater: Any, base: Schedule,
                 large_batch: tuple[int | None, str, int, float | None] | None,
                 mxnet_optimizer: Any = None) -> None:
        self.updater = updater
        self.base = base
        self._large_batch = large_batch
        self._mxnet_optimizer = mxnet_optimizer
        self.batch: int | None = None  # images per worker and step the schedule is fixed for
        self._main: Schedule = base
        self._overrides: list[tuple[int, float]] = []  # set_learning_rate: (from step, lr)
        self._compose()

    @property
    def schedule(self) -> Schedule:
        return self.updater.schedule

    def fix(self, batch_size: int, world: Callable[[int], World]) -> str | None:
        """Fixes the schedule for ``batch_size`` images per worker (once); the Gluon
        form derives ``main`` from ``world(batch_size).global_batch`` (module
        docstring). The warmup starts at min(``warmup_lr`` or η_user(0), main(W)): it
        ramps up, never down. Returns :func:`mxlarge.plan.scaled_down`'s line, if the
        LR is scaled down."""
        self.batch = batch_size
        if self._large_batch is None:
            return None
        reference, scaling, warmup, warmup_lr = self._large_batch
        batch = world(batch_size).global_batch
        factor = schedulers.scaled_lr(1.0, reference, batch, scaling) if reference else 1.0
        main = schedulers.Scaled(self.base, factor) if factor != 1.0 else self.base
        start = self.base(0) if warmup_lr is None else warmup_lr
        self._main = schedulers.warmed_up(main, warmup, min(start, float(main(warmup))))
        self._compose()
        if not reference:
            return None
        return scaled_down(self.base(0), factor * self.base(0), batch, reference, scaling)

    def set(self, lr: float) -> None:
        """``lr`` (as is: already scaled) from the next update on: the schedule becomes
        Join(old, Constant(lr)) at t0 = ``num_update``.

        Raises:
            UserWarning: an ``lr_scheduler`` was given in ``optimizer_params``: MXNet's
                ``Optimizer.set_learning_rate`` raises it, as it does under gluon.Trainer.
        """
        if self._mxnet_optimizer is not None and self._mxnet_optimizer.lr_scheduler is not None:
            self._mxnet_optimizer.set_learning_rate(lr)  # raises gluon.Trainer's UserWarning
        t0 = self.updater.num_update
        if self._overrides and self._overrides[-1][0] == t0:
            self._overrides[-1] = (t0, float(lr))
        else:
            self._overrides.append((t0, float(lr)))
        self._compose()

    def current(self) -> float:
        """η of the most recent update; of the next one before any update and right
        after :meth:`set` (which gluon.Trainer returns at once)."""
        t = self.updater.num_update
        if t == 0 or (self._overrides and self._overrides[-1][0] == t):
            return self.updater.lr_at(t)
        return self.updater.lr_at(t - 1)

    def _compose(self) -> None:
        if self._overrides:
            self.updater.schedule = schedulers.Join(
                (self._main, *[schedulers.Constant(lr) for _, lr in self._overrides]),
                tuple(t for t, _ in self._overrides))
        else:
            self.updater.schedule = self._main
