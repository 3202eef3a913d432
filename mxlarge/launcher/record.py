"""What a launched job writes into its MLflow run, for ``mxlarge launch CONFIG`` and
``python -m mxlarge.launcher -- CMD`` alike: each elastic attempt's world, each restart, each
attempt's hosts, stragglers, timeline and breakdown picture, and the end: the tags and evidence
of a failure and the status the run ends with (:meth:`JobRecord.status`)."""
from __future__ import annotations

import json
import os
import signal
import tempfile
from typing import Any

from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.restart import Attempt, Failure
from mxlarge.launcher.straggler import Episode

#: The exit code of a launcher its user stopped with Ctrl-C: the run ends KILLED, MLflow's
#: status for a run its user stopped. SIGTERM is not taken as that: Slurm sends it for a
#: time limit or a preemption too, and such a run FAILED, with the reason in its tags.
STOPPED = 128 + signal.SIGINT


class JobRecord:
    """What a launch writes into its MLflow run (``run``: ``None`` without one): each elastic
    attempt's world, each restart, each attempt's stragglers, and the end tags of the
    outcome."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.end_tags: dict[str, str] = {}
        self.hosts: list[str] = []  # cluster jobs: where the last attempt ran
        self.episodes: tuple[Episode, ...] = ()  # every attempt's stragglers

    def world(self, attempt: Attempt, config: bool = True) -> None:
        """Tag ``world_<number>`` and metric ``world/workers`` at the attempt's first step.
        A command of the user's own (``config`` False) has only the tag, its world's shape:
        its batch and the step it resumes from (through :mod:`mxlarge.resume`) are its own
        affair."""
        if self.run is None:
            return
        world = attempt.world.describe() if config else attempt.world.shape()
        self.run.tag({f"world_{attempt.number}": world, "workers_lost": ",".join(attempt.lost)})
        if not config:
            return
        step = 0
        if attempt.resume is not None:
            from mxlarge import checkpoint
            step = int(checkpoint.read_meta(attempt.resume)["step"])
        self.run.log_metrics({"world/workers": attempt.world.processes}, step)

    def stragglers(self, episodes: tuple[Episode, ...]) -> None:
        """An attempt's straggler episodes (:mod:`mxlarge.launcher.straggler`): the tag
        ``straggler`` names every one of the job so far; the metrics ``straggler/ratio`` (its
        part ÷ the others' median) and ``straggler/wait`` (the share of the others' step they
        wait for it) at the step each was named, 1 and 0 at the step it recovered."""
        if self.run is None or not episodes:
            return
        self.episodes += episodes
        self.run.tag({"straggler": "; ".join(e.describe() for e in self.episodes)})
        for e in episodes:
            self.run.log_metrics({"straggler/ratio": e.ratio, "straggler/wait": e.wait}, e.step)
            if e.ended is not None:
                self.run.log_metrics({"straggler/ratio": 1.0, "straggler/wait": 0.0}, e.ended)

    def timeline(self, trace: dict[str, Any] | None) -> None:
        """The workers' merged timeline (:mod:`mxlarge.timeline`) as ``timeline/trace.json``
        and its picture ``timeline/trace.png``."""
        if self.run is None or trace is None:
            return
        from mxlarge.reporting.timeline_plot import plot_timeline

        self.run.log_text(json.dumps(trace), "timeline/trace.json")
        with tempfile.TemporaryDirectory(prefix="mxlarge-timeline-") as tmp:
            plot_timeline(trace, os.path.join(tmp, "trace.png"))
            self.run.log_artifacts([os.path.join(tmp, "trace.png")], under="timeline")

    def restart(self, failure: Failure, restarts: int, gave_up: str | None) -> None:
        """A failed attempt: the restarts so far and the reason, or why the job gave up."""
        if self.run is None:
            return
        tags: dict[str, object] = {"restarts": restarts}
        if gave_up is None:
            tags[f"restart_{restarts}_reason"] = failure.message
        else:
            tags["restart_gave_up"] = gave_up
        self.run.tag(tags)
        self.run.log_metrics({"restarts": restarts}, failure.step or 0)

    def attempt(self, outcome: Outcome) -> None:
        """An attempt's hosts, stragglers, timeline and breakdown picture."""
        self.hosts = list(outcome.hosts)
        self.stragglers(outcome.stragglers)
        self.timeline(outcome.timeline)
        self.breakdown(outcome.breakdown)

    def breakdown(self, ranks: tuple[tuple[str, dict[str, float]], ...]) -> None:
        """Every rank's last step breakdown as the picture ``breakdown/ranks.png``
        (:func:`~mxlarge.reporting.plots.plot_breakdown`): while the attempt runs (the
        ``drawn`` of its :class:`~mxlarge.launcher.reports.WorkerReports`, at most every
        :data:`~mxlarge.launcher.reports.DRAW_EVERY` s) and however it ended (finished,
        failed, stalled, stopped with Ctrl-C), each drawing replacing the last: its one
        owner, for a config's workers and a command of the user's own alike, since a worker
        killed or interrupted draws nothing."""
        if self.run is None or not ranks:
            return
        from mxlarge.reporting.plots import plot_breakdown

        with tempfile.TemporaryDirectory(prefix="mxlarge-breakdown-") as tmp:
            path = os.path.join(tmp, "ranks.png")
            plot_breakdown([parts for _, parts in ranks], [host for host, _ in ranks], path)
            self.run.log_artifacts([path], under="breakdown")

    @staticmethod
    def status(outcome: Outcome) -> str:
        """FINISHED, KILLED (the launcher stopped with Ctrl-C: :data:`STOPPED` with no
        failure of its own, ``reason`` None) or FAILED."""
        if outcome.exit_code == 0:
            return "FINISHED"
        if outcome.reason is None and outcome.exit_code == STOPPED:
            return "KILLED"
        return "FAILED"

    def outcome(self, outcome: Outcome) -> None:
        """The end tags: the hosts, and on failure the message, the failed process's tags
        (:meth:`~mxlarge.launcher.outcome.ProcessFailure.tags`), ``failed_step`` (the last
        completed step, :func:`~mxlarge.launcher.outcome.last_completed_step`, or the run's
        last logged step if later, so that no metric lies beyond it), its evidence as the
        artifact ``failure/<name>.log`` and every process's as ``failure/job.log``
        (:func:`~mxlarge.launcher.outcome.failure_log`,
        :func:`~mxlarge.launcher.outcome.job_log`)."""
        from mxlarge.launcher.outcome import failure_log, job_log, last_completed_step

        if self.hosts:
            self.end_tags["hosts"] = ",".join(self.hosts)
        if outcome.exit_code == 0:
            return
        self.end_tags["failure"] = outcome.message
        failed = outcome.failure
        if failed is not None:  # incl. the "launcher": e.g. scancel's SIGTERM
            self.end_tags.update(failed.tags())
        steps = [s for s in (last_completed_step(outcome),
                             self.run.last_step() if self.run is not None else None)
                 if s is not None]
        if steps:
            self.end_tags["failed_step"] = str(max(steps))
        if self.run is not None and outcome.reason is not None and failed is not None:
            self.run.log_text(failure_log(outcome), f"failure/{failed.name}.log")
        if self.run is not None and outcome.tails:
            self.run.log_text(job_log(outcome), "failure/job.log")
        if outcome.reason == "stalled":
            self.end_tags.update(failure="stalled", failure_detail=outcome.message)
