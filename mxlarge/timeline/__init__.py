"""A timeline of chosen steps on every worker, merged by the launcher into one Chrome
trace (how to read one: docs/timeline.md).

:mod:`mxlarge.timeline.record`: a worker's recorder, a step observer (MXNet's side);
:mod:`mxlarge.timeline.trace`: the ranks' files merged into one trace (the launcher's
side, no MXNet).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

#: ``start:steps`` (e.g. ``5:3``): the steps a script of one's own records under the
#: launcher.
ENV = "MXLARGE_TIMELINE"
#: A rank's file in the job's report directory: ``timeline-worker-<rank>.json``.
PREFIX = "timeline-worker-"


@dataclass(frozen=True)
class TimelineWindow:
    """Steps ``start`` ≤ t < ``start + steps`` are recorded."""

    start: int
    steps: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.steps < 1:
            raise ValueError(f"timeline_start {self.start}, timeline_steps {self.steps}: "
                             "expected start >= 0 and steps >= 1")

    @property
    def last(self) -> int:
        return self.start + self.steps - 1

    def covers(self, step: int) -> bool:
        return self.start <= step <= self.last

    @classmethod
    def parse(cls, given: str) -> TimelineWindow:
        """The window of ``START:STEPS`` (:data:`ENV`'s form; ``START`` alone: one
        step).

        Raises:
            ValueError: not that form, or a start below 0 or no step.
        """
        head, _, tail = given.strip().partition(":")
        try:
            start = int(head)
            steps = int(tail or 1)
        except ValueError:
            raise ValueError(f"{ENV}={given!r}: expected START:STEPS, e.g. 5:3") from None
        return cls(start, steps)

    @classmethod
    def of(cls, start: int | None, steps: int | None) -> TimelineWindow | None:
        """The window of the keywords, else of :data:`ENV`, else None."""
        if start is None and steps is None:
            given = os.environ.get(ENV, "").strip()
            if not given:
                return None
            return cls.parse(given)
        if start is None:
            raise ValueError(f"timeline_steps {steps}: needs timeline_start (the first step "
                             "to record)")
        return cls(int(start), 3 if steps is None else int(steps))
