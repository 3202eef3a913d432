"""The launcher's one reader of what workers report beyond being alive.

While the job runs, :class:`WorkerReports` reads the step parts in the workers'
heartbeats (:attr:`~mxlarge.protocol.heartbeat.Record.parts`), names stragglers
(:mod:`mxlarge.launcher.straggler`) and keeps each rank's last parts: the breakdown of
the job however it ends, handed to ``drawn`` while it runs too (at most every
:data:`DRAW_EVERY` s); on the user's Ctrl-C it asks rank 0 to stop. When the job is
over, it merges the timeline files the workers left in the job's report directory
(:mod:`mxlarge.protocol.reports`, :mod:`mxlarge.timeline.trace`). It works beside the
stall watchdog, not inside it: the stall rule may be off (``--stall-timeout 0``) and
stragglers and timelines are still there.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.servers import Known, SlowServers
from mxlarge.launcher.straggler import Stragglers, uneven
from mxlarge.launcher.watchdog import READ_EVERY
from mxlarge.protocol.heartbeat import FINISHED, Record, ask_stop, read_all
from mxlarge.timeline import trace as timeline

#: Every rank's host and parts, by rank (:meth:`WorkerReports.breakdown`).
Ranks = tuple[tuple[str, dict[str, float]], ...]
#: What receives them while the job runs (:class:`WorkerReports`' ``drawn``).
Drawn = Callable[[Ranks], None]

#: Seconds at least between two calls of ``drawn`` while the job runs. A picture drawn and
#: logged takes ~0.2 s of the launcher's supervision loop (the workers' steps do not wait
#: for it): once a minute keeps that at 0.3% of the loop, and a minute is fresh enough for
#: medians over the last 20 sampled steps.
DRAW_EVERY = 60.0


class WorkerReports:
    """Reads the job's worker reports (module docstring).

    Args:
        heartbeats: the job's heartbeat directory.
        reports: the job's report directory.
        emit: receives the launcher's lines (stragglers, the timeline).
        servers: who each server is (kvstore rank -> host, pid), for the slow servers'
            lines (:mod:`mxlarge.launcher.servers`).
        clock: monotonic seconds (tests pass their own).
        drawn: receives every rank's parts (:meth:`breakdown`) while the job runs: as soon
            as every rank has parts, then at most every :data:`DRAW_EVERY` s when they
            changed (the launcher's picture:
            :meth:`~mxlarge.launcher.record.JobRecord.breakdown`); an error it raises is
            said once and the job goes on.
    """

    def __init__(self, heartbeats: str | Path | None, reports: str | Path | None,
                 emit: Callable[[str], None], servers: Known = dict,
                 clock: Callable[[], float] = time.monotonic,
                 drawn: Drawn | None = None) -> None:
        self.heartbeats = heartbeats
        self.reports = reports
        self.emit = emit
        self.clock = clock
        self.stragglers = Stragglers(emit, clock=clock)
        self.servers = SlowServers(emit, servers, clock=clock)
        self._read_at = -float("inf")
        self.last: dict[int, tuple[str, dict[str, float]]] = {}  # by rank: host, parts
        self.ranks: set[int] = set()  # every rank that reported
        self.drawn = drawn
        self._drawn: Ranks = ()  # what drawn last received, at _drawn_at
        self._drawn_at = -float("inf")
        self._draw_failed = False

    def poll(self) -> None:
        """At each poll of the supervision loop: the heartbeats read (at most every
        :data:`~mxlarge.launcher.watchdog.READ_EVERY` s, the watchdog's pace), judged
        for stragglers and their parts handed to ``drawn`` when due."""
        if self.heartbeats is None:
            return
        now = self.clock()
        if now - self._read_at < READ_EVERY:
            return
        self._read_at = now
        records = self._read()
        self.stragglers.see(records)
        self.servers.see(records, uneven(self.stragglers.state, self.stragglers.rules))
        self._draw(now)

    def _draw(self, now: float) -> None:
        """``drawn`` of every rank's parts once they are complete, then when they changed
        and :data:`DRAW_EVERY` s have passed since its last call."""
        if self.drawn is None or now - self._drawn_at < DRAW_EVERY:
            return
        ranks = self._complete()
        if not ranks or ranks == self._drawn:
            return
        self._drawn = ranks
        self._drawn_at = now
        try:
            self.drawn(ranks)
        except Exception as e:  # e.g. the MLflow store unreachable: not the job's end
            if not self._draw_failed:
                self.emit(f"breakdown picture not logged: {e}")
            self._draw_failed = True

    def _read(self) -> list[Record]:
        records = list(read_all(self.heartbeats).values()) if self.heartbeats else []
        for r in records:
            self.ranks.add(r.rank)
            if r.parts is not None:
                self.last[r.rank] = (r.host, r.parts)
        return records

    def ask_stop(self) -> bool:
        """Asks rank 0 to stop at its next step (:func:`~mxlarge.protocol.heartbeat.ask_stop`)
        if it reports training; whether it was asked."""
        if self.heartbeats is None:
            return False
        first = read_all(self.heartbeats).get(0)
        if first is None or first.phase == FINISHED:
            return False
        ask_stop(self.heartbeats)
        return True

    def breakdown(self) -> Ranks:
        """Every rank's host and last parts, by rank (one more read: the final records);
        empty unless every rank that reported, from 0 up, reported parts."""
        self._read()
        return self._complete()

    def _complete(self) -> Ranks:
        ranks = sorted(self.last)
        if ranks != list(range(len(ranks))) or self.ranks - set(ranks):
            return ()
        return tuple(self.last[r] for r in ranks)

    def timeline(self) -> dict[str, Any] | None:
        """The workers' timeline files merged, said in one line; None when they recorded
        none."""
        if self.reports is None:
            return None
        records = timeline.read(self.reports)
        if not records:
            return None
        trace = timeline.merge(records)
        self.emit(timeline.describe(trace))
        return trace

    def conclude(self, outcome: Outcome) -> Outcome:
        """``outcome`` with the job's straggler episodes (workers' and servers', by onset),
        its merged timeline and every rank's last breakdown."""
        slow = sorted((*self.stragglers.episodes, *self.servers.episodes), key=lambda e: e.step)
        return dataclasses.replace(outcome, stragglers=tuple(slow),
                                   timeline=self.timeline(), breakdown=self.breakdown())
