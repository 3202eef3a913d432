"""Slow servers named: a server whose sums come later than the other servers', with what
it costs the workers.

On a parameter server every key a server holds waits for it: a busy server host slows
every worker at once, and no worker looks slower than another. So servers are compared
with servers. Each worker's heartbeat carries, per server s
(:attr:`~mxlarge.protocol.heartbeat.Record.servers`), h_s: the median time from the
exchange's start until the sums s holds alone were there, over the sampled steps that
waited for s first (:class:`~mxlarge.observers.timer.StepTimer`). With H_s the least h_s
over the workers (the worker that waits least waits only for the link and the servers,
not for other workers' pushes) and m the median step over the workers:

    R_s = S_s · median over k ≠ s of (H_k / S_k)   (S_s when no other server is timed)

    ratio = H_s / R_s,   excess = H_s - R_s,   wait = share = max(0, excess) / m

with S_s server s's H at its first look, at the job's start: each server against its own
start, scaled by how the other servers changed since. A server's H depends on where its
keys fall in the push order (the server of the last bucket pushed answers last: 2.3× the
other's H on the digits net, measured, with neither slow), so servers are not compared
with each other directly. With one server, or only one that holds gradients alone, R_s is
its start. Looks,
spans, onset and recovery are the workers' rule (:mod:`mxlarge.launcher.straggler`,
:class:`~mxlarge.launcher.straggler.Rules`), judged per server, only while every worker
trains.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from mxlarge.launcher.straggler import Episode, Look, Rules, announce, begins, recovered, span
from mxlarge.protocol.heartbeat import Record

#: Who each server is: kvstore rank -> (host, pid or None), as far as the launcher knows.
Known = Callable[[], Mapping[int, tuple[str, "int | None"]]]


@dataclass(frozen=True)
class ServerState:
    """What :func:`judge_servers` remembers: each server's looks of the span, its H at its
    first look (``start``), the open episodes and the newest sampled step judged."""

    looks: Mapping[int, tuple[Look, ...]] = field(default_factory=dict)
    start: Mapping[int, float] = field(default_factory=dict)
    open: Mapping[int, Episode] = field(default_factory=dict)
    at: int = -1


@dataclass(frozen=True)
class Held:
    """What the workers' records say of the servers: H per server (None for one that
    holds no gradient alone: never waited for first), each one's share of the pushed
    bytes, the median step m (ms), the newest sampled step of the windows and their
    middle (:class:`~mxlarge.launcher.straggler.Look`)."""

    h: tuple[float | None, ...]
    share: tuple[float, ...]
    step: float
    newest: int
    mid: int


def held(beats: Iterable[Record], samples: int) -> Held | None:
    """:class:`Held` from the workers' records with a window of at least ``samples``
    sampled steps and server figures; None without any."""
    windows = [b for b in beats if b.parts is not None and b.parts.get("n", 0) >= samples
               and b.servers]
    if not windows or len({len(b.servers or ()) for b in windows}) != 1:
        return None
    count = len(windows[0].servers or ())
    h = []
    for s in range(count):
        seen = [b.servers[s][0] for b in windows if b.servers and b.servers[s][0] >= 0]
        h.append(min(seen) if seen else None)
    parts = [b.parts for b in windows if b.parts]
    return Held(tuple(h), tuple((windows[0].servers or [])[s][1] for s in range(count)),
                statistics.median(p["step"] for p in parts), min(int(p["at"]) for p in parts),
                min(int((p.get("from", p["at"]) + p["at"]) // 2) for p in parts))


def look_at(h: float, reference: float, step: float, t: float, mid: int) -> Look:
    """A server's H against ``reference`` (module docstring)."""
    excess = h - reference
    wait = max(0.0, excess) / step if step > 0 else 0.0
    ratio = h / reference if reference > 0 else 1.0
    return Look(t, {"server": (ratio, excess, wait, wait)}, mid)


def judge_servers(state: ServerState, beats: Iterable[Record], now: float, known: Known,
                  rules: Rules = Rules(), uneven: bool = False
                  ) -> tuple[ServerState, tuple[Episode, ...]]:
    """One look at the workers' last heartbeats (module docstring): the new state and
    the server episodes that began or ended at it. While a worker is slow (``uneven``,
    :func:`~mxlarge.launcher.straggler.uneven`) a server compared with its own start is
    not judged: a late worker makes its sums come later too (the other servers' change
    scales that away for the rest)."""
    beats = list(beats)
    if not beats or any(b.phase != "train" for b in beats):
        return state, ()
    found = held(beats, rules.samples)
    if found is None or found.newest <= state.at:
        return state, ()  # no new sampled step since the last look
    timed = {s: h for s, h in enumerate(found.h) if h is not None}
    start = {**timed, **state.start}
    looks = dict(state.looks)
    episodes = dict(state.open)
    changes = []
    done = min(b.done for b in beats)
    for s, h in timed.items():
        others = [x / start[k] for k, x in timed.items() if k != s and start[k] > 0]
        if uneven and not others:
            continue
        reference = start[s] * (statistics.median(others) if others else 1.0)
        kept, judged = span((*looks.get(s, ()), look_at(h, reference, found.step, now,
                                                        found.mid)), now, rules)
        looks[s] = kept
        if not judged:
            continue
        if s in episodes:
            if recovered(kept, "server", rules):
                changes.append(dataclasses.replace(episodes.pop(s), ended=done))
        elif (slow := begins(kept, now, rules, ("server",))) is not None:
            _, ratio, excess, wait, now_ratio, first = slow
            host, pid = known().get(s, ("an unknown host", None))
            episodes[s] = Episode(s, host, pid, "server", ratio, excess, wait, first,
                                  now=now_ratio, role="server", share=found.share[s],
                                  alone=not others)
            changes.append(episodes[s])
    return ServerState(looks, start, episodes, found.newest), tuple(changes)


class SlowServers:
    """The supervision loop's keeper of :func:`judge_servers`: :meth:`see` the workers'
    heartbeats at each poll; each episode's line goes to ``emit`` when it begins and
    when it ends; ``known`` says who each server is."""

    def __init__(self, emit: Callable[[str], None], known: Known, rules: Rules = Rules(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.emit = emit
        self.known = known
        self.rules = rules
        self.clock = clock
        self.state = ServerState()
        self._episodes: list[Episode] = []

    @property
    def episodes(self) -> tuple[Episode, ...]:
        return tuple(self._episodes)

    def see(self, beats: Iterable[Record], uneven: bool = False) -> None:
        """Judges ``beats`` (:func:`judge_servers` skips records with no new sampled step;
        ``uneven``: a worker is slow now)."""
        self.state, changes = judge_servers(self.state, beats, self.clock(), self.known,
                                            self.rules, uneven)
        announce(changes, self._episodes, self.emit)
