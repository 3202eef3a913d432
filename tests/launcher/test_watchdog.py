"""The stall watchdog's rules on real heartbeat files, with a test clock (no processes; the
SIGSTOP of real workers is tests/e2e/test_watchdog.py)."""
import argparse

import pytest

from mxlarge.launcher import watchdog
from mxlarge.launcher.watchdog import Watchdog, stall_seconds
from mxlarge.protocol import heartbeat
from mxlarge.protocol.heartbeat import Record


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def put(directory, rank, done, issued=None, here=None, phase="train", tick=1, pid=None,
        host="hostA"):
    rec = Record(rank, host, pid or 100 + rank, done, done if issued is None else issued,
                 done if here is None else here, phase, tick)
    heartbeat.path_for(directory, rank).write_bytes(rec.encode())


def advance(clock, dog, seconds):
    clock.t += seconds
    return dog.check()


def test_not_armed_before_every_worker_completed_a_step(tmp_path):
    """The stall rule waits for every worker's first step: 90 s without progress at a 10 s
    timeout is no stall while rank 1's first step runs (the start limit is 100 s)."""
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 4, here=0)  # rank 1's first step (slow) is still running
    for _ in range(9):
        assert advance(clock, dog, 10) is None
    assert len(lines) == 1 and lines[0].startswith("warning: not every worker completed its "
                                                   "first step after 50 s")
    put(tmp_path, 1, 5, here=1)
    assert advance(clock, dog, 1) is None
    assert dog.armed


def test_a_start_that_never_completes_a_step_is_stopped_at_the_start_limit(tmp_path):
    """No hang before the first step: 10 x the timeout from the launch for every worker's first
    step, warned about at half; named: the rank past no step and the worker that never
    reported. Nothing reported at all (no mxlarge.Trainer): nothing judged."""
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path / "none", 3, 10, lines.append, clock)
    (tmp_path / "none").mkdir()
    for _ in range(30):
        assert advance(clock, dog, 10) is None
    assert lines == []

    dog = Watchdog(tmp_path, 3, 10, lines.append, clock)
    put(tmp_path, 0, 0, issued=0, here=0)  # rank 0 waits in its first push
    put(tmp_path, 1, 0, issued=-1, here=0, pid=4242)  # rank 1 never gets to its first step
    assert advance(clock, dog, 49) is None and lines == []
    assert advance(clock, dog, 1) is None and len(lines) == 1
    assert advance(clock, dog, 49) is None and len(lines) == 1
    stall = advance(clock, dog, 1)
    assert stall is not None and stall.behind == (0, 1)
    assert stall.message.startswith("stalled: not every worker completed its first step within "
                                    "100 s of the start (start limit 100 s = 10 x the stall "
                                    "timeout); behind: worker rank 0 on hostA (pid 100) has not "
                                    "completed a step; worker rank 1 on hostA (pid 4242)"), \
        stall.message
    assert stall.message.endswith("1 worker(s) never reported (imports, data loading or "
                                  "creating the store)")


def test_stall_names_the_frozen_rank_after_a_warning_at_half(tmp_path):
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock)
    put(tmp_path, 0, 5, issued=6, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 7):  # rank 0 waits in pull (its thread ticks), rank 1 is stopped
        put(tmp_path, 0, 5, issued=6, here=1, tick=tick)
        assert advance(clock, dog, 1.0) is None
    assert lines and "warning: no worker advanced for 5 s" in lines[0]
    assert "rank 1 at step 5 on hostA (pid 101)" in lines[0]
    for tick in range(7, 11):
        put(tmp_path, 0, 5, issued=6, here=1, tick=tick)
        assert advance(clock, dog, 1.0) is None
    stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == (1,) and stall.step == 5
    assert stall.message.startswith("stalled: no worker advanced for 10 s (stall timeout 10 s)")
    assert "rank 0" not in stall.message and len(lines) == 1


def test_lowest_issued_step_is_behind_when_all_tick(tmp_path):
    clock = Clock()
    dog = Watchdog(tmp_path, 3, 10, lambda line: None, clock)
    for r in range(3):
        put(tmp_path, r, 5, here=1)
    dog.check()
    for tick in range(2, 14):  # everyone alive; rank 2 has not pushed step 6
        for r in range(3):
            put(tmp_path, r, 5, issued=6 if r < 2 else 5, here=1, tick=tick)
        stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == (2,)
    for tick in range(14, 26):  # nobody behind: a server or the network
        for r in range(3):
            put(tmp_path, r, 5, issued=6, here=1, tick=tick)
        stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == ()
    assert "every worker waits at step 5: suspect a server" in stall.message


def test_busy_phase_gets_ten_timeouts(tmp_path):
    """A live busy worker (its heartbeat thread ticks): what the allowance is for."""
    clock = Clock()
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 93):  # 91 s busy: fine
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        assert advance(clock, dog, 1) is None
    for tick in range(93, 103):
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
    assert stall is not None and "busy: evaluating/checkpointing" in stall.message


def test_a_not_responding_worker_gets_no_busy_allowance(tmp_path):
    """Its last record says evaluating, but its heartbeat thread stopped: the plain timeout."""
    clock = Clock()
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    put(tmp_path, 1, 5, here=1, phase="evaluating/checkpointing", tick=2)
    for tick in range(2, 13):  # rank 0 alive and busy too; rank 1 never ticks again
        put(tmp_path, 0, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
    assert stall is not None and stall.behind == (1,), stall
    assert stall.message.startswith("stalled: no worker advanced for 10 s (stall timeout 10 s)")
    assert "worker rank 1 at step 5 on hostA (pid 101), not responding" in stall.message


def test_an_unreachable_host_is_named_and_ends_the_busy_allowance(tmp_path):
    """Every worker ticks and waits (the shared file system still carries a cut-off host's
    heartbeats): the probe names the host, in the warning at half and in the stall at the
    plain timeout although the workers say they are busy."""
    clock, lines, probes = Clock(), [], []

    def probe():
        probes.append(clock.t)
        return {"198.18.0.12": "no answer on port 22 within 2 s"}

    dog = Watchdog(tmp_path, 2, 10, lines.append, clock, probe=probe)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 13):  # the phase changed at 1001: nobody advanced since
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
        if tick < 12:
            assert stall is None
    assert probes and probes[0] == 1006.0  # first probe at half the timeout
    assert "every worker waits at step 5: host 198.18.0.12 unreachable (no answer on port 22 " \
        "within 2 s)" in lines[0], lines
    assert stall is not None and "(stall timeout 10 s)" in stall.message
    assert "host 198.18.0.12 unreachable" in stall.message
    assert "suspect a server" not in stall.message


def test_behind_a_cut_host_are_its_workers_never_a_healthy_one(tmp_path):
    """mpi after a cut: rank 1 on h1 issued the lowest step (it waits for a pull that h2's
    server cannot answer), rank 0 on h2, the host that does not answer, is the one behind; the
    probe's hosts are matched to the heartbeats' hostnames by address (localhost here)."""
    clock = Clock()
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock,
                   probe=lambda: {"127.0.0.1": "no answer on port 22 within 2 s"})
    put(tmp_path, 0, 200, here=1, host="localhost")
    put(tmp_path, 1, 200, here=1, host="h1.invalid")
    dog.check()
    for tick in range(2, 13):
        put(tmp_path, 0, 200, issued=201, here=1, tick=tick, host="localhost")
        put(tmp_path, 1, 200, here=1, tick=tick, host="h1.invalid")
        stall = advance(clock, dog, 1)
    assert stall is not None and stall.behind == (0,), stall
    assert "behind: worker rank 0 at step 200 on localhost (pid 100), on a host that does " \
        "not answer; host 127.0.0.1 unreachable" in stall.message, stall.message
    assert "h1.invalid" not in stall.message


def test_a_stopped_server_its_guard_reported_is_named_when_every_worker_waits(tmp_path):
    """mpi, Slurm: every worker ticks and waits at the same step; the guard of the server on
    h2 said it is stopped: the stall names it and its host, and its outcome blames it."""
    from mxlarge.launcher.guard import Stopped
    from mxlarge.launcher.verdict import stall_outcome

    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock,
                   stopped=lambda: [Stopped("server", 77, "h2")])
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 13):  # rank 1 waits in the pull of step 5, rank 0 pushed step 6
        for r in (0, 1):
            put(tmp_path, r, 5, issued=6 - r, here=1, tick=tick)
        clock.t += 1
        outcome = stall_outcome(dog, [])
    assert "every worker waits at step 5: server pid 77 on h2 stopped (SIGSTOP or a " \
        "debugger)" in lines[0], lines
    assert outcome is not None and "suspect a server" not in outcome.message, outcome
    assert outcome.message.endswith("every worker waits at step 5: server pid 77 on h2 stopped "
                                    "(SIGSTOP or a debugger)"), outcome.message
    assert outcome.failure is not None and outcome.failure.tags() == {
        "failed_role": "server", "failed_host": "h2", "failed_pid": "77",
        "failed_status": "-19"}, outcome.failure


def test_a_stopped_server_ends_the_busy_allowance(tmp_path):
    """The workers say they are evaluating (its metric crosses the store) when a guard says
    the server on h2 is stopped: the plain timeout, not ten of them, and the server named."""
    from mxlarge.launcher.guard import Stopped

    clock, stopped = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock, stopped=lambda: stopped)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 13):
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        assert advance(clock, dog, 1) is None  # busy, nothing stopped: ten timeouts
    stopped.append(Stopped("worker", 101, "hostA"))  # left to the frozen rule: its rank
    for r in (0, 1):
        put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=13)
    assert advance(clock, dog, 0) is None
    stopped[:] = [Stopped("server", 77, "h2")]
    stall = advance(clock, dog, 0)
    assert stall is not None and stall.message.startswith(
        "stalled: no worker advanced for 10 s (stall timeout 10 s); every worker waits at "
        "step 5: server pid 77 on h2 stopped (SIGSTOP or a debugger)"), stall.message


def test_default_timeout_is_20_median_steps_at_least_120_s(tmp_path):
    clock = Clock()
    dog = Watchdog(tmp_path, 1, None, lambda line: None, clock)
    put(tmp_path, 0, 0, here=0)
    dog.check()
    assert dog.timeout == watchdog.MIN_TIMEOUT
    for step in range(1, 6):  # 2 s per step
        put(tmp_path, 0, step, here=step, tick=step + 1)
        advance(clock, dog, 2.0)
    assert dog.timeout == 120.0
    for step in range(6, 20):  # 10 s per step: the median moves to 10 s
        put(tmp_path, 0, step, here=step, tick=step + 1)
        advance(clock, dog, 10.0)
    assert dog.timeout == 200.0


@pytest.mark.parametrize("text,seconds", [("0", 0.0), ("20", 20.0), ("0.5", 0.5)])
def test_stall_seconds_takes_seconds_and_zero(text, seconds):
    assert stall_seconds(text) == seconds


@pytest.mark.parametrize("text", ["-1", "soon", "nan", ""])
def test_stall_seconds_refuses_what_is_not_seconds(text):
    with pytest.raises(argparse.ArgumentTypeError,
                       match=f"expected seconds >= 0 \\(0 disables\\), got {text!r}"):
        stall_seconds(text)


def test_finished_workers_cannot_stall_and_say_since_when(tmp_path):
    """A finished worker (its exit, after the store's last barrier) is not busy; once every
    worker is finished the job cannot stall, whatever the time, and ``finished_for`` counts
    from the last one's report."""
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock)
    put(tmp_path, 0, 5, here=5)
    put(tmp_path, 1, 5, here=5)
    assert dog.check() is None and dog.finished_for() is None
    put(tmp_path, 0, 5, here=5, phase=heartbeat.FINISHED)
    assert advance(clock, dog, 1) is None and dog.finished_for() is None
    stall = advance(clock, dog, 10)  # rank 1 never finishes: the normal timeout, not 10 x
    assert stall is not None and "busy" not in stall.message
    put(tmp_path, 1, 5, here=5, phase=heartbeat.FINISHED)
    assert advance(clock, dog, 1) is None
    assert dog.finished_for() == 0.0
    assert advance(clock, dog, 1000) is None and dog.finished_for() == 1000.0
