"""The one seam for everything that watches a training step: :class:`StepObserver`.

Every step runs one sequence, whoever drives it (``TrainLoop``, ``Trainer.step`` or a
script's own ``allreduce_grads()`` and ``update()``). The Trainer and its store tell
their observers what happens, in this order:

1. ``step_begun(step)``: step ``step.t`` begins. The loop begins it before the forward and says
   how long it waited for the batch (``step.data``); a script's step begins at its exchange.
2. ``forward_done(step, loss, micro)`` and ``backward_done(step, grads, micro)``: only from the
   loop, once per micro-batch (``micro``: the simulated worker, None without them). The
   forward's event comes before its backward is issued.
3. ``exchange_begun(step, grads)``: the gradients are pushed from here on.
4. ``bucket_push(step, key, nbytes, sent)``, ``bucket_pushed(step, key, sent)`` and
   ``bucket_pulled(step, key, sent)``: one bucket's push and pull, only in a step an observer
   marks (``step.marked``): there each bucket goes as a push and a pull, not one pushpull.
5. ``exchange_done(step, grads)``: every sum is issued into ``grads``.
6. ``update_begun(step)`` and ``update_done(step, applied, weights)``: the optimizer update
   (``applied``: False when AMP skipped it for an overflow).

Observers run in the order of their :attr:`StepObserver.stage`. They never hold one
another: what one finds out travels on the :class:`Step` to the ones after it
(``marked``, ``sample``, ``parts``). A new observer is one class; docs/observers.md
shows one.

Imports nothing of MXNet: arrays pass through as the events' arguments.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Observers that take engine marks and decide whether a step is marked (the timeline).
MARK = 10
#: Observers that time a step with engine syncs (the breakdown), after the marking ones.
TIME = 20
#: Observers that report what the ones before found (the heartbeat, loggers).
REPORT = 30


@dataclass(frozen=True)
class DataWait:
    """The loop's wait for a step's batch: from ``began`` (``time.time()``) for ``seconds``."""

    began: float
    seconds: float


@dataclass
class Step:
    """One step in progress, handed to every event of it.

    Attributes:
        t: the step's number, as its driver counts (the loop's counter; else the Trainer's
            ``num_update`` when the step began).
        data: the loop's wait for the batch; None for a script's step.
        marked: an observer takes engine marks in this step (a timeline records it). No
            observer syncs the engine in it, and each bucket goes as a push and a pull.
        sample: the step's parts in seconds, when an observer timed it
            (:class:`mxlarge.breakdown.Sample`).
        parts: the timing observer's recent medians in ms, what a heartbeat carries.
        servers: per server, the timing observer's recent median wait for its sums (ms)
            and its share of the pushed bytes (:meth:`mxlarge.breakdown.RecentSamples.servers`).
        applied: whether the update was applied (None until it is done).
    """

    t: int
    data: DataWait | None = None
    marked: bool = False
    sample: Any = None
    parts: dict[str, float] | None = None
    servers: list[list[float]] | None = None
    applied: bool | None = None


class StepObserver:
    """Base class: override the events you need (the module docstring lists them)."""

    stage: int = REPORT

    def step_begun(self, step: Step) -> None: ...

    def forward_done(self, step: Step, loss: Any, micro: int | None) -> None: ...

    def backward_done(self, step: Step, grads: Sequence[Any], micro: int | None) -> None: ...

    def exchange_begun(self, step: Step, grads: Sequence[Any]) -> None: ...

    def bucket_push(self, step: Step, key: int, nbytes: int, sent: Sequence[Any]) -> None: ...

    def bucket_pushed(self, step: Step, key: int, sent: Sequence[Any]) -> None: ...

    def bucket_pulled(self, step: Step, key: int, sent: Sequence[Any]) -> None: ...

    def exchange_done(self, step: Step, grads: Sequence[Any]) -> None: ...

    def update_begun(self, step: Step) -> None: ...

    def update_done(self, step: Step, applied: bool, weights: Sequence[Any]) -> None: ...

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """The worker is ``what`` (evaluating, checkpointing) rather than stepping."""
        yield


@dataclass
class Observers:
    """The observers of one Trainer, called in the order of their stage (stable for
    equal stages). Each event method calls every observer's method of that name."""

    members: list[StepObserver] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.members = sorted(self.members, key=lambda o: o.stage)

    def add(self, observer: StepObserver) -> None:
        """Adds ``observer`` in its stage's place."""
        self.members = sorted([*self.members, observer], key=lambda o: o.stage)

    def remove(self, observer: StepObserver) -> None:
        self.members = [o for o in self.members if o is not observer]

    def find(self, kind: type) -> Any:
        """The first observer of type ``kind``, or None."""
        return next((o for o in self.members if isinstance(o, kind)), None)

    def __bool__(self) -> bool:
        return bool(self.members)

    def step_begun(self, step: Step) -> None:
        for o in self.members:
            o.step_begun(step)

    def forward_done(self, step: Step, loss: Any, micro: int | None = None) -> None:
        for o in self.members:
            o.forward_done(step, loss, micro)

    def backward_done(self, step: Step, grads: Sequence[Any], micro: int | None = None) -> None:
        for o in self.members:
            o.backward_done(step, grads, micro)

    def exchange_begun(self, step: Step, grads: Sequence[Any]) -> None:
        for o in self.members:
            o.exchange_begun(step, grads)

    def bucket_push(self, step: Step, key: int, nbytes: int, sent: Sequence[Any]) -> None:
        for o in self.members:
            o.bucket_push(step, key, nbytes, sent)

    def bucket_pushed(self, step: Step, key: int, sent: Sequence[Any]) -> None:
        for o in self.members:
            o.bucket_pushed(step, key, sent)

    def bucket_pulled(self, step: Step, key: int, sent: Sequence[Any]) -> None:
        for o in self.members:
            o.bucket_pulled(step, key, sent)

    def exchange_done(self, step: Step, grads: Sequence[Any]) -> None:
        for o in self.members:
            o.exchange_done(step, grads)

    def update_begun(self, step: Step) -> None:
        for o in self.members:
            o.update_begun(step)

    def update_done(self, step: Step, applied: bool, weights: Sequence[Any]) -> None:
        for o in self.members:
            o.update_done(step, applied, weights)

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        """Every observer's :meth:`StepObserver.busy` for the block."""
        with contextlib.ExitStack() as stack:
            for o in self.members:
                stack.enter_context(o.busy(what))
            yield
