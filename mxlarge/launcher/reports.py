"""The launcher's one reader of what workers report beyond being alive.

While the job runs, :class:`WorkerReports` reads the step parts in the workers'
heartbeats (:attr:`~mxlarge.protocol.heartbeat.Record.parts`) and names stragglers
(:mod:`mxlarge.launcher.straggler`). When the job is over, it merges the timeline files
the workers left in the job's report directory (:mod:`mxlarge.protocol.reports`,
:mod:`mxlarge.timeline.trace`). It works beside the stall watchdog, not inside it: the
stall rule may be off (``--stall-timeout 0``) and stragglers and timelines are still
there.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.straggler import Stragglers
from mxlarge.launcher.watchdog import READ_EVERY
from mxlarge.protocol.heartbeat import read_all
from mxlarge.timeline import trace as timeline


class WorkerReports:
    """Reads the job's worker reports (module docstring).

    Args:
        heartbeats: the job's heartbeat directory.
        reports: the job's report directory.
        emit: receives the launcher's lines (stragglers, the timeline).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, heartbeats: str | Path | None, reports: str | Path | None,
                 emit: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.heartbeats = heartbeats
        self.reports = reports
        self.emit = emit
        self.clock = clock
        self.stragglers = Stragglers(emit, clock=clock)
        self._read_at = -float("inf")

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
        self.stragglers.see(read_all(self.heartbeats).values())

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
        """``outcome`` with the job's straggler episodes and its merged timeline."""
        return dataclasses.replace(outcome, stragglers=self.stragglers.episodes,
                                   timeline=self.timeline())
