"""Where a worker's step goes: waiting for data, forward+backward, waiting for the exchange, the
update (issue 55; how to read it: docs/breakdown.md).

MXNet's engine is asynchronous, so a wall-clock stamp around a call measures when it was
issued, not when its work ran. The loop therefore times only *sampled* steps (t with
t mod :data:`EVERY` = 0, the same step numbers on every rank) with an engine sync between the
parts: ``waitall`` before the forward (the previous step's work is not counted), after the
backward (``compute``), on the summed gradients (``exchange``: waiting for the other ranks and
the servers), after the update (``update``); ``data`` is the wait for the batch, ``step`` the
sum. A sampled step loses its overlap, so the cost is about 1/EVERY of what overlap saves
(``breakdown_cost`` in ``make bench``).
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mxlarge.hooks import MEASURE, Hook

#: A step t is sampled when t mod EVERY = 0 (the same steps on every rank).
EVERY = 10
#: Sampled steps in the heartbeat's window (the launcher's straggler rule reads its medians).
WINDOW = 20
#: The parts of a step, in the order a step runs them.
PARTS = ("data", "compute", "exchange", "update")


def sampled(step: int) -> bool:
    """Whether step ``step`` is timed with engine syncs."""
    return step % EVERY == 0


@dataclass(frozen=True)
class Sample:
    """One sampled step, seconds: ``step`` = data + compute + exchange + update; ``end`` the
    wall-clock time (``time.time()``) its exchange ended."""

    at: int
    data: float
    compute: float
    exchange: float
    update: float
    end: float

    @property
    def step(self) -> float:
        return self.data + self.compute + self.exchange + self.update


def medians_ms(samples: Sequence[Sample]) -> dict[str, float]:
    """Per part (and ``step``), the median over ``samples`` in ms, rounded to 0.1 ms."""
    return {p: round(1e3 * statistics.median(getattr(s, p) for s in samples), 1)
            for p in (*PARTS, "step")}


class Window:
    """The last :data:`WINDOW` samples; :meth:`record` is what the heartbeat carries
    (:attr:`mxlarge.protocol.heartbeat.Record.parts`)."""

    def __init__(self, size: int = WINDOW) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)

    def add(self, s: Sample) -> None:
        self.samples.append(s)

    def record(self) -> dict[str, float]:
        newest = self.samples[-1]
        return {**medians_ms(self.samples), "n": float(len(self.samples)),
                "at": float(newest.at), "end": round(newest.end, 4)}


def summary(ranks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Across ranks (``ranks[r]``: rank r's medians in ms, :func:`medians_ms`): the slowest rank
    by forward+backward, ``spread`` = its forward+backward ÷ the fastest's, and ``wait_share``
    = the median over ranks of exchange ÷ step (the share of a step spent waiting for the
    exchange, and so for the other ranks)."""
    compute = [r["compute"] for r in ranks]
    slowest = max(range(len(ranks)), key=compute.__getitem__)
    fastest = min(compute)
    return {"slowest_rank": float(slowest),
            "spread": compute[slowest] / fastest if fastest > 0 else 1.0,
            "wait_share": statistics.median(r["exchange"] / r["step"] if r["step"] > 0 else 0.0
                                            for r in ranks)}


class BreakdownHook(Hook):
    """Collects the loop's sampled steps (``StepOutput.sample``), hands the window to the
    heartbeat (the launcher's straggler rule), and at each epoch's end puts this rank's medians
    over the epoch's samples in the epoch's metrics (``breakdown/rank{r}/{part}_ms``) and, on
    every rank through the store's exact gather (``each_rank``), the summary across ranks
    (``breakdown/slowest_rank``, ``breakdown/spread``, ``breakdown/wait_share``:
    :func:`summary`). Rank 0 draws the last epoch's ranks as a stacked bar
    (``loop.artifacts['breakdown']``) with ``plot(ranks, path)`` if given. A collective:
    registered on every rank."""

    stage = MEASURE

    def __init__(self, plot: Any = None, tmpdir: str | None = None) -> None:
        self.plot = plot
        self.tmpdir = tmpdir
        self.window = Window()
        self.epoch: list[Sample] = []
        self.ranks: list[dict[str, float]] = []

    def before_train(self, loop: Any) -> None:
        loop.timed = True

    def after_step(self, loop: Any, out: Any) -> None:
        if out.sample is None:
            return
        self.window.add(out.sample)
        self.epoch.append(out.sample)
        beat = loop.trainer.heartbeat
        if beat is not None:
            beat.set_parts(self.window.record())

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        t = loop.trainer
        r = t.rank
        own = medians_ms(self.epoch or list(self.window.samples)) \
            if (self.epoch or self.window.samples) else None
        self.epoch = []
        keys = (*PARTS, "step")
        if own is not None:
            metrics.update({f"breakdown/rank{r}/{p}_ms": own[p] for p in keys})
        rows = t.collectives.each_rank([own[p] for p in keys] if own else [0.0] * len(keys))
        ranks = [dict(zip(keys, row)) for row in rows]
        if all(x["step"] > 0 for x in ranks):
            self.ranks = ranks
            metrics.update({f"breakdown/{n}": v for n, v in summary(ranks).items()})

    def after_train(self, loop: Any, error: BaseException | None) -> None:
        if loop.trainer.rank != 0 or not self.ranks or self.plot is None or self.tmpdir is None:
            return
        path = f"{self.tmpdir}/breakdown.png"
        self.plot(self.ranks, path)
        loop.artifacts["breakdown"] = path
