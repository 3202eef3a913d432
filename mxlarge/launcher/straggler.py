"""Stragglers named: a worker whose part of the step stays slower than the other
workers', with what it costs them.

Every worker's heartbeat carries the medians (ms) of its recent sampled steps
(:attr:`~mxlarge.protocol.heartbeat.Record.parts`: ``data``, ``compute``, ``exchange``,
``update``, ``step``, ``n``), the oldest sampled step's number ``from``, and the newest
one's number ``at`` and the wall-clock time ``end`` its exchange ended. For rank r, a
part p of ``data``, ``compute``, ``update`` and m(x) the median of x over the other
ranks:

    ratio = r.p / m(p),   excess = r.p - m(p),   wait = max(0, m(exchange) - r.exchange) / m(step)

(on dist_sync the others wait at the exchange for r's push: ``wait`` is the share of
their step spent waiting beyond what r itself waits). The part ``link`` is r's lag: at
the newest step s every rank sampled,

    excess = lag = r.end(s) - m(end(s)),   ratio = 1 + lag / m(step),   wait = lag / m(step)

(the rank whose pulled sums arrive last starts its next step last, and the others wait
for its push that much; exchange durations are the same on every rank,
docs/design/watching.md).

Each heartbeat of r that has advanced is one :class:`Look`. r is slow in p when, over
its looks of the last :attr:`Rules.seconds` (at least :attr:`Rules.hold` of them), the
medians say it holds the others back: ratio >= :attr:`Rules.onset`, excess >=
:attr:`Rules.min_ms` and >= :attr:`Rules.min_share` of m(step), wait >=
:attr:`Rules.min_wait`. An episode (:class:`Episode`) begins, named for the first such
part in the order of :data:`SLOW_PARTS` (a busy host slows every part: it is named for
its forward+backward), with the medians that decided it (and, besides, the ratio over
the last quarter of that span: how slow it is now), from its onset (:func:`onset`). It
ends when one of the four medians falls below half its floor (the ratio: below
:attr:`Rules.recover`). Only windows of at least :attr:`Rules.samples`
sampled steps are judged, only while every worker trains. Why these rules, with the
noise they are set against: "Stragglers" in docs/design/watching.md.

:func:`judge` is the pure rule; :class:`Stragglers` is the supervision loop's keeper of
it.
"""
from __future__ import annotations

import dataclasses
import math
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


def floor(x: float, digits: int) -> str:
    """``x`` cut (not rounded) to ``digits`` decimals: a figure the rule judged at or
    above a floor never prints below it, nor one below it at it."""
    q = 10 ** digits
    return f"{math.floor(x * q + 1e-9) / q:.{digits}f}"


@dataclass(frozen=True)
class Episode:
    """One process slow in one part, from its onset (``step``, :func:`onset`) to the step
    the job had completed when it recovered (``ended``, None while it lasts).

    Attributes:
        rank, host, pid: the process (kvstore rank; ``pid`` None when not known).
        part: a key of :data:`SLOW_PARTS`, or ``server`` (:mod:`mxlarge.launcher.servers`).
        ratio, excess: its part ÷ and - the others' median (ms): the medians the rule
            judged.
        wait: the share of the other ranks' step they wait for it, as judged.
        now: the ratio over the last quarter of the span judged (how slow it is now).
        role: ``worker`` or ``server``.
        share: a server's share of the pushed bytes.
        alone: a server compared with its own start (the job's only server), not with
            other servers.
    """

    rank: int
    host: str
    pid: int | None
    part: str
    ratio: float
    excess: float
    wait: float
    step: int
    ended: int | None = None
    now: float | None = None
    role: str = "worker"
    share: float = 0.0
    alone: bool = False

    def line(self) -> str:
        """``straggler: worker rank 1 (pid 7) on h2 from step 180: forward+backward
        2.13× the median (now 2.40×); the other ranks wait 38% of each step for it`` (a
        link: ``its exchange ends 26 ms after the others' (a slow link)``; a server:
        ``its sums come 35 ms after the other servers' (1.84×); it holds 50% of the
        gradient bytes``)."""
        return (f"straggler: {self._who()} from step {self.step}: {self._what()}; "
                f"{self._others()} wait {floor(100 * self.wait, 0)}% of each step for it")

    def recovered_line(self) -> str:
        """``straggler recovered: worker rank 1 (pid 7) on h2: forward+backward back
        near the median at step 900 (slow from step 300)`` (a link: ``its exchange ends
        with the others' again``; a server: ``its sums come as fast as the other servers'
        again``)."""
        if self.part == "link":
            back = "its exchange ends with the others' again"
        elif self.part == "server":
            than = "at the start" if self.alone else "the other servers'"
            back = f"its sums come as fast as {than} again"
        else:
            back = f"{SLOW_PARTS.get(self.part)} back near the median"
        return (f"straggler recovered: {self._who()}: {back} at step {self.ended} (slow "
                f"from step {self.step})")

    def describe(self) -> str:
        """The run's ``straggler`` tag for it: who, what, how much, which steps."""
        until = "" if self.ended is None else f" to {self.ended}"
        pid = "" if self.pid is None else f" (pid {self.pid})"
        return (f"{self.role} rank {self.rank} on {self.host}{pid}: {self._what()}, "
                f"{self._others()} wait "
                f"{floor(100 * self.wait, 0)}% of each step, steps {self.step}{until}")

    def _who(self) -> str:
        pid = "" if self.pid is None else f" (pid {self.pid})"
        return f"{self.role} rank {self.rank}{pid} on {self.host}"

    def _others(self) -> str:
        return "the workers" if self.role == "server" else "the other ranks"

    def _what(self) -> str:
        now = "" if self.now is None else f" (now {floor(self.now, 2)}×)"
        if self.part == "link":
            return f"its exchange ends {self.excess:.0f} ms after the others' (a slow link)"
        if self.part == "server":
            than = "later than at the job's start" if self.alone else "after the other servers'"
            now = "" if self.now is None else f"; now {floor(self.now, 2)}×"
            return (f"its sums come {self.excess:.0f} ms {than} ({floor(self.ratio, 2)}×{now}); "
                    f"it holds {floor(100 * self.share, 0)}% of the gradient bytes")
        return f"{SLOW_PARTS[self.part]} {floor(self.ratio, 2)}× the median{now}"


@dataclass(frozen=True)
class Look:
    """One new window of one rank against the other ranks' (module docstring): at time
    ``t``, ``(ratio, excess, share, wait)`` of each part of :data:`SLOW_PARTS` it could
    be compared in (``share``: the excess ÷ the others' median step); ``mid``: the
    middle of the window, (its first + its newest sampled step) / 2."""

    t: float
    parts: Mapping[str, tuple[float, float, float, float]]
    mid: int = 0


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
    at = mine.get("at", 0)
    return Look(t, parts, int((mine.get("from", at) + at) // 2))


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


def slowest(looks: Sequence[Look], rules: Rules, parts: Iterable[str] = SLOW_PARTS
            ) -> tuple[str, float, float, float] | None:
    """The first of ``parts`` the medians of ``looks`` say is slow (module docstring)
    over at least :attr:`Rules.hold` looks, as ``(part, ratio, excess, wait)``; None
    when none is."""
    for part in parts:
        found = medians(looks, part)
        if found is None or sum(part in lk.parts for lk in looks) < rules.hold:
            continue
        ratio, excess, share, wait = found
        if ratio >= rules.onset and excess >= rules.min_ms and share >= rules.min_share \
                and wait >= rules.min_wait:
            return part, ratio, excess, wait
    return None


def onset(looks: Sequence[Look], part: str, rules: Rules) -> int:
    """Where ``part`` began to be slow: the middle of the window of the earliest of
    ``looks`` from which it stayed slow (every floor of the rule met there, its ratio at
    or above :attr:`Rules.recover` in every look after). At least half that window's
    samples were slow, and fewer in the look before: the slowdown began between the two
    windows' middles, at most one window before the step named."""
    seen = [lk for lk in looks if part in lk.parts]
    since = len(seen) - 1
    for i in range(len(seen) - 1, -1, -1):
        ratio, excess, share, wait = seen[i].parts[part]
        if ratio < rules.recover:
            break
        if ratio >= rules.onset and excess >= rules.min_ms and share >= rules.min_share \
                and wait >= rules.min_wait:
            since = i
    return seen[since].mid if seen else 0


def span(kept: Sequence[Look], now: float, rules: Rules) -> tuple[tuple[Look, ...], bool]:
    """The looks to keep of ``kept`` (those of the last :attr:`Rules.seconds` and the
    newest one before) and whether they are judged (at least :attr:`Rules.hold` of them,
    spanning the whole :attr:`Rules.seconds`)."""
    old = [i for i, lk in enumerate(kept) if lk.t < now - rules.seconds]
    looks = tuple(kept[old[-1]:] if old else kept)
    return looks, len(looks) >= rules.hold and looks[0].t <= now - rules.seconds


def begins(looks: Sequence[Look], now: float, rules: Rules, parts: Iterable[str] = SLOW_PARTS
           ) -> tuple[str, float, float, float, float, int] | None:
    """Whether an episode begins over ``looks``: the first of ``parts`` the rule found
    slow (:func:`slowest`), its ratio, excess and wait as judged, the ratio over the last
    quarter of the span (now) and the onset step (:func:`onset`); None when none is
    slow."""
    found = slowest(looks, rules, parts)
    if found is None:
        return None
    part, ratio, excess, wait = found
    recent = [lk for lk in looks if lk.t >= now - rules.seconds / 4]
    now_ratio = (medians(recent, part) or found[1:])[0]
    return part, ratio, excess, wait, now_ratio, onset(looks, part, rules)


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
        looks, judged = span((*history.get(rank, ()), now_look), now, rules)
        history[rank] = looks
        if not judged:
            continue  # not yet judged over the whole span
        if rank in episodes:
            if recovered(looks, episodes[rank].part, rules):
                changes.append(dataclasses.replace(episodes.pop(rank), ended=step))
        elif (found := begins(looks, now, rules)) is not None:
            part, ratio, excess, wait, now_ratio, first = found
            b = by_rank[rank]
            episodes[rank] = Episode(rank, b.host, b.pid, part, ratio, excess, wait, first,
                                     now=now_ratio)
            changes.append(episodes[rank])
    done = {**state.done, **{r: by_rank[r].done for r in windows}}
    return State(done, history, {**state.ends, **ends}, episodes), tuple(changes)


def uneven(state: State, rules: Rules = Rules()) -> bool:
    """Whether a worker is slow now: in an open episode, or its newest look has a part at
    or above the recovery ratio and the floors of ms and share. The workers then push at
    different times, and every worker waits longer for the sums of every server."""
    if state.open:
        return True
    return any(ratio >= rules.recover and excess >= rules.min_ms and share >= rules.min_share
               for looks in state.looks.values() if looks
               for ratio, excess, share, _ in looks[-1].parts.values())


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
        announce(changes, self._episodes, self.emit)


def announce(changes: Iterable[Episode], episodes: list[Episode],
             emit: Callable[[str], None]) -> None:
    """Each of ``changes`` said to ``emit`` and kept in ``episodes``: one that began
    appended, one that ended in place of its beginning (the same rank's last)."""
    for episode in changes:
        if episode.ended is None:
            episodes.append(episode)
            emit(episode.line())
        else:
            i = max(i for i, e in enumerate(episodes) if e.rank == episode.rank)
            episodes[i] = episode
            emit(episode.recovered_line())
