"""Stragglers named: a worker whose part of the step stays slower than the other workers', with
what it costs them.

Every worker's heartbeat carries the medians (ms) of its recent sampled steps
(:attr:`~mxlarge.protocol.heartbeat.Record.parts`: ``data``, ``compute``, ``exchange``,
``update``, ``step``, ``n``). For rank r, a part p of :data:`PARTS` and m(x) the median of x
over the other ranks:

    ratio = r.p / m(p),   excess = r.p - m(p),   wait = max(0, m(exchange) - r.exchange) / m(step)

(on dist_sync the others wait at the exchange for r's push: ``wait`` is the share of their step
spent waiting beyond what r itself waits). r is slow in p while ratio >= :attr:`Rules.onset`
and excess >= :attr:`Rules.min_ms`; an episode (:class:`Episode`) begins once r is slow in
:attr:`Rules.hold` consecutive new windows of its own, and ends once it has been out of the
band (ratio >= :attr:`Rules.recover` and excess >= min_ms / 2) as many. Only windows of at
least :attr:`Rules.samples` sampled steps are judged, only while every worker trains. Why
these rules: "Stragglers" in docs/design/launcher.md.

:func:`judge` is the pure rule; :class:`Stragglers` is the supervision loop's keeper of it.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

#: The parts of a step a straggler is named for, as the line names them.
PARTS = MappingProxyType({"compute": "forward+backward", "data": "waiting for data",
                          "update": "the update"})


class Beat(Protocol):
    """What the rule reads of a worker's heartbeat
    (a :class:`~mxlarge.protocol.heartbeat.Record`)."""

    rank: int
    host: str
    pid: int
    done: int
    phase: str
    tick: int
    parts: Mapping[str, float] | None


@dataclass(frozen=True)
class Rules:
    """When a worker is a straggler (module docstring).

    Attributes:
        onset: its part ÷ the others' median that makes it slow.
        recover: below this ratio (or half ``min_ms`` of excess) it is back.
        min_ms: the smallest excess over the others' median that counts, in ms.
        samples: sampled steps a window needs to be judged.
        hold: consecutive new windows that begin or end an episode.
    """

    onset: float = 1.2
    recover: float = 1.1
    min_ms: float = 2.0
    samples: int = 10
    hold: int = 3


@dataclass(frozen=True)
class Episode:
    """One worker slow in one part, from the step the job had completed when it was named
    (``step``) to the one it recovered at (``ended``, None while it lasts).

    Attributes:
        rank, host, pid: the worker (kvstore rank).
        part: a key of :data:`PARTS`.
        ratio: its part ÷ the other ranks' median, when named.
        wait: the share of the other ranks' step they wait for it, when named.
    """

    rank: int
    host: str
    pid: int
    part: str
    ratio: float
    wait: float
    step: int
    ended: int | None = None

    def line(self) -> str:
        """``straggler: worker rank 1 (pid 7) on h2: forward+backward 2.1× the median; the
        other ranks wait 38% of each step for it``."""
        return (f"straggler: {self._who()}: {PARTS[self.part]} {self.ratio:.1f}× the median; "
                f"the other ranks wait {100 * self.wait:.0f}% of each step for it")

    def recovered_line(self) -> str:
        """``straggler recovered: worker rank 1 (pid 7) on h2: forward+backward back near the
        median at step 900 (slow from step 300)``."""
        return (f"straggler recovered: {self._who()}: {PARTS[self.part]} back near the median "
                f"at step {self.ended} (slow from step {self.step})")

    def describe(self) -> str:
        """The run's ``straggler`` tag for it: who, what, how much, from which step."""
        until = "" if self.ended is None else f" to {self.ended}"
        return (f"worker rank {self.rank} on {self.host} (pid {self.pid}): {PARTS[self.part]} "
                f"{self.ratio:.2f}x the median, others wait {100 * self.wait:.0f}% of each step, "
                f"steps {self.step}{until}")

    def _who(self) -> str:
        return f"worker rank {self.rank} (pid {self.pid}) on {self.host}"


@dataclass(frozen=True)
class State:
    """What :func:`judge` remembers between calls: each rank's last judged window, its streak
    (the part it is slow in, or None for out of the band, and for how many windows), and its
    open episode."""

    windows: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    streaks: Mapping[int, tuple[str | None, int]] = field(default_factory=dict)
    open: Mapping[int, Episode] = field(default_factory=dict)


def slowest_part(mine: Mapping[str, float], others: Iterable[Mapping[str, float]],
                 rules: Rules) -> tuple[str, float, float] | None:
    """The part of :data:`PARTS` with the largest excess among those ``mine`` is slow in
    against the median of ``others`` (module docstring), as ``(part, ratio, wait)``; None when
    it is slow in none."""
    others = list(others)
    ref = {k: statistics.median(o[k] for o in others) for k in (*PARTS, "exchange", "step")}
    best = None
    for part in PARTS:
        excess = mine[part] - ref[part]
        if ref[part] > 0 and mine[part] >= rules.onset * ref[part] and excess >= rules.min_ms \
                and (best is None or excess > best[1]):
            best = (part, excess)
    if best is None:
        return None
    part = best[0]
    wait = max(0.0, ref["exchange"] - mine["exchange"]) / ref["step"] if ref["step"] > 0 else 0.0
    return part, mine[part] / ref[part], wait


def still_slow(part: str, mine: Mapping[str, float], others: Iterable[Mapping[str, float]],
               rules: Rules) -> bool:
    """Whether ``mine`` is still inside the band of an episode in ``part``: ratio >=
    :attr:`Rules.recover` and excess >= min_ms / 2 against the median of ``others``."""
    ref = statistics.median(o[part] for o in others)
    return mine[part] >= rules.recover * ref and mine[part] - ref >= rules.min_ms / 2


def judge(state: State, beats: Iterable[Beat], rules: Rules = Rules()
          ) -> tuple[State, tuple[Episode, ...]]:
    """One look at the workers' last heartbeats: the new state and the episodes that began
    (``ended`` None) or ended (``ended`` set) at it (module docstring)."""
    beats = list(beats)
    windows = {b.rank: b.parts for b in beats
               if b.parts is not None and b.parts.get("n", 0) >= rules.samples}
    if len(windows) < 2 or any(b.phase != "train" for b in beats):
        return state, ()
    step = min(b.done for b in beats)
    by_rank = {b.rank: b for b in beats}
    streaks, episodes, changes = dict(state.streaks), dict(state.open), []
    for rank, mine in windows.items():
        if state.windows.get(rank) == mine:
            continue  # no new window of its own: its streak stands
        others = [w for r, w in windows.items() if r != rank]
        was, count = streaks.get(rank, (None, 0))
        found = None
        if rank in episodes:
            slow = episodes[rank].part if still_slow(episodes[rank].part, mine, others, rules) \
                else None
        else:
            found = slowest_part(mine, others, rules)
            slow = found[0] if found is not None else None
        count = count + 1 if slow == was else 1
        streaks[rank] = (slow, count)
        if count < rules.hold:
            continue
        if found is not None:
            b = by_rank[rank]
            episodes[rank] = Episode(rank, b.host, b.pid, *found, step)
            changes.append(episodes[rank])
        elif rank in episodes and slow is None:
            changes.append(dataclasses.replace(episodes.pop(rank), ended=step))
    new = State({**state.windows, **windows}, streaks, episodes)
    return new, tuple(changes)


class Stragglers:
    """The supervision loop's keeper of :func:`judge`: :meth:`see` the workers' heartbeats at
    each poll; each episode's line goes to ``emit`` when it begins and when it ends; every
    episode of the job is in :attr:`episodes`, in the order they began."""

    def __init__(self, emit: Callable[[str], None], rules: Rules = Rules()) -> None:
        self.emit = emit
        self.rules = rules
        self.state = State()
        self._episodes: list[Episode] = []
        self._seen: dict[int, int] = {}  # rank -> the record's tick last judged

    @property
    def episodes(self) -> tuple[Episode, ...]:
        return tuple(self._episodes)

    def see(self, beats: Iterable[Beat]) -> None:
        """Judges ``beats`` when one of them is a record not judged before."""
        beats = list(beats)
        ticks = {b.rank: b.tick for b in beats}
        if ticks == self._seen:
            return
        self._seen = ticks
        self.state, changes = judge(self.state, beats, self.rules)
        for episode in changes:
            if episode.ended is None:
                self._episodes.append(episode)
                self.emit(episode.line())
            else:
                i = max(i for i, e in enumerate(self._episodes) if e.rank == episode.rank)
                self._episodes[i] = episode
                self.emit(episode.recovered_line())
