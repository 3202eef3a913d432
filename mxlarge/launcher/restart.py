"""Automatic restart of a whole job after a failure (``--max-restarts N``), as torchrun
does.

A failed attempt is followed by a fresh launch of every process; the job's own
checkpoints carry the state across. :class:`RestartPolicy` decides whether to restart
(at most ``N``; never twice for the same failure at the same step; never after an
interrupt or a success), :class:`Elastic` which world fits the hosts that answer
(``--elastic``), and :class:`RestartPlan` what each attempt runs. The rules and why:
docs/design/launcher.md ("Restarts"). Importing this module does not import MXNet.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mxlarge.launcher.outcome import Outcome
from mxlarge.plan import World, WorldError, elastic_world


@dataclass(frozen=True)
class Failure:
    """One failed attempt, as the policy sees it."""

    kind: str                 # "crashed" or "stalled"
    role: str | None
    status: int | None
    step: int | None          # None when no heartbeat told it
    message: str

    @classmethod
    def of(cls, outcome: Outcome) -> Failure:
        assert outcome.reason is not None
        failed = outcome.failure
        return cls(outcome.reason, failed.role if failed else None,
                   failed.status if failed else None, outcome.step, outcome.message)

    def same_as(self, other: Failure) -> bool:
        """The same way at the same step (a failure without a known step is never the same)."""
        return self.step is not None and (self.kind, self.role, self.status, self.step) == \
            (other.kind, other.role, other.status, other.step)


class RestartPolicy:
    """Decides after each failure whether to launch again.

    Args:
        max_restarts: N >= 0.
    """

    def __init__(self, max_restarts: int) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.max_restarts = max_restarts
        self.restarts = 0  # granted so far
        self.failures: list[Failure] = []

    def give_up(self, failure: Failure) -> str | None:
        """Records ``failure``; returns why the job must stop now, or ``None`` to restart."""
        earlier = next((f for f in self.failures if failure.same_as(f)), None)
        self.failures.append(failure)
        if earlier is not None:
            return (f"the same failure at step {failure.step} twice ({failure.kind}, "
                    f"{failure.role or 'no role'} status {failure.status}): a deterministic "
                    "bug, not a fault")
        if self.restarts >= self.max_restarts:
            return f"{self.max_restarts} restart(s) used up"
        self.restarts += 1
        return None


#: Which of a job's hosts answer: ``probe(hosts)`` → the live ones, in the given order.
Probe = Callable[[Sequence[str]], list[str]]


@dataclass
class Elastic:
    """The world of each attempt of an ``--elastic`` job (module docstring).

    Args:
        declared: the world the job was launched with (one worker per host of ``hosts``).
        hosts: the declared worker hosts, in launch order.
        probe: which of them answer.
        min_workers: the floor on worker processes.
        others: the job's other hosts (its servers'), probed with the workers' ones; only
            ``hosts`` count towards the workers of a world.
    """

    declared: World
    hosts: list[str]
    probe: Probe
    min_workers: int = 1
    others: list[str] = field(default_factory=list)
    world: World = field(init=False)   # the next attempt's
    live: list[str] = field(init=False)
    answering: set[str] = field(init=False)  # every host that answered the last probe

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.declared.processes:
            raise ValueError(f"--min-workers {self.min_workers}: expected 1 to "
                             f"{self.declared.processes} (the job's workers)")
        if len(self.hosts) != self.declared.processes:
            raise ValueError(f"{len(self.hosts)} host(s) for {self.declared.processes} workers")
        self.world = self.declared
        self.live = list(self.hosts)
        self.answering = set(self.hosts) | set(self.others)

    def replan(self) -> str | None:
        """Probes the hosts and sets :attr:`world`; returns why no world fits, else None."""
        self.answering = set(self.probe(list(dict.fromkeys([*self.hosts, *self.others]))))
        live = [h for h in self.hosts if h in self.answering]
        try:
            world = elastic_world(self.declared, len(live), self.min_workers)
        except WorldError as exc:
            return f"{exc} (lost: {', '.join(self.lost) or 'none'})"
        self.world = world
        self.live = live
        return None

    @property
    def lost(self) -> list[str]:
        """The job's hosts (workers' and others') that did not answer the last probe."""
        return [h for h in dict.fromkeys([*self.hosts, *self.others]) if h not in self.answering]


def run_with_restarts(attempt: Callable[[int], Outcome], policy: RestartPolicy,
                      emit: Callable[[str], None],
                      on_failure: Callable[[Failure, int, str | None], None] | None = None,
                      replan: Callable[[], str | None] | None = None) -> Outcome:
    """Runs ``attempt(0)``, then ``attempt(1)``, ... while failures are to be restarted.

    ``on_failure(failure, restarts, gave_up)`` is told of each failure, with the
    restarts granted so far and, when the policy stops, why. ``replan()`` runs before
    each granted restart (``--elastic``: :meth:`Elastic.replan`); a reason from it ends
    the job like the policy's, and the restart is not counted. Returns the last
    attempt's outcome. With ``max_restarts = 0`` this is ``attempt(0)`` and nothing more
    (no lines, no callback).
    """
    number = 0
    while True:
        outcome = attempt(number)
        if outcome.exit_code == 0 or outcome.reason is None or not policy.max_restarts:
            return outcome
        failure = Failure.of(outcome)
        why = policy.give_up(failure)
        if why is None and replan is not None:
            why = replan()
            if why is not None:
                policy.restarts -= 1  # granted by the policy, but no world to run it in
        if on_failure is not None:
            on_failure(failure, policy.restarts, why)
        if why is not None:
            emit(f"not restarting: {why}; last failure: {failure.message}")
            return outcome
        number += 1
        where = "" if failure.step is None else f" at step {failure.step}"
        emit(f"restart {policy.restarts}/{policy.max_restarts} after: {failure.message}{where}")



@dataclass(frozen=True)
class Attempt:
    """What one attempt of a job runs (:meth:`RestartPlan.attempt`).

    Attributes:
        number: 0 for the first, n for the n-th restart.
        world: its world (the declared one unless ``--elastic`` chose another).
        servers: its server processes.
        resume: the checkpoint it resumes from, if any.
        hostfile: the text of the hostfile it runs from, when the backend wrote one for the
            answering hosts (an elastic ssh job that lost hosts); ``None``: the job's own.
        new_world: the world differs from the previous attempt's (or it is an elastic job's
            first): the run records it.
        lost: the hosts that did not answer the last probe (elastic jobs).
    """

    number: int
    world: World
    servers: int
    resume: Path | None = None
    hostfile: str | None = None
    new_world: bool = False
    lost: tuple[str, ...] = ()


class RestartPlan:
    """The restart, elastic and resume choices of one job (module docstring).

    Args:
        policy: when to restart.
        declared: the job's world; ``servers`` its servers.
        elastic: the world keeper of an ``--elastic`` job.
        resume: the checkpoint the first attempt resumes from (``--resume``).
        latest: the newest checkpoint the job wrote so far (a restart resumes from it).
        servers_of: the servers of a world other than the declared one.
        hostfile_of: the hostfile text of an attempt (``elastic``, servers, workers) after the
            probe, or ``None`` for the job's own (the backend's
            :meth:`~mxlarge.launcher.backends.base.LaunchBackend.attempt_hostfile`).
    """

    def __init__(self, policy: RestartPolicy, declared: World, servers: int, *,
                 elastic: Elastic | None = None, resume: Path | None = None,
                 latest: Callable[[], Path | None] = lambda: None,
                 servers_of: Callable[[World], int] | None = None,
                 hostfile_of: Callable[[Elastic, int, int], str | None] | None = None) -> None:
        self.policy = policy
        self.declared = declared
        self.servers = servers
        self.elastic = elastic
        self.resume = resume
        self.latest = latest
        self.servers_of = servers_of or (lambda world: world.processes)
        self.hostfile_of = hostfile_of or (lambda elastic, servers, workers: None)
        self.worlds = [declared]  # each attempt's, after the declared one

    def attempt(self, number: int) -> Attempt:
        """What attempt ``number`` runs; call once per attempt, in order."""
        resume = self.resume if number == 0 else (self.latest() or self.resume)
        if self.elastic is None:
            return Attempt(number, self.declared, self.servers, resume)
        world = self.elastic.world
        new_world = number == 0 or world != self.worlds[-1]
        self.worlds.append(world)
        servers = self.servers if world == self.declared else self.servers_of(world)
        return Attempt(number, world, servers, resume,
                       self.hostfile_of(self.elastic, servers, world.processes), new_world,
                       tuple(self.elastic.lost))

    def run(self, attempt: Callable[[Attempt], Outcome], emit: Callable[[str], None],
            on_failure: Callable[[Failure, int, str | None], None] | None = None) -> Outcome:
        """:func:`run_with_restarts` of ``attempt`` over :meth:`attempt`'s choices (an
        elastic job probes its hosts before each granted restart)."""
        return run_with_restarts(lambda number: attempt(self.attempt(number)), self.policy,
                                 emit, on_failure,
                                 self.elastic.replan if self.elastic is not None else None)
