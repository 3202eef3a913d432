"""Where a worker's step goes: waiting for data, forward+backward, waiting for the
exchange, the update (how to read it: docs/breakdown.md).

This module is the arithmetic: which steps are sampled (:func:`sampled`), a sampled
step's parts (:class:`Sample`), the recent ones' medians (:class:`RecentSamples`), the
comparison across ranks (:func:`summary`, :func:`describe`), and the loop's hook that
puts them in a run (:class:`BreakdownHook`). The steps are timed by a step observer,
:class:`mxlarge.observers.timer.StepTimer`, the same for the loop and a script's own
steps.
"""
from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from mxlarge.hooks import MEASURE, Hook

#: One step in EVERY is sampled (:func:`sampled`).
EVERY = 10
#: round(2³² / φ): frac((t − 1) / φ) is ((t − 1) · ALPHA mod 2³²) / 2³², in integers.
ALPHA = 2654435769
#: Sampled steps in the window (the heartbeat's medians, which the launcher's straggler
#: rule reads, and the run's at each epoch's end).
WINDOW = 20
#: The parts of a step, in the order a step runs them.
PARTS = ("data", "compute", "exchange", "update")
#: A host name travels between ranks as this many floats of 3 bytes (48 characters).
HOST_FLOATS = 16


def sampled(step: int) -> bool:
    """Whether step t = ``step`` is timed with engine syncs: frac((t − 1) / φ) < 1 /
    EVERY.

    A golden-ratio sequence: one step in EVERY, 5, 8 or 13 steps apart, step 1 (right
    after step 0's warm-up) the first, and at every position of an epoch alike: a rule
    on t mod EVERY would time the same position of every epoch whenever the epoch's
    steps share a factor with EVERY (the digits proxy's 5: always its first or second
    step, whose waits for data differ 8-fold). The same steps on every rank (the
    launcher compares ranks at one)."""
    return ((step - 1) * ALPHA) % 2 ** 32 < 2 ** 32 // EVERY


@dataclass(frozen=True)
class Sample:
    """One sampled step ``at``, seconds: ``step`` = data + compute + exchange + update;
    ``end`` the wall-clock time (``time.time()``) its exchange ended; ``micro`` each
    simulated worker's forward+backward in turn (together about ``compute``), empty
    without them; ``server`` the server whose sums were waited for first, -1 for none,
    and ``held`` the time from the exchange's start until they were all there (waited
    for first, no other server's sums hide them)."""

    at: int
    data: float
    compute: float
    exchange: float
    update: float
    end: float
    micro: tuple[float, ...] = ()
    server: int = -1
    held: float = 0.0

    @property
    def step(self) -> float:
        return self.data + self.compute + self.exchange + self.update


def medians_ms(samples: Sequence[Sample]) -> dict[str, float]:
    """Per part (and ``step``), the median over ``samples`` in ms, rounded to 0.1 ms;
    with simulated workers also ``micro``, the median over every micro-batch of every
    sample."""
    out = {p: round(1e3 * statistics.median(getattr(s, p) for s in samples), 1)
           for p in (*PARTS, "step")}
    micro = [m for s in samples for m in s.micro]
    if micro:
        out["micro"] = round(1e3 * statistics.median(micro), 1)
    return out


class RecentSamples:
    """The last :data:`WINDOW` samples; :meth:`record` is what the heartbeat carries
    (:attr:`mxlarge.protocol.heartbeat.Record.parts`)."""

    def __init__(self, size: int = WINDOW) -> None:
        self.samples: deque[Sample] = deque(maxlen=size)

    def add(self, s: Sample) -> None:
        self.samples.append(s)

    def record(self) -> dict[str, float]:
        """The medians of the parts and ``step`` (ms), ``n`` samples, the oldest one's step
        ``from``, the newest one's step ``at`` and exchange ``end``."""
        newest = self.samples[-1]
        medians = medians_ms(self.samples)
        return {**{p: medians[p] for p in (*PARTS, "step")}, "n": float(len(self.samples)),
                "from": float(self.samples[0].at), "at": float(newest.at),
                "end": round(newest.end, 4)}

    def servers(self, share: Sequence[float]) -> list[list[float]]:
        """Per server s (``share[s]``: its share of the pushed bytes): ``[h, share[s]]``, h
        the median ``held`` (ms) of the samples that waited for s first, -1 without one."""
        out = []
        for s, part in enumerate(share):
            held = [x.held for x in self.samples if x.server == s]
            out.append([round(1e3 * statistics.median(held), 1) if held else -1.0,
                        round(part, 4)])
        return out


def summary(ranks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Across ranks (``ranks[r]``: rank r's medians in ms, :func:`medians_ms`), with x_r
    rank r's exchange and w_r = step_r − x_r its own work in a step (the step's median
    less its wait for the exchange: a worker slowed now and then is slowed in whichever
    part runs, which no part's median shows, but its step does):

    * ``slowest_rank`` = argmax_r w_r; ``spread`` = max w ÷ min w;
    * ``wait_share`` = Σ x_r ÷ Σ step_r: the share of the ranks' steps spent waiting for the
      exchange;
    * ``wait_others_share`` = Σ (x_r − min x) ÷ Σ step_r: the part of it spent waiting for the
      other ranks (on dist_sync the rank that waits least waits only for the transfer and the
      servers; every other rank waits that much and for the slower ranks' pushes).
    """
    exchange = [r["exchange"] for r in ranks]
    work = [r["step"] - x for r, x in zip(ranks, exchange)]
    steps = sum(r["step"] for r in ranks)
    fastest = min(work)
    slowest = max(range(len(ranks)), key=work.__getitem__)
    return {"slowest_rank": float(slowest),
            "spread": work[slowest] / fastest if fastest > 0 else 1.0,
            "wait_share": sum(exchange) / steps if steps > 0 else 0.0,
            "wait_others_share": (sum(exchange) - len(ranks) * min(exchange)) / steps
            if steps > 0 else 0.0}


def describe(ranks: Sequence[Mapping[str, float]], hosts: Sequence[str]) -> str:
    """The run's ``breakdown`` tag: ``worker rank 1 on h2 is the slowest: 69.8 ms of its
    own work a step (its step 72.5 less 2.7 waiting for the exchange), 2.68x the fastest
    rank's; the ranks wait 33% of a step for the exchange (29% for each other)``
    (:func:`summary`)."""
    s = summary(ranks)
    r = int(s["slowest_rank"])
    step = ranks[r]["step"]
    exchange = ranks[r]["exchange"]
    return (f"worker rank {r} on {hosts[r]} is the slowest: {step - exchange:.1f} ms of its own "
            f"work a step (its step {step:.1f} less {exchange:.1f} waiting for the exchange), "
            f"{s['spread']:.2f}x the fastest rank's; the ranks wait "
            f"{100 * s['wait_share']:.0f}% of a step for the exchange "
            f"({100 * s['wait_others_share']:.0f}% for each other)")


def encode_host(name: str) -> list[float]:
    """``name`` as :data:`HOST_FLOATS` floats, each an integer < 2²⁴ holding 3 of its
    UTF-8 bytes (exact in float32, so an exact gather returns them unchanged); longer
    names are cut."""
    data = name.encode()[:3 * HOST_FLOATS].ljust(3 * HOST_FLOATS, b"\0")
    return [float(int.from_bytes(data[i:i + 3], "big")) for i in range(0, len(data), 3)]


def decode_host(floats: Iterable[float]) -> str:
    """The name :func:`encode_host` encoded."""
    data = b"".join(int(f).to_bytes(3, "big") for f in floats)
    return data.rstrip(b"\0").decode(errors="replace")


class Gather(Protocol):
    """What the hook gathers through (:class:`mxlarge.kvstore.collectives.Collectives`)."""

    def each_rank(self, values: Sequence[float]) -> list[list[float]]: ...


def gather_hosts(collectives: Gather, name: str) -> list[str]:
    """Every rank's host name, by rank (collective: :data:`HOST_FLOATS` / 8 exact gathers)."""
    mine = encode_host(name)
    rows = [collectives.each_rank(mine[i:i + 8]) for i in range(0, HOST_FLOATS, 8)]
    return [decode_host(x for part in rows for x in part[r]) for r in range(len(rows[0]))]


class BreakdownHook(Hook):
    """Puts the loop's sampled steps in the run. It collects ``StepOutput.sample`` (what the
    Trainer's :class:`~mxlarge.observers.timer.StepTimer` timed). At each epoch's end it puts
    this rank's window medians in the epoch's metrics (``breakdown/rank{r}/{part}_ms``) and,
    through the store's exact gather on every rank, the :func:`summary` across ranks
    (``breakdown/slowest_rank``, ``spread``, ``wait_share``, ``wait_others_share``). It tags the
    run through ``tag`` (rank 0's, if given) with :func:`describe`. A collective: registered
    on every rank.

    The picture of the ranks' parts, ``breakdown/ranks.png``, is the launcher's
    (:meth:`mxlarge.launcher.record.JobRecord.breakdown`, from the same medians in the
    heartbeats): it draws it while the job runs and however it ends, where a hook of a
    worker killed or interrupted draws nothing."""

    stage = MEASURE

    def __init__(self, host: str,
                 tag: Callable[[dict[str, str]], None] | None = None) -> None:
        self.host = host
        self.tag = tag
        self.window = RecentSamples()
        self.hosts: list[str] = []

    def after_step(self, loop: Any, out: Any) -> None:
        if out.sample is not None:
            self.window.add(out.sample)

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        t = loop.trainer
        if not self.hosts:
            self.hosts = gather_hosts(t.collectives, self.host)
        own = None
        if self.window.samples:
            own = medians_ms(self.window.samples)
            metrics.update({f"breakdown/rank{t.rank}/{p}_ms": v for p, v in own.items()})
        keys = (*PARTS, "step")
        if own is None:
            mine = [0.0] * len(keys)
        else:
            mine = [own[p] for p in keys]
        ranks = [dict(zip(keys, row)) for row in t.collectives.each_rank(mine)]
        if all(x["step"] > 0 for x in ranks):
            metrics.update({f"breakdown/{n}": v for n, v in summary(ranks).items()})
            if self.tag is not None:
                self.tag({"breakdown": describe(ranks, self.hosts)})
