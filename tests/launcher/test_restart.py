"""The restart policy and loop with scripted attempts (no processes; real restarted jobs are
tests/e2e/test_restart.py)."""
from mxlarge.launcher.local import Outcome
from mxlarge.launcher.restart import Failure, RestartPolicy, run_with_restarts


def test_policy_counts_restarts_and_spots_repeats():
    policy = RestartPolicy(2)
    crash = Failure("crashed", "server", -9, 40, "server 0 exited with signal 9 (SIGKILL)")
    stall = Failure("stalled", "worker", None, 90, "stalled: ...")
    assert policy.give_up(crash) is None and policy.restarts == 1
    assert policy.give_up(stall) is None and policy.restarts == 2
    assert policy.give_up(Failure("crashed", "worker", 1, 95, "x")) == "2 restart(s) used up"
    again = RestartPolicy(9)
    assert again.give_up(Failure("crashed", "worker", 1, None, "x")) is None
    assert again.give_up(Failure("crashed", "worker", 1, None, "x")) is None  # step unknown
    assert again.give_up(Failure("crashed", "worker", 1, 7, "x")) is None
    assert "twice" in again.give_up(Failure("crashed", "worker", 1, 7, "y"))
    assert again.restarts == 3



def _failed(step, status=1):
    return Outcome(status, "worker", 0, status, f"worker 0 exited with status {status}",
                   "crashed", step=step)


def test_attempts_run_until_success_or_the_policy_stops():
    lines, told = [], []
    outcomes = iter([_failed(3), _failed(5), Outcome(0, None, None, None, "done", None)])
    numbers = []

    def attempt(n):
        numbers.append(n)
        return next(outcomes)

    out = run_with_restarts(attempt, RestartPolicy(5), lines.append,
                            lambda f, r, why: told.append((f.step, r, why)))
    assert out.exit_code == 0 and numbers == [0, 1, 2]
    assert told == [(3, 1, None), (5, 2, None)]
    assert lines == ["restart 1/5 after: worker 0 exited with status 1 at step 3",
                     "restart 2/5 after: worker 0 exited with status 1 at step 5"]


def test_the_same_failure_twice_is_not_restarted_and_no_restarts_means_one_attempt():
    lines = []
    out = run_with_restarts(lambda n: _failed(7), RestartPolicy(5), lines.append)
    assert out.exit_code == 1 and len(lines) == 2
    assert lines[1].startswith("not restarting: the same failure at step 7 twice")
    calls = []
    out = run_with_restarts(lambda n: calls.append(n) or _failed(7), RestartPolicy(0),
                            lines.append)
    assert calls == [0] and len(lines) == 2  # no line, no callback


def test_an_interrupted_launcher_is_never_restarted():
    calls = []
    stopped = Outcome(130, None, None, None, "interrupted", None)
    out = run_with_restarts(lambda n: calls.append(n) or stopped, RestartPolicy(3), print)
    assert out is stopped and calls == [0]
