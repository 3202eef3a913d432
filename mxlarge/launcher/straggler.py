"""Stragglers named: a worker whose part of the step stays slower than the other
workers', with what it costs them.

Every worker's heartbeat carries the medians (ms) of its recent sampled steps
(:attr:`~mxlarge.protocol.heartbeat.Record.parts`: ``data``, ``compute``, ``exchange``,
``update``, ``step``, ``n``) and the newest sampled step's number ``at`` and the
wall-clock time ``end`` its exchange ended. For rank r, a part p of ``data``,
``compute``, ``update`` and m(x) the median of x over the other ranks:

    ratio = r.p / m(p),   excess = r.p - m(p),   wait = max(0, m(exchange) - r.exchange) / m(step)

(on dist_sync the others wait at the exchange for r's push: ``wait`` is the share of
their step spent waiting beyond what r itself waits). The part ``link`` is r's lag: at
the newest step s every rank sampled,

    excess = lag = r.end(s) - m(end(s)),   ratio = 1 + lag / m(step),   wait = lag / m(step)

(the rank whose pulled sums arrive last starts its next step last, and the others wait
for its push that much; exchange durations are the same on every rank,
docs/design/launcher.md).

Each heartbeat of r that has advanced is one :class:`Look`. r is slow in p when, over
its looks of the last :attr:`Rules.seconds` (at least :attr:`Rules.hold` of them), the
medians say it holds the others back: ratio >= :attr:`Rules.onset`, excess >=
:attr:`Rules.min_ms` and >= :attr:`Rules.min_share` of m(step), wait >=
:attr:`Rules.min_wait`. An episode (:class:`Episode`) begins, named for the first such
part in the order of :data:`SLOW_PARTS` (a busy host slows every part: it is named for
its forward+backward), with the medians of its looks of the last quarter of that span
(how slow it is now). It ends when one of the four medians falls below half its floor
(the ratio: below :attr:`Rules.recover`). Only windows of at least :attr:`Rules.samples`
sampled steps are judged, only while every worker trains. Why these rules, with the
noise they are set against: "Stragglers" in docs/design/launcher.md.

:func:`judge` is the pure rule; :class:`Stragglers` is the supervision loop's keeper of
it.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from mxlarge.protocol.heartbeat import Record

#: The parts of a step a straggler is named for, as the line names them.
SLOW_PARTS = MappingProxyType({"compute": "forward+backward", "data": "waiting for data",
                          "update": "the update", "link": "its exchange"})
#: Sampled steps' exchange ends kept per rank, to find steps every rank sampled.
ENDS_KEPT = 32


@dataclass(frozen=True)
class Rules:
    """When a worker is a straggler (module docstring).

    Attributes:
        onset: the median of its part ÷ the others' median that makes it slow.
        recover: below this median ratio it is back.
        min_ms: the smallest excess over the others' median that counts, in ms ...
        min_share: ... and as a share of the others' step.
        min_wait: the smallest share of their step the others must wait for it.
        samples: sampled steps a window needs to be judged.
        hold: the fewest looks (new windows) a rank is judged over ...
        seconds: ... spanning this many seconds.
    """

    onset: float = 1.2
    recover: float = 1.1
    min_ms: float = 2.0
    min_share: float = 0.1
    min_wait: float = 0.1
    samples: int = 10
    hold: int = 3
    seconds: float = 20.0


@dataclass(frozen=True)
class Episode:
    """One worker slow in one part, from the step the job had completed when it was
    named (``step``) to the one it recovered at (``ended``, None while it lasts).

    Attributes:
        rank, host, pid: the worker (kvstore rank).
        part: a key of :data:`SLOW_PARTS`.
        ratio, excess: its part ÷ and - the other ranks' median (ms), when named.
        wait: the share of the other ranks' step they wait for it, when named.
    """

    rank: int
    host: str
    pid: int
    part: str
    ratio: float
    excess: float
    wait: float
    step: int
    ended: int | None = None

    def line(self) -> str:
        """``straggler: worker rank 1 (pid 7) on h2: forward+backward 2.1× the median;
        the other ranks wait 38% of each step for it`` (a link: ``its exchange ends 26
        ms after the others' (a slow link)``)."""
        return (f"straggler: {self._who()}: {self._what()}; the other ranks wait "
                f"{100 * self.wait:.0f}% of each step for it")

    def recovered_line(self) -> str:
        """``straggler recovered: worker rank 1 (pid 7) on h2: forward+backward back
        near the median at step 900 (slow from step 300)`` (a link: ``its exchange ends
        with the others' again``)."""
        back = "ends with the others' again" if self.part == "link" else "back near the median"
        return (f"straggler recovered: {self._who()}: {SLOW_PARTS[self.part]} {back} at step "
                f"{self.ended} (slow from step {self.step})")

    def describe(self) -> str:
        """The run's ``straggler`` tag for it: who, what, how much, which steps."""
        until = "" if self.ended is None else f" to {self.ended}"
        return (f"worker rank {self.rank} on {self.host} (pid {self.pid}): {self._what()}, "
                f"others wait {100 * self.wait:.0f}% of each step, steps {self.step}{until}")

    def _who(self) -> str:
        return f"worker rank {self.rank} (pid {self.pid}) on {self.host}"

    def _what(self) -> str:
        if self.part == "link":
            return f"its exchange ends {self.excess:.0f} ms after the others' (a slow link)"
        return f"{SLOW_PARTS[self.part]} {self.ratio:.1f}× the median"


@dataclass(frozen=True)
class Look:
    """One new window of one rank against the other ranks' (module docstring): at time
    ``t``, ``(ratio, excess, share, wait)`` of each part of :data:`SLOW_PARTS` it could
    be compared in (``share``: the excess ÷ the others' median step)."""

    t: float
    parts: Mapping[str, tuple[float, float, float, float]]


def look(mine: Mapping[str, float], others: Sequence[Mapping[str, float]], t: float,
         lag: float | None = None) -> Look:
    """``mine`` against the median of ``others`` at time ``t``, with its ``lag`` (ms) if
    known (the module docstring's formulas; a part the others spend no time in has ratio
    1)."""
    ref = {k: statistics.median(o[k] for o in others)
           for k in ("data", "compute", "update", "exchange", "step")}
    step = ref["step"] if ref["step"] > 0 else float("inf")
    wait = max(0.0, ref["exchange"] - mine["exchange"]) / step
    parts = {p: (mine[p] / ref[p] if ref[p] > 0 else 1.0, mine[p] - ref[p],
                 (mine[p] - ref[p]) / step, wait) for p in ("data", "compute", "update")}
    if lag is not None:
        parts["link"] = (1 + lag / step, lag, lag / step, max(0.0, lag) / step)
    return Look(t, parts)


def lag(ends: Mapping[int, Mapping[int, float]], rank: int) -> float | None:
    """``rank``'s lag in ms at the newest step every rank in ``ends`` (rank -> sampled
    step -> wall-clock seconds its exchange ended) sampled; None without such a step."""
    common = set.intersection(*(set(e) for e in ends.values()))
    if not common:
        return None
    s = max(common)
    return 1000 * (ends[rank][s] - statistics.median(e[s] for r, e in ends.items() if r != rank))


def medians(looks: Sequence[Look], part: str) -> tuple[float, float, float, float] | None:
    """The medians of ``(ratio, excess, share, wait)`` in ``part`` over ``looks``; None
    when none of them has it."""
    seen = [lk.parts[part] for lk in looks if part in lk.parts]
    if not seen:
        return None
    ratio, excess, share, wait = (statistics.median(x[i] for x in seen) for i in range(4))
    return ratio, excess, share, wait


def slowest(looks: Sequence[Look], rules: Rules) -> tuple[str, float, float, float] | None:
    """The first part of :data:`SLOW_PARTS` the medians of ``looks`` say is slow (module
    docstring) over at least :attr:`Rules.hold` looks, as ``(part, ratio, excess,
    wait)``; None when none is."""
    for part in SLOW_PARTS:
        found = medians(looks, part)
        if found is None or sum(part in lk.parts for lk in looks) < rules.hold:
            continue
        ratio, excess, share, wait = found
        if ratio >= rules.onset and excess >= rules.min_ms and share >= rules.min_share \
                and wait >= rules.min_wait:
            return part, ratio, excess, wait
    return None


def recovered(looks: Sequence[Look], part: str, rules: Rules) -> bool:
    """Whether the medians of ``looks`` in ``part`` are back: ratio <
    :attr:`Rules.recover`, or the excess, its share or the wait below half its floor."""
    found = medians(looks, part)
    if found is None:
        return False
    ratio, excess, share, wait = found
    return ratio < rules.recover or excess < rules.min_ms / 2 or \
        share < rules.min_share / 2 or wait < rules.min_wait / 2


@dataclass(frozen=True)
class State:
    """What :func:`judge` remembers between calls: each rank's steps done at its last
    look, its looks of the last :attr:`Rules.seconds` (and the newest one before), its
    last :data:`ENDS_KEPT` sampled steps' exchange ends, and its open episode."""

    done: Mapping[int, int] = field(default_factory=dict)
    looks: Mapping[int, tuple[Look, ...]] = field(default_factory=dict)
    ends: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    open: Mapping[int, Episode] = field(default_factory=dict)


def judge(state: State, beats: Iterable[Record], now: float, rules: Rules = Rules()
          ) -> tuple[State, tuple[Episode, ...]]:
    """One look at the workers' last heartbeats at time ``now`` (seconds): the new state
    and the episodes that began (``ended`` None) or ended (``ended`` set) at it (module
    docstring)."""
    beats = list(beats)
    windows = {b.rank: b.parts for b in beats
               if b.parts is not None and b.parts.get("n", 0) >= rules.samples}
    if len(windows) < 2 or any(b.phase != "train" for b in beats):
        return state, ()
    step = min(b.done for b in beats)
    by_rank = {b.rank: b for b in beats}
    ends = {r: {**state.ends.get(r, {}), **({int(w["at"]): w["end"]} if "end" in w else {})}
            for r, w in windows.items()}
    ends = {r: dict(sorted(e.items())[-ENDS_KEPT:]) for r, e in ends.items()}
    history = dict(state.looks)
    episodes = dict(state.open)
    changes = []
    for rank, mine in windows.items():
        if state.done.get(rank, -1) >= by_rank[rank].done:
            continue  # it has not advanced: no new window of its own
        now_look = look(mine, [w for r, w in windows.items() if r != rank], now,
                        lag(ends, rank) if all(ends.values()) else None)
        kept = (*history.get(rank, ()), now_look)
        old = [i for i, lk in enumerate(kept) if lk.t < now - rules.seconds]
        looks = kept[old[-1]:] if old else kept
        history[rank] = looks
        if len(looks) < rules.hold or looks[0].t > now - rules.seconds:
            continue  # not yet judged over the whole span
        if rank in episodes:
            if recovered(looks, episodes[rank].part, rules):
                changes.append(dataclasses.replace(episodes.pop(rank), ended=step))
        elif (found := slowest(looks, rules)) is not None:
            # named with how slow it is now: the span's medians only just crossed the
            # floors
            recent = [lk for lk in looks if lk.t >= now - rules.seconds / 4]
            ratio, excess, _, wait = medians(recent, found[0]) or found
            b = by_rank[rank]
            episodes[rank] = Episode(rank, b.host, b.pid, found[0], ratio, excess, wait, step)
            changes.append(episodes[rank])
    done = {**state.done, **{r: by_rank[r].done for r in windows}}
    return State(done, history, {**state.ends, **ends}, episodes), tuple(changes)


class Stragglers:
    """The supervision loop's keeper of :func:`judge`: :meth:`see` the workers'
    heartbeats at each poll; each episode's line goes to ``emit`` when it begins and
    when it ends; every episode of the job is in :attr:`episodes`, in the order they
    began."""

    def __init__(self, emit: Callable[[str], None], rules: Rules = Rules(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.rules = rules
        self.clock = clock
        self.state = State()
        self._episodes: list[Episode] = []
        self._seen: dict[int, int] = {}  # rank -> the record's tick last judged

    @property
    def episodes(self) -> tuple[Episode, ...]:
        return tuple(self._episodes)

    def see(self, beats: Iterable[Record]) -> None:
        """Judges ``beats`` when one of them is a record not judged before."""
        beats = list(beats)
        ticks = {b.rank: b.tick for b in beats}
        if ticks == self._seen:
            return
        self._seen = ticks
        self.state, changes = judge(self.state, beats, self.clock(), self.rules)
        for episode in changes:
            if episode.ended is None:
                self._episodes.append(episode)
                self.emit(episode.line())
            else:
                i = max(i for i, e in enumerate(self._episodes) if e.rank == episode.rank)
                self._episodes[i] = episode
                self.emit(episode.recovered_line())
