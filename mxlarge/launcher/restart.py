"""Automatic restart of a whole job after a failure (``--max-restarts N``), as torchrun does.

A failed attempt (a process crashed or was killed, or the stall watchdog stopped the job) is
followed by a fresh launch of every process; the job's own checkpoints carry the state across
(``mxlarge launch`` resumes from the newest checkpoint this job wrote, a user's script from
whatever its resume hook finds, see :mod:`mxlarge.resume`). The rules, in
:class:`RestartPolicy`:

* at most ``N`` restarts; then the job fails with the last reason;
* the same failure at the same step twice (same kind, role and status, same step per the
  heartbeats) is a deterministic bug, not a fault: no further restart, whatever ``N`` says;
* a launcher that was interrupted (Ctrl-C, SIGTERM) or a job that succeeded is never restarted.

Importing this module does not import MXNet.
"""
from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

from mxlarge.launcher.cluster import ClusterOutcome
from mxlarge.launcher.local import Outcome
from mxlarge.launcher.watchdog import STALL_EXIT


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
        return cls(outcome.reason, outcome.failed_role, outcome.failed_status, outcome.step,
                   outcome.message)

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


def run_with_restarts(attempt: Callable[[int], Outcome], policy: RestartPolicy,
                      emit: Callable[[str], None],
                      on_failure: Callable[[Failure, int, str | None], None] | None = None,
                      ) -> Outcome:
    """Runs ``attempt(0)``, then ``attempt(1)``, ... while failures are to be restarted.

    ``on_failure(failure, restarts, gave_up)`` is told of each failure, with the restarts
    granted so far and, when the policy stops, why. Returns the last attempt's outcome. With
    ``max_restarts = 0`` this is ``attempt(0)`` and nothing more (no lines, no callback).
    """
    number = 0
    while True:
        outcome = attempt(number)
        if outcome.exit_code == 0 or outcome.reason is None or not policy.max_restarts:
            return outcome
        failure = Failure.of(outcome)
        why = policy.give_up(failure)
        if on_failure is not None:
            on_failure(failure, policy.restarts, why)
        if why is not None:
            emit(f"not restarting: {why}; last failure: {failure.message}")
            return outcome
        number += 1
        where = "" if failure.step is None else f" at step {failure.step}"
        emit(f"restart {policy.restarts}/{policy.max_restarts} after: {failure.message}{where}")


def cluster_outcome(result: ClusterOutcome) -> Outcome:
    """An :class:`Outcome` for a cluster job (:func:`~mxlarge.launcher.cluster_run`'s result).

    A cluster job's failures carry no step, so they are never "the same" (the restart limit
    still applies). 128 + SIGINT/SIGTERM/SIGHUP, or the launcher itself failing first (e.g.
    ``scancel``), is taken as the launcher having been interrupted: not restarted.
    """
    code = result.exit_code
    interrupted = (code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP)
                   or result.failed_role == "launcher")
    reason = (None if code == 0 or interrupted else
              "stalled" if code == STALL_EXIT else "crashed")
    role = None if result.failed_role == "launcher" else result.failed_role
    # one number per process: the kvstore rank (None while not known), also as failed_rank
    rank = None if role is None else result.failed_rank
    return Outcome(code, role, rank, result.failed_status, result.message, reason,
                   failed_kvstore_rank=rank if role in ("server", "worker") else None,
                   failed_host=result.failed_host, failed_output=result.failed_output)
