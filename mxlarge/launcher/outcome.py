"""How a job ended (:class:`Outcome`), and the one record of the process it failed in
(:class:`ProcessFailure`), on every backend.

"rank" means the kvstore rank everywhere: in the launcher's lines (``worker rank 1 on
h2``), in the MLflow tags (``failed_kvstore_rank``) and in the watchdog's messages. A
process's number within its role as the launcher started it is its launch index
(``failed_launch_index``: a local job's ``worker 1``, an ssh job's ``launch 1``,
mpirun's and srun's task rank); the scheduler assigns kvstore ranks later, by host and
port, so the two differ. Runs recorded before this distinction carry ``failed_rank``,
which :func:`failure_tags` reads. Importing this module imports nothing else of mxlarge
but :mod:`mxlarge.launcher.straggler` (which imports none).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mxlarge.launcher.straggler import Episode


@dataclass(frozen=True)
class ProcessFailure:
    """The process a job failed in (or the launcher, when it was interrupted first).

    Attributes:
        role: ``"scheduler"``, ``"server"``, ``"worker"``; ``"launcher"`` when a cluster
            launcher itself got SIGINT/SIGTERM/SIGHUP first (``scancel`` of a batch job, a
            SIGTERM to ``salloc``).
        kvstore_rank: its kvstore rank (from the scheduler's assignments or the heartbeats);
            ``None`` for the scheduler and the launcher, or while not known.
        launch_index: its number within its role as started (local, ssh) or its task rank
            (mpirun, srun); ``None`` where no number applies.
        host: where it ran (for the launcher and the scheduler: the scheduler's address).
        pid: its process id on ``host`` as far as known (a local child's; a remote one's from
            its guard or its heartbeat).
        status: its Popen-style status as far as known: exit status, or ``-n`` for signal n
            (for a remote process what the guard, mpirun or srun reported).
        step: the last step it had completed, as far as its heartbeat tells (a worker).
        output: the last lines of output of the local process that carried it.
    """

    role: str
    kvstore_rank: int | None = None
    launch_index: int | None = None
    host: str | None = None
    pid: int | None = None
    status: int | None = None
    step: int | None = None
    output: tuple[str, ...] = ()

    @property
    def signal(self) -> int | None:
        """The signal that ended it, if one did."""
        return -self.status if self.status is not None and self.status < 0 else None

    @property
    def name(self) -> str:
        """``worker-1`` (its kvstore rank), ``worker-launch1`` (its launch index while
        the rank is not known), ``scheduler``: the name of its failure artifact."""
        if self.kvstore_rank is not None:
            return f"{self.role}-{self.kvstore_rank}"
        if self.launch_index is not None:
            return f"{self.role}-launch{self.launch_index}"
        return self.role

    def tags(self) -> dict[str, str]:
        """The MLflow tags of the failure: ``failed_role``, ``failed_kvstore_rank``,
        ``failed_launch_index``, ``failed_host``, ``failed_pid``, ``failed_status``
        (those known)."""
        out = {"failed_role": self.role}
        for key, value in (("failed_kvstore_rank", self.kvstore_rank),
                           ("failed_launch_index", self.launch_index),
                           ("failed_host", self.host), ("failed_pid", self.pid),
                           ("failed_status", self.status)):
            if value is not None:
                out[key] = str(value)
        return out


@dataclass(frozen=True)
class LastBeat:
    """The launcher's view of one worker's last heartbeat
    (:mod:`mxlarge.protocol.heartbeat`) when the job failed.

    Attributes:
        rank, host, pid: the worker's kvstore rank, host and process id.
        done: the updates it had completed; phase: ``train`` or what it was busy with.
        age: seconds since its steps or phase last changed, on the launcher's clock.
        silent: seconds since its heartbeat thread last wrote at all.
    """

    rank: int
    host: str
    pid: int
    done: int
    phase: str
    age: float
    silent: float

    def line(self) -> str:
        """``worker rank 1 on h (pid 7): step 44, phase train, changed 0.3 s ago, ...``."""
        return (f"worker rank {self.rank} on {self.host} (pid {self.pid}): step {self.done}, "
                f"phase {self.phase}, changed {self.age:.1f} s ago, last heartbeat "
                f"{self.silent:.1f} s ago")


@dataclass(frozen=True)
class Tail:
    """The last lines (stdout and stderr, one pipe) of one process the launcher started,
    when the job failed; ``status`` is its Popen-style status then (None: still
    running)."""

    label: str
    status: int | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class Outcome:
    """How a job ended, on any backend (local, ssh, mpi, slurm).

    Attributes:
        exit_code: 0 on success; the failed process's exit code; 128 + n for a signal n (also
            when the launcher itself was interrupted by signal n); 124 for a stall.
        message: one human-readable line, e.g. ``"worker 1 exited with signal 9 (SIGKILL)"``.
        reason: ``"crashed"`` (a process failed) or ``"stalled"`` (the stall watchdog stopped
            the job): what the restart policy restarts; ``None`` on success or when the
            launcher was interrupted (128 + SIGINT/SIGTERM/SIGHUP of a cluster process is taken
            as that too: Slurm cancelling the steps).
        step: on failure, the last step the failed worker (a crash), or every worker (a
            stall or a server crash), had completed, as far as the heartbeats tell.
        failure: the process it failed in; ``None`` on success, for a stall no worker process
            can be named for, and when a local launcher was interrupted.
        hosts: a cluster job's scheduler address, then the hosts the backend was given (ssh
            targets used, the mpi hostfile's hosts, the Slurm allocation's nodes), without
            repeats; empty for a local job.
        beats: on failure, the launcher's view of every worker's last heartbeat, by rank.
        tails: on failure, the last lines of every process the launcher started (for a
            cluster job: its ssh, mpirun or srun clients, which carry the remote output).
        stragglers: the workers named slow while it ran, in the order they were named
            (:mod:`mxlarge.launcher.straggler`).
        timeline: the workers' timeline merged into one Chrome trace
            (:mod:`mxlarge.timeline.trace`), when they recorded one.
        breakdown: every worker's last step breakdown, by rank: its host and the medians
            of its last sampled steps (:attr:`~mxlarge.protocol.heartbeat.Record.parts`);
            empty unless every rank reported one.
    """

    exit_code: int
    message: str
    reason: str | None = None
    step: int | None = None
    failure: ProcessFailure | None = None
    hosts: tuple[str, ...] = ()
    beats: tuple[LastBeat, ...] = ()
    tails: tuple[Tail, ...] = ()
    stragglers: tuple[Episode, ...] = ()
    timeline: dict[str, Any] | None = None
    breakdown: tuple[tuple[str, dict[str, float]], ...] = ()


def failure_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """The ``failed_*`` tags of a run, in today's names, from a run recorded now or
    before ``failed_rank`` was split: there it was a local job's launch index (tag
    ``launcher`` = ``local``) and a cluster job's kvstore rank."""
    out = {k: v for k, v in tags.items() if k.startswith("failed_") and k != "failed_rank"}
    old = tags.get("failed_rank")
    if old is None or old == "None":
        return out
    if tags.get("launcher", "local") == "local":
        out.setdefault("failed_launch_index", old)
    elif tags.get("failed_role") in ("server", "worker"):
        out.setdefault("failed_kvstore_rank", old)
    return out



def last_completed_step(outcome: Outcome) -> int | None:
    """The last step the job completed as the launcher knows it: the outcome's (the
    failed worker's heartbeat, or every worker's for a stall or a server crash), else
    the failed rank's last heartbeat, else the step every worker had completed; None
    without any."""
    if outcome.step is not None:
        return outcome.step
    rank = outcome.failure.kvstore_rank if outcome.failure is not None else None
    mine = [b.done for b in outcome.beats if b.rank == rank]
    if mine:
        return mine[0]
    return min((b.done for b in outcome.beats), default=None)


def _tail_head(tail: Tail) -> str:
    state = "still running" if tail.status is None else (
        f"exited with status {tail.status}" if tail.status >= 0 else
        f"killed by signal {-tail.status}")
    return f"## [{tail.label}] {state}; its last {len(tail.lines)} line(s) of output" + (
        ":" if tail.lines else ": none (it printed nothing)")


def failure_log(outcome: Outcome) -> str:
    """The failed process's evidence (the artifact ``failure/<name>.log``): the failure,
    the launcher's view of its last heartbeat and of the other ranks', then its last
    lines of output (stdout and stderr, one pipe)."""
    failed = outcome.failure
    assert failed is not None
    lines = [f"# {outcome.message}; its last {len(failed.output)} line(s) of output (stdout "
             "and stderr) follow the launcher's view"]
    own = [b for b in outcome.beats if b.pid == failed.pid or
           (failed.kvstore_rank is not None and b.rank == failed.kvstore_rank)]
    lines.append("# its last heartbeat: " + (own[0].line() if own else
                                             "none (it never reported to the launcher)"))
    lines += [f"# meanwhile {b.line()}" for b in outcome.beats if b not in own]
    if outcome.tails:
        lines.append("# every process's last lines: failure/job.log")
    lines += list(failed.output) or ["# (it printed nothing on stdout or stderr)"]
    return "\n".join(lines) + "\n"


def job_log(outcome: Outcome) -> str:
    """The job's evidence (the artifact ``failure/job.log``): the failure, every
    worker's last heartbeat as the launcher saw it, and the last lines of every process.
    """
    lines = [f"# {outcome.message}", "# the launcher's view of every worker's last heartbeat:"]
    lines += [f"#   {b.line()}" for b in outcome.beats] or ["#   none (no worker reported)"]
    for tail in outcome.tails:
        lines += ["", _tail_head(tail), *tail.lines]
    return "\n".join(lines) + "\n"
