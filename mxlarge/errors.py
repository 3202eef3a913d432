"""The errors the CLI maps to exit codes, and the one "did you mean" helper (no MXNet here).

* :class:`InputError` (exit 2): the input cannot be used — a config key or value, a file, a
  command-line argument, a busy port, an unreachable tracking store. Nothing has been written.
* :class:`DivergenceError`, :class:`ReplicaMismatch` (exit 1): training started and failed.
* :class:`StopRequested` (exit 130): rank 0 stopped at the launcher's word (the user's Ctrl-C).
"""
from __future__ import annotations

import difflib
from collections.abc import Sequence


class InputError(ValueError):
    """Bad input: the CLI prints the message as one line and exits with status 2."""


class DivergenceError(RuntimeError):
    """The training loss or gradient norm became non-finite or exploded."""


class ReplicaMismatch(RuntimeError):
    """A rank's weights differ from rank 0's: the job cannot continue."""


def closest(word: str, choices: Sequence[str], n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The ``n`` choices closest to ``word`` (difflib's ratio >= ``cutoff``), best first."""
    return difflib.get_close_matches(str(word), list(choices), n=n, cutoff=cutoff)


class StopRequested(KeyboardInterrupt):
    """Raised on rank 0 as its next step begins, once the launcher asked the job to stop
    (the user's Ctrl-C, :func:`mxlarge.protocol.heartbeat.ask_stop`): the weights are those
    of the last whole step. A KeyboardInterrupt, so a script that saves on Ctrl-C saves
    here too; ``step`` is the step that did not begin."""

    def __init__(self, step: int) -> None:
        super().__init__(f"the launcher asked to stop before step {step}")
        self.step = step
