"""The launcher's stall watchdog: "no worker advanced for T seconds" ends the job,
named.

It is also the launcher's reader of how far each worker got: the failure reports and the
exit rule ask it, whether or not the stall rule is on (``--stall-timeout 0`` turns off
the stall rule only).

ps-lite has no timeout on a silent peer: one stopped worker leaves every other process
waiting in push/pull forever. The supervision loop of every backend
(:func:`mxlarge.launcher.supervisor.supervise`) calls :meth:`Watchdog.check` on every
poll; it reads the workers' heartbeat files (:mod:`mxlarge.protocol.heartbeat`) at most
every :data:`READ_EVERY` seconds. The default timeout: max(:data:`MIN_TIMEOUT`,
:data:`STEP_FACTOR` × the median step time); busy phases get :data:`BUSY_FACTOR` × it,
the first step :data:`START_FACTOR` × it. The rules (arming, start, busy phases, probe,
finished, who is behind): "The stall watchdog's rules" in docs/design/watching.md.
"""
from __future__ import annotations

import argparse
import functools
import socket
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from mxlarge.launcher.guard import Stopped
from mxlarge.protocol.heartbeat import FINISHED, Record, read_all

MIN_TIMEOUT = 120.0
STEP_FACTOR = 20.0
BUSY_FACTOR = 10.0
START_FACTOR = 10.0
FROZEN_AFTER = 5.0
READ_EVERY = 0.5
PROBE_EVERY = 5.0
# Seconds a finished worker may take to exit: MXNet's shutdown took 0.9-2.2 s from the
# record to the exit (10 workers of tests/scripts/exit_script.py on loopback, 2 cores at
# a load of 6.5).
EXIT_GRACE = 10.0
# Exit code of a job the watchdog stopped (as coreutils' `timeout` does).
STALL_EXIT = 124


def stall_seconds(text: str) -> float:
    """``--stall-timeout``: seconds >= 0 (0 disables the watchdog)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected seconds >= 0 (0 disables), got {text!r}")
    return value


STALL_HELP = ("stop the job when no worker advanced for this many seconds (default: "
              "max(120, 20 x the median step time); 0 disables); see mxlarge/launcher/watchdog.py")


def same_host(a: str, b: str) -> bool:
    """Whether the names (or addresses) ``a`` and ``b`` are one host: equal, or
    resolving to the same address here (a heartbeat's hostname against a hostfile's
    address)."""
    return a == b or (_address(a) or a) == (_address(b) or b)


@functools.lru_cache(maxsize=256)
def _address(host: str) -> str | None:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


@dataclass(frozen=True)
class Stall:
    """A stalled job: ``message`` is the one line for the user, ``behind`` the ranks
    named, ``step`` the last step all workers had completed (the job's progress),
    ``stopped`` the stopped process named when no worker is behind."""

    message: str
    behind: tuple[int, ...]
    step: int
    stopped: Stopped | None = None  # named instead of a worker: a stopped server, scheduler


class _Seen:
    """What the watchdog knows of one rank: its record and when things last changed."""

    def __init__(self, record: Record, now: float) -> None:
        self.record = record
        self.changed = now   # steps or phase
        self.ticked = now    # any write at all
        self.finished = now if record.phase == FINISHED else None  # seen finished since

    def update(self, record: Record, now: float) -> tuple[int, float] | None:
        """Takes a new record; returns (steps done since, seconds) when ``done`` advanced."""
        old = self.record
        self.record = record
        if record.tick != old.tick:
            self.ticked = now
        if record.phase == FINISHED and self.finished is None:
            self.finished = now
        if (record.done, record.issued, record.phase) == (old.done, old.issued, old.phase):
            return None
        since = self.changed
        self.changed = now
        if record.done > old.done and record.phase == old.phase == "train":
            return record.done - old.done, now - since
        return None


class Watchdog:
    """Judges a job's progress from its heartbeat directory.

    Args:
        directory: the job's heartbeat directory (what :data:`heartbeat.ENV` points to).
        workers: how many workers the job has.
        timeout: seconds without progress that make a stall; ``None`` for the default rule
            (see the module docstring); 0 turns the stall rule off (the records are still
            read, for the failure reports and the exit rule).
        emit: receives the warning lines.
        clock: monotonic seconds (tests pass their own).
        probe: returns ``{host: why}`` of the job's hosts that do not answer (see the module
            docstring); ``None``: no hosts to probe (a local job).
        stopped: returns the job's processes their guards found stopped
            (:class:`~mxlarge.launcher.guard.Stopped`): named when every worker waits.
        exit_grace: seconds a finished worker may take to exit (module docstring).
    """

    def __init__(self, directory: str | Path, workers: int, timeout: float | None,
                 emit: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                 probe: Callable[[], Mapping[str, str]] | None = None,
                 exit_grace: float = EXIT_GRACE,
                 stopped: Callable[[], Sequence[Stopped]] | None = None):
        if timeout is not None and timeout < 0:
            raise ValueError(f"stall timeout must be >= 0 seconds (0: off), got {timeout}")
        self.directory = Path(directory)
        self.workers = workers
        self.fixed_timeout = timeout
        self.exit_grace = exit_grace
        self.emit = emit
        self.clock = clock
        self.seen: dict[int, _Seen] = {}
        self.step_times: deque[float] = deque(maxlen=200)
        self._read_at = -float("inf")
        self._warned_for: float | None = None
        self.started = clock()
        self.probe = probe
        self.stopped = stopped
        self._probed_at = -float("inf")
        self.unreachable: dict[str, str] = {}  # the last probe's answer

    # -- facts -------------------------------------------------------------------------
    @property
    def timeout(self) -> float:
        """The stall timeout in force now."""
        if self.fixed_timeout is not None:
            return self.fixed_timeout
        if not self.step_times:
            return MIN_TIMEOUT
        return max(MIN_TIMEOUT, STEP_FACTOR * statistics.median(self.step_times))

    @property
    def armed(self) -> bool:
        return len(self.seen) >= self.workers and all(s.record.here >= 1
                                                      for s in self.seen.values())

    def finished_for(self) -> float | None:
        """Seconds since every worker reported :data:`FINISHED` (``None`` while one has not)."""
        finished = [s.finished for s in self.seen.values() if s.finished is not None]
        if len(self.seen) < self.workers or len(finished) < len(self.seen):
            return None
        return self.clock() - max(finished)

    def progress(self) -> int | None:
        """Updates every worker has completed, ``None`` before any report."""
        if not self.seen:
            return None
        return min(s.record.done for s in self.seen.values())

    def step_of_pid(self, pid: int) -> int | None:
        """The completed steps reported by the worker with process id ``pid``, if any."""
        record = self.record_of_pid(pid)
        return record.done if record is not None else None

    def record_of_pid(self, pid: int) -> Record | None:
        """The last record of the worker with process id ``pid`` (its kvstore rank,
        host), if any."""
        return next((s.record for s in self.seen.values() if s.record.pid == pid), None)

    # -- judging -----------------------------------------------------------------------
    def read(self, force: bool = False) -> None:
        """Takes in the current records (unless ``force``, at most one scan per READ_EVERY)."""
        now = self.clock()
        if not force and now - self._read_at < READ_EVERY:
            return
        self._read_at = now
        for rank, record in read_all(self.directory).items():
            seen = self.seen.get(rank)
            if seen is None:
                self.seen[rank] = _Seen(record, now)
                continue
            advanced = seen.update(record, now)
            if advanced is not None:
                steps, seconds = advanced
                self.step_times.append(seconds / steps)

    def check(self) -> Stall | None:
        """Reads the records; returns a :class:`Stall` once the job is stalled, warns at half."""
        self.read()
        if self.finished_for() is not None:  # the exit's business now (module docstring)
            return None
        if self.fixed_timeout == 0:  # the stall rule is off
            return None
        if not self.armed:
            return self._check_start()
        now = self.clock()
        last = max(s.changed for s in self.seen.values())
        idle = now - last
        if idle >= self.timeout / 2:
            self._probe(now)
        frozen = any(now - s.ticked >= FROZEN_AFTER for s in self.seen.values())
        # a worker "busy" evaluating may wait in an exchange with a stopped server: the
        # allowance is for work, not for a server (or scheduler) a guard saw stopped. A
        # stopped worker is left to the frozen rule, which names it with its rank.
        gone = any(s.role != "worker" for s in self._stopped())
        busy = [] if frozen or self.unreachable or gone else sorted(
            {s.record.phase for s in self.seen.values()
             if s.record.phase not in ("train", FINISHED)})
        allowed = self.timeout * (BUSY_FACTOR if busy else 1.0)
        if idle >= allowed:
            behind, names = self._behind(now)
            stopped = None if behind else next(iter(self._stopped()), None)
            return Stall(f"stalled: no worker advanced for {idle:.0f} s (stall timeout "
                         f"{allowed:g} s{', busy: ' + ', '.join(busy) if busy else ''}); "
                         f"{names}", behind, self.progress() or 0, stopped)
        if idle >= allowed / 2 and self._warned_for != last:
            self._warned_for = last
            _, names = self._behind(now)
            self.emit(f"warning: no worker advanced for {idle:.0f} s (the job is stopped "
                      f"after {allowed:g} s); {names}")
        return None

    def _check_start(self) -> Stall | None:
        """The start rule (module docstring), before the job is armed."""
        if not self.seen:
            return None
        now = self.clock()
        busy = sorted({s.record.phase for s in self.seen.values()
                       if s.record.phase not in ("train", FINISHED)})
        allowed = self.timeout * START_FACTOR * (BUSY_FACTOR if busy else 1.0)
        waited = now - self.started
        if waited < allowed / 2:
            return None
        behind = tuple(sorted(r for r, s in self.seen.items() if s.record.here < 1))
        parts = [f"worker rank {r} on {self.seen[r].record.host} (pid {self.seen[r].record.pid}) "
                 "has not completed a step" for r in behind]
        missing = self.workers - len(self.seen)
        if missing:
            parts.append(f"{missing} worker(s) never reported (imports, data loading or "
                         "creating the store)")
        names = "behind: " + "; ".join(parts)
        if waited >= allowed:
            return Stall(f"stalled: not every worker completed its first step within "
                         f"{waited:.0f} s of the start (start limit {allowed:g} s = "
                         f"{START_FACTOR:g} x the stall timeout"
                         f"{', busy: ' + ', '.join(busy) if busy else ''}); {names}",
                         behind, self.progress() or 0)
        if self._warned_for != self.started:
            self._warned_for = self.started
            self.emit(f"warning: not every worker completed its first step after {waited:.0f} s "
                      f"(the job is stopped after {allowed:g} s); {names}")
        return None

    def _stopped(self) -> list[Stopped]:
        return list(self.stopped()) if self.stopped is not None else []

    def _probe(self, now: float) -> None:
        if self.probe is not None and now - self._probed_at >= PROBE_EVERY:
            self._probed_at = now
            self.unreachable = dict(self.probe())

    def _behind(self, now: float) -> tuple[tuple[int, ...], str]:
        frozen = [r for r, s in self.seen.items() if now - s.ticked >= FROZEN_AFTER]
        if frozen:
            behind = sorted(frozen)
            why = "not responding (stopped, frozen or its machine is gone)"
        elif self.unreachable:
            # the cut-off host's workers, never a healthy one: a worker that cannot
            # reach a server holds everyone back, whoever issued the lowest step
            behind = sorted(r for r, s in self.seen.items()
                            if any(same_host(s.record.host, h) for h in self.unreachable))
            why = "on a host that does not answer"
        elif self._stopped():
            # a stopped server holds every worker, in a pull or a push whichever step it
            # was
            behind = []
            why = ""
        else:
            low = min(s.record.issued for s in self.seen.values())
            high = max(s.record.issued for s in self.seen.values())
            behind = sorted(r for r, s in self.seen.items() if s.record.issued == low) \
                if low < high else []
            why = "has not pushed the step the others wait for"
        parts = [f"worker rank {r} at step {self.seen[r].record.done} on "
                 f"{self.seen[r].record.host} (pid {self.seen[r].record.pid}), {why}"
                 for r in behind]
        cut = "; ".join(f"host {h} unreachable ({why})" for h, why in
                        sorted(self.unreachable.items()))
        if not parts:
            step = self.progress()
            stopped = "; ".join(map(str, self._stopped()))
            return (), (f"every worker waits at step {step}: " + (
                "; ".join(w for w in (stopped, cut) if w) if stopped or cut
                else "suspect a server, the scheduler or the network"))
        return tuple(behind), "behind: " + "; ".join(parts) + (f"; {cut}" if cut else "")
