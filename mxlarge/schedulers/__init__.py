"""Learning-rate schedules as pure functions of the integer step.

Every schedule is a small frozen dataclass with ``__call__(step) -> float``: no hidden counter, no
mutation, picklable with protocol 0 (MXNet pickles optimizers and everything they hold). Warmup
is not a flag on each schedule: it is composition with :class:`Join`, where each part counts from
its own start (as optax's ``join_schedules``).

Step convention: ``step`` is the number of updates already applied, so the first update uses
``schedule(0)``. (MXNet's own optimizers call their ``lr_scheduler`` with 1 on the first update;
see ``tests/schedulers/test_schedulers.py``.)
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "Schedule", "Constant", "Linear", "MultiStep", "Cosine", "Polynomial", "Join", "Scaled",
    "Shifted", "warmed_up", "goyal", "scaled_lr", "epochs_to_steps",
]


class Schedule(Protocol):
    def __call__(self, step: int) -> float: ...


def _check_step(step: int) -> int:
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return int(step)


@dataclass(frozen=True)
class Constant:
    """η(t) = value."""

    value: float

    def __call__(self, step: int) -> float:
        _check_step(step)
        return float(self.value)


@dataclass(frozen=True)
class Linear:
    """η(t) = start + (end − start) · min(t, steps) / steps; ``end`` from t = steps on."""

    start: float
    end: float
    steps: int

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"Linear needs steps >= 1, got {self.steps}")

    def __call__(self, step: int) -> float:
        t = min(_check_step(step), self.steps)
        return float(self.start + (self.end - self.start) * t / self.steps)


@dataclass(frozen=True)
class MultiStep:
    """η(t) = value · factor^j, j = number of boundaries b with b <= t."""

    value: float
    boundaries: tuple[int, ...]
    factor: float = 0.1

    def __post_init__(self) -> None:
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError(f"MultiStep boundaries must increase, got {self.boundaries}")

    def __call__(self, step: int) -> float:
        j = bisect.bisect_right(self.boundaries, _check_step(step))
        return float(self.value * self.factor ** j)


@dataclass(frozen=True)
class Cosine:
    """η(t) = end + (start − end) · (1 + cos(π · min(t, steps) / steps)) / 2."""

    start: float
    steps: int
    end: float = 0.0

    def __call__(self, step: int) -> float:
        t = min(_check_step(step), self.steps)
        cos = math.cos(math.pi * t / self.steps)
        return float(self.end + (self.start - self.end) * (1 + cos) / 2)


@dataclass(frozen=True)
class Polynomial:
    """η(t) = end + (start − end) · (1 − min(t, steps) / steps)^power."""

    start: float
    steps: int
    end: float = 0.0
    power: float = 2.0

    def __call__(self, step: int) -> float:
        t = min(_check_step(step), self.steps)
        return float(self.end + (self.start - self.end) * (1 - t / self.steps) ** self.power)


@dataclass(frozen=True)
class Join:
    """Runs ``schedules[i]`` from ``boundaries[i-1]`` on, each counting from its own start.

    η(t) = schedules[i](t − b_{i−1}) with i = number of boundaries b <= t and b_{−1} = 0.
    """

    schedules: tuple
    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.schedules) != len(self.boundaries) + 1:
            raise ValueError("Join needs exactly one more schedule than boundaries")
        if list(self.boundaries) != sorted(self.boundaries):
            raise ValueError(f"Join boundaries must increase, got {self.boundaries}")

    def __call__(self, step: int) -> float:
        step = _check_step(step)
        i = bisect.bisect_right(self.boundaries, step)
        start = self.boundaries[i - 1] if i else 0
        return self.schedules[i](step - start)


@dataclass(frozen=True)
class Scaled:
    """η(t) = factor · schedule(t) (a scaling rule applied to a whole schedule)."""

    schedule: Schedule
    factor: float

    def __call__(self, step: int) -> float:
        return float(self.factor * self.schedule(_check_step(step)))


@dataclass(frozen=True)
class Shifted:
    """η(t) = schedule(t + offset): ``schedule`` keeps its absolute step numbers when it is the
    second part of a :class:`Join` (which counts each part from its own start)."""

    schedule: Schedule
    offset: int

    def __call__(self, step: int) -> float:
        return float(self.schedule(_check_step(step) + self.offset))


def warmed_up(main: Schedule, warmup_steps: int, warmup_lr: float) -> Schedule:
    """Gradual warmup in front of any schedule (Goyal §2.2, per iteration).

    η(t) = warmup_lr + (main(W) − warmup_lr) · t / W for t < W, then main(t): the ramp ends at
    the value the main schedule has at W, so the two meet without a jump.
    """
    if warmup_steps <= 0:
        return main
    return Join((Linear(warmup_lr, float(main(warmup_steps)), warmup_steps),
                 Shifted(main, warmup_steps)), (warmup_steps,))


def scaled_lr(base_lr: float, reference_batch: int, global_batch: int, rule: str) -> float:
    """LR scaling rule: linear η = η_ref·B/B_ref, sqrt η = η_ref·sqrt(B/B_ref), or none."""
    ratio = global_batch / reference_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return base_lr
    raise ValueError(f"unknown scaling rule {rule!r}")


def epochs_to_steps(epochs: float, steps_per_epoch: int) -> int:
    """The single place where epochs become steps: round(epochs · steps_per_epoch)."""
    return int(round(epochs * steps_per_epoch))


def goyal(peak_lr: float, warmup_lr: float, warmup_steps: int, decay_steps: tuple[int, ...],
          factor: float = 0.1, warmup: str = "linear") -> Schedule:
    """Goyal et al.'s schedule: warmup per iteration, then step decay.

    η(t) = warmup_lr + (peak − warmup_lr) · t / W for t < W (``linear``; ``constant`` keeps
    warmup_lr), then peak · factor^j with j = number of decay steps <= t. Decay steps are absolute
    step numbers; the decay part of the :class:`Join` counts from W, hence the shift.
    """
    if warmup == "none" or warmup_steps == 0:
        return MultiStep(peak_lr, tuple(int(d) for d in decay_steps), factor)
    if any(d < warmup_steps for d in decay_steps):
        raise ValueError(f"decay steps {decay_steps} fall inside the warmup ({warmup_steps} steps)")
    main = MultiStep(peak_lr, tuple(int(d) - warmup_steps for d in decay_steps), factor)
    first = Linear(warmup_lr, peak_lr, warmup_steps) if warmup == "linear" else Constant(warmup_lr)
    return Join((first, main), (warmup_steps,))
