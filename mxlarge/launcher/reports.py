"""The launcher's one reader of what workers report beyond being alive.

While the job runs, :class:`WorkerReports` reads the step parts in the workers'
heartbeats (:attr:`~mxlarge.protocol.heartbeat.Record.parts`), names stragglers
(:mod:`mxlarge.launcher.straggler`) and keeps each rank's last parts: the breakdown of
the job however it ends; on the user's Ctrl-C it asks rank 0 to stop. When the job is
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


class WorkerReports:
    """Reads the job's worker reports (module docstring).

    Args:
        heartbeats: the job's heartbeat directory.
        reports: the job's report directory.
        emit: receives the launcher's lines (stragglers, the timeline).
        servers: who each server is (kvstore rank -> host, pid), for the slow servers'
            lines (:mod:`mxlarge.launcher.servers`).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, heartbeats: str | Path | None, reports: str | Path | None,
                 emit: Callable[[str], None], servers: Known = dict,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.heartbeats = heartbeats
        self.reports = reports
        self.emit = emit
        self.clock = clock
        self.stragglers = Stragglers(emit, clock=clock)
        self.servers = SlowServers(emit, servers, clock=clock)
        self._read_at = -float("inf")
        self.last: dict[int, tuple[str, dict[str, float]]] = {}  # by rank: host, parts
        self.ranks: set[int] = set()  # every rank that reported

    def poll(self) -> None:
        """At each poll of the supervision loop: the heartbeats read (at most every
        :data:`~mxlarge.launcher.watchdog.READ_EVERY` s, the watchdog's pace) and judged
        for stragglers."""
        if self.heartbeats is None:
            return
        now = self.clock()
        if now - self._read_at < READ_EVERY:
            return
        self._read_at = now
        records = self._read()
        self.stragglers.see(records)
        self.servers.see(records, uneven(self.stragglers.state, self.stragglers.rules))

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

    def breakdown(self) -> tuple[tuple[str, dict[str, float]], ...]:
        """Every rank's host and last parts, by rank (one more read: the final records);
        empty unless every rank that reported, from 0 up, reported parts."""
        self._read()
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
