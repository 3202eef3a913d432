"""The heartbeat as a step observer: what the launcher's watchdog and straggler rule
read.

At each step's exchange the worker's record says the step is on its way; once the update
is done, a probe of its first weight (:func:`mxlarge.engine.probe`) goes to the
heartbeat's watcher thread, which counts the step complete when the engine reaches it.
The timing observer's medians (``step.parts``), when a step carries them, go into the
next record. When the launcher asks the job to stop, rank 0's next step raises
:class:`~mxlarge.errors.StopRequested` as it begins.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from mxlarge import engine
from mxlarge.errors import StopRequested
from mxlarge.observers import REPORT, Step, StepObserver
from mxlarge.protocol.heartbeat import HeartbeatWriter


class HeartbeatObserver(StepObserver):
    """Reports each step to ``writer``
    (:class:`~mxlarge.protocol.heartbeat.HeartbeatWriter`), and the worker's busy
    phases."""

    stage = REPORT

    def __init__(self, writer: HeartbeatWriter) -> None:
        self.writer = writer
        writer.on_stop = self._refuse_next_step

    def _refuse_next_step(self) -> None:
        # on the writer's thread; bound only now, so that no step pays for it before
        self.step_begun = self._refuse  # type: ignore[method-assign]  # shadows the method

    def _refuse(self, step: Step) -> None:
        """The step that begins after the launcher's stop: refused, once; the process then
        leaves without the exit barrier (the others wait for it in their next exchange)."""
        del self.step_begun
        self.writer.stopped = True
        raise StopRequested(step.t)

    def exchange_begun(self, step: Step, grads: Sequence[Any]) -> None:
        self.writer.issue(step.t)

    def update_done(self, step: Step, applied: bool, weights: Sequence[Any]) -> None:
        if step.parts is not None:
            self.writer.set_parts(step.parts, step.servers)
        if weights:
            self.writer.completes(step.t, engine.probe(weights[0]))

    @contextlib.contextmanager
    def busy(self, what: str) -> Iterator[None]:
        with self.writer.busy(what):
            yield
