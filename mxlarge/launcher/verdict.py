"""How the supervision loop judges a job from its workers' heartbeats and its children:
a stall (:func:`stall_outcome`), a finished job stuck in its exit
(:func:`exit_outcome`), and the evidence a failed outcome carries (:func:`evidence`);
the same rules for every backend."""
from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from mxlarge.launcher.outcome import LastBeat, Outcome, ProcessFailure, Tail
from mxlarge.launcher.watchdog import STALL_EXIT, Watchdog
from mxlarge.protocol.heartbeat import Record


class SupervisedChild(Protocol):
    """What a verdict reads of a supervised child
    (:class:`~mxlarge.launcher.child.Child`)."""

    # read-only here: a Child's tail is a deque, which a settable Sequence[str] would refuse
    @property
    def role(self) -> str: ...

    @property
    def index(self) -> int | None: ...

    @property
    def rank(self) -> int | None: ...

    @property
    def status(self) -> int | None: ...

    @property
    def tail(self) -> Sequence[str]: ...

    @property
    def pid(self) -> int: ...

    @property
    def label(self) -> str: ...

    def find_rank(self) -> int | None: ...


def stall_outcome(watchdog: Watchdog | None, children: Iterable[SupervisedChild]) -> Outcome | None:
    """The watchdog's verdict while training runs, for every backend.

    ``None`` while the job advances, with no watchdog, and once a worker (or its ssh,
    mpirun or srun) has ended: a worker that ended has ended, its exit is the failure to
    name. A stall names the first worker behind as a death names its process, on every
    backend: role, kvstore rank, host and pid from its heartbeat, its launch index and
    last lines from the child that carries it (a local worker or its ssh client: the one
    of its rank; mpirun, srun: the role's one child, without a launch index); with no
    worker behind, the stopped process its guard names, if any.
    """
    children = list(children)
    if watchdog is None or any(c.status is not None for c in children if c.role == "worker"):
        return None
    stall = watchdog.check()
    if stall is None:
        return None
    if not stall.behind and stall.stopped is not None:  # a stopped server (its guard said so)
        stopped = stall.stopped
        return Outcome(STALL_EXIT, stall.message, "stalled", stall.step, ProcessFailure(
            stopped.role, None, None, stopped.host, stopped.pid, -signal.SIGSTOP))
    if not stall.behind:
        return Outcome(STALL_EXIT, stall.message, "stalled", stall.step)
    record = watchdog.seen[stall.behind[0]].record
    workers = [c for c in children if c.role == "worker"]
    child = next((c for c in workers if c.find_rank() == record.rank),
                 workers[0] if len(workers) == 1 and workers[0].index is None else None)
    launch = child.index if child is not None else None
    return Outcome(STALL_EXIT, stall.message, "stalled", stall.step, ProcessFailure(
        "worker", record.rank, launch, record.host, record.pid, None, record.done,
        tuple(child.tail) if child is not None else ()))


def exit_outcome(watchdog: Watchdog | None, children: Iterable[SupervisedChild],
                 emit: Callable[[str], None]) -> Outcome | None:
    """A job whose work is done, with a worker stuck in its exit: finished, not stalled.

    Every worker reported finished (after the store's last barrier:
    :mod:`mxlarge.protocol.session`) :attr:`Watchdog.exit_grace` seconds ago or more,
    and a worker is still running: ``emit`` gets one warning line naming those still
    running (rank, host, pid; a worker on a remote host is named while the job has not
    ended, as the launcher cannot see its process exit) and the outcome is the job
    finished (exit 0); the caller's teardown ends what is left. ``None`` otherwise, and
    without a watchdog.
    """
    if watchdog is None:
        return None
    waited = watchdog.finished_for()
    if waited is None or waited < watchdog.exit_grace:
        return None
    running = {c.pid for c in children if c.role == "worker" and c.status is None}
    local = {c.pid for c in children if c.role == "worker"}
    records = sorted((s.record for s in watchdog.seen.values()), key=lambda r: r.rank)
    stuck: list[Record] = [r for r in records if r.pid in running or r.pid not in local]
    if not stuck:
        return None
    names = ", ".join(f"worker rank {r.rank} on {r.host} (pid {r.pid})" for r in stuck)
    whose = "its" if len(stuck) == 1 else "their"
    emit(f"warning: {names} finished {whose} work but did not exit within "
         f"{watchdog.exit_grace:g} s of every worker finishing (stuck in MXNet's shutdown): "
         "ended")
    return Outcome(0, f"job finished: every worker reported its work done; {len(stuck)} "
                      "worker(s) stuck in exit ended")


# Lines of every process in a failure's evidence (Outcome.tails); the failed one keeps
# TAIL_LINES in ProcessFailure.output.
EVIDENCE_LINES = 20


def evidence(outcome: Outcome, children: Iterable[SupervisedChild], watchdog: Watchdog | None
             ) -> Outcome:
    """A failed ``outcome`` (a crash or a stall) with what the launcher saw when it
    failed: every worker's last heartbeat (:class:`~mxlarge.launcher.outcome.LastBeat`)
    and every process's last :data:`EVIDENCE_LINES` lines
    (:class:`~mxlarge.launcher.outcome.Tail`), for the run's failure artifacts; any
    other outcome (a success, an interrupted launcher) is returned as it is."""
    if outcome.reason is None:
        return outcome
    beats: tuple[LastBeat, ...] = ()
    if watchdog is not None:
        watchdog.read(force=True)
        now = watchdog.clock()
        beats = tuple(LastBeat(r.rank, r.host, r.pid, r.done, r.phase, now - s.changed,
                           now - s.ticked)
                      for s in sorted(watchdog.seen.values(), key=lambda s: s.record.rank)
                      for r in (s.record,))
    children = list(children)
    for c in children:  # a process that printed nothing is named by its rank too
        c.find_rank()
    tails = tuple(Tail(c.label, c.status, tuple(c.tail)[-EVIDENCE_LINES:])
                  for c in children)
    return dataclasses.replace(outcome, beats=beats, tails=tails)
