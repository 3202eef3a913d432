"""The one stall rule and the one supervision loop of every backend (fake children and a
fake clock: the claims are about the rules; real processes are tests/e2e/test_launcher.py
and tests/cluster)."""
import io
import signal
import threading
from collections import deque
from types import SimpleNamespace

import pytest

from mxlarge.launcher.child import POLL_INTERVAL
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.reports import WorkerReports
from mxlarge.launcher.supervisor import STOP_WAIT, Supervisor, supervise
from mxlarge.launcher.verdict import exit_outcome, stall_outcome
from mxlarge.launcher.watchdog import Watchdog
from mxlarge.protocol.heartbeat import FINISHED, STOP_FILE
from tests.launcher.test_watchdog import Clock, put


def _stalled_dog(directory):
    """A real watchdog (test clock) over real heartbeat files in which rank 1 (pid 101 on
    hostA) stopped at step 5 and rank 0 (pid 100) waits for it: a stall at step 5."""
    directory.mkdir(exist_ok=True)
    clock = Clock()
    dog = Watchdog(directory, 2, 10, lambda line: None, clock)
    put(directory, 0, 5, issued=6, here=1)
    put(directory, 1, 5, here=1)
    assert dog.check() is None
    for tick in range(2, 12):
        put(directory, 0, 5, issued=6, here=1, tick=tick)
        clock.t += 1.0
    return dog


def _child(pid, index, status=None, role="worker", rank=None):
    # what stall_outcome reads of a Child: no process is needed for the rule; ``rank``: the
    # kvstore rank its lines or heartbeat told (None: not known, or mpirun/srun for many)
    return SimpleNamespace(role=role, index=index, pid=pid, status=status, rank=rank,
                           find_rank=lambda: rank, tail=deque([f"line of {pid}"]))


def test_one_stall_rule_names_the_worker_behind_as_a_death_names_it(tmp_path):
    """Every backend: the stalled rank's role, kvstore rank, host and pid from its heartbeat,
    the job's step; the launch index and last lines of the child that carries it: a local
    worker or an ssh client (the one of its rank, launched 0th here), or a role's one mpirun
    or srun (no launch index, its lines)."""
    for children, launch, lines in (
            ([_child(100, 1, rank=0), _child(101, 0, rank=1), _child(7, 0, role="server")],
             0, ("line of 101",)),  # local: rank 1 was launched 0th
            ([_child(9001, 1, rank=0), _child(9002, 0, rank=1)], 0, ("line of 9002",)),  # ssh
            ([_child(9003, None), _child(9004, None, role="server")], None, ("line of 9003",))):
        out = stall_outcome(_stalled_dog(tmp_path / str(lines)), children)
        assert out is not None
        f = out.failure
        assert (out.exit_code, out.reason, f.role, f.launch_index, f.kvstore_rank, f.host,
                f.pid, out.step, f.output, f.status) == \
            (124, "stalled", "worker", launch, 1, "hostA", 101, 5, lines, None)
        assert set(f.tags()) == {"failed_role", "failed_kvstore_rank", "failed_host",
                                 "failed_pid"} | ({"failed_launch_index"} if launch is not None
                                                  else set())
        assert out.message.startswith("stalled: no worker advanced for 10 s")


def test_no_stall_verdict_once_a_worker_ended_or_without_a_watchdog(tmp_path):
    """Once a worker's process ended there is no stall verdict (its exit is the failure); no
    watchdog, no verdict."""
    ended = [_child(100, 0, rank=0), _child(101, 1, status=0, rank=1)]
    assert stall_outcome(_stalled_dog(tmp_path / "b"), ended) is None
    assert stall_outcome(None, ended[:1]) is None


def _finished_dog(directory, grace=5.0):
    """A real watchdog (test clock) over heartbeat files in which ranks 0 and 1 (pids 100 and
    101 on hostA) reported finished at step 5; it has seen them for ``grace`` s."""
    directory.mkdir(exist_ok=True)
    clock = Clock()
    dog = Watchdog(directory, 2, 10, lambda line: None, clock, exit_grace=grace)
    for rank in (0, 1):
        put(directory, rank, 5, here=5, phase=FINISHED)
    assert dog.check() is None
    clock.t += grace
    return dog


def test_a_worker_stuck_in_exit_after_the_job_finished_is_named_once_and_the_job_finished(
        tmp_path):
    """Every worker finished ``exit_grace`` s ago: the workers still running are named in one
    warning (rank, host, pid) and the job is finished (exit 0, no failure, no reason); not
    before the grace, not while one has not finished, nothing once every worker exited; a
    remote worker (no local child has its pid) is named, as the launcher cannot see it exit."""
    lines = []
    children = [_child(100, 0, status=0), _child(101, 1), _child(7, 0, role="server")]
    out = exit_outcome(_finished_dog(tmp_path / "a"), children, lines.append)
    assert out is not None
    assert (out.exit_code, out.reason, out.failure) == (0, None, None)
    assert out.message.startswith("job finished")
    assert lines == ["warning: worker rank 1 on hostA (pid 101) finished its work but did not "
                     "exit within 5 s of every worker finishing (stuck in MXNet's shutdown): "
                     "ended"]
    assert exit_outcome(_finished_dog(tmp_path / "b", grace=0.0), [], lines.append) is not None
    dog = _finished_dog(tmp_path / "c")
    dog.exit_grace = 6.0
    assert exit_outcome(dog, children, lines.append) is None  # within the grace
    done = [_child(100, 0, status=0), _child(101, 1, status=0)]
    assert exit_outcome(_finished_dog(tmp_path / "d"), done, lines.append) is None
    (tmp_path / "e").mkdir()
    dog = Watchdog(tmp_path / "e", 2, 10, lambda line: None, Clock(), exit_grace=0.0)
    put(tmp_path / "e", 0, 5, here=5, phase=FINISHED)
    put(tmp_path / "e", 1, 5, here=5)  # rank 1 has not finished
    assert dog.check() is None
    assert exit_outcome(dog, children, lines.append) is None
    assert exit_outcome(None, children, lines.append) is None
    remote = [_child(9001, 0), _child(9002, 1)]
    lines.clear()
    assert exit_outcome(_finished_dog(tmp_path / "f"), remote, lines.append) is not None
    assert "worker rank 0 on hostA (pid 100), worker rank 1 on hostA (pid 101) finished " \
        "their work" in lines[0]
    assert len(lines) == 1


def test_the_loop_ends_a_finished_job_stuck_in_exit_only_while_it_is_not_ending(tmp_path):
    """The exit rule comes after a stall and before the end: a job already ending is the end's
    business (``ended``), however long its workers took."""
    worker = _Kid("worker", 1, 101)
    log = []
    run = _Run({})
    out = supervise(_sup(worker), _backend(log), _finished_dog(tmp_path / "a"),
                    threading.Event(), [], clock=run.clock, sleep=run.sleep)
    assert (out.exit_code, out.reason, out.message[:12], log) == (0, None, "job finished", [])
    ending = _backend(log, ending=lambda: True, ended=lambda s: Outcome(0, "ended"))
    out = supervise(_sup(worker), ending, _finished_dog(tmp_path / "b"), threading.Event(), [],
                    clock=run.clock, sleep=run.sleep)
    assert out.message == "ended"


class _Kid:
    """A child as the Supervisor and the loop read it (no process: the claim is the loop's)."""

    def __init__(self, role, index, pid, label=None):
        self.role, self.index, self.pid, self.status = role, index, pid, None
        self.label = label or (role if index is None else f"{role} {index}")
        self.tail, self.rank = deque(), index

    def check(self):
        return self.status

    def find_rank(self):
        return self.rank


class _Run:
    """A fake clock whose sleep runs the scripted events: ``events[n]`` before poll n + 1."""

    def __init__(self, events):
        self.t, self.sleeps, self.events = 0.0, 0, events

    def clock(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds
        self.sleeps += 1
        self.events.get(self.sleeps, lambda: None)()


def _sup(*kids):
    sup = Supervisor(io.StringIO())
    sup.children = list(kids)
    return sup


class _Job:
    """A :class:`~mxlarge.launcher.supervisor.Supervised` that logs what the loop asked."""

    def __init__(self, log, ending, ended):
        self.log, self.ending, self.ended = log, ending, ended

    def explain(self, child):
        self.log.append(("explain", child.label))
        return Outcome(1, "explained", "crashed", failure=ProcessFailure(
            child.role, None, child.index, status=child.status))

    def terminated(self, sig):
        self.log.append(("terminated", sig))
        return Outcome(128 + sig, "terminated")


def _backend(log, ending=lambda: False, ended=lambda s: None):
    return _Job(log, ending, ended)


def test_the_loop_asks_signal_then_failure_then_stall_then_the_end(tmp_path):
    """All four at one poll: the signal wins; without it the first failed child; a stall only
    while no child failed; the end of the job only when nothing else applies."""
    server = _Kid("server", 0, 7)
    server.status = 1
    stop, log = threading.Event(), []
    stop.set()
    dog = _stalled_dog(tmp_path / "a")
    everything = _backend(log, ending=lambda: True, ended=lambda s: Outcome(0, "done"))
    run = _Run({})
    out = supervise(_sup(server), everything, dog, stop, [signal.SIGHUP], clock=run.clock,
                    sleep=run.sleep)
    assert (out.exit_code, log, run.sleeps) == (128 + signal.SIGHUP, [("terminated", 1)], 0)
    out = supervise(_sup(server), everything, dog, threading.Event(), [], clock=run.clock,
                    sleep=run.sleep)
    assert (out.message, log[-1]) == ("explained", ("explain", "server 0"))
    worker = _Kid("worker", 1, 101)  # the stalled rank's heartbeat pid
    out = supervise(_sup(worker, _Kid("server", 0, 7)), everything, dog, threading.Event(), [],
                    clock=run.clock, sleep=run.sleep)
    assert (out.reason, out.failure.kvstore_rank, out.failure.launch_index) == ("stalled", 1, 1)
    stop.set()
    log.clear()
    supervise(_sup(), _backend(log), None, stop, [], clock=run.clock, sleep=run.sleep)
    assert log == [("terminated", signal.SIGTERM)]  # set without a recorded signal


def test_the_first_child_seen_to_fail_is_explained_at_the_poll_after_its_exit():
    a, b = _Kid("worker", 0, 100), _Kid("worker", 1, 101)
    log = []

    def fail():
        b.status = -9
        a.status = 1  # both exited between two polls: the order of detection is the list's

    run = _Run({3: fail})
    out = supervise(_sup(a, b), _backend(log), None, threading.Event(), [], clock=run.clock,
                    sleep=run.sleep)
    assert (out.failure.launch_index, log, run.sleeps) == (0, [("explain", "worker 0")], 3)


def test_the_end_is_judged_on_the_seconds_since_the_job_began_ending():
    """``ended`` is asked at every poll once ``ending`` holds, with the seconds since the first
    poll it held at, until it answers."""
    worker = _Kid("worker", 0, 100)
    seen = []

    def ended(seconds):
        seen.append(seconds)
        return Outcome(0, "over") if seconds > 0.12 else None

    def done():
        worker.status = 0

    run = _Run({2: done})
    out = supervise(_sup(worker), _backend([], lambda: worker.status is not None, ended), None,
                    threading.Event(), [], clock=run.clock, sleep=run.sleep)
    assert out.message == "over"
    assert seen == pytest.approx([0.0, POLL_INTERVAL, 2 * POLL_INTERVAL, 3 * POLL_INTERVAL])
    assert run.sleeps == 2 + 3


def test_a_local_job_ends_when_every_process_did_or_names_what_overran():
    """run_local's end of job: success once all exited; a scheduler still waiting JOIN_GRACE
    after the workers means no worker joined (exit 1); servers that overrun the shutdown
    timeout are stopped, the job still succeeds."""
    from mxlarge.launcher.backends.local import JOIN_GRACE, LocalRun

    sched, server, worker = (_Kid("scheduler", None, 1), _Kid("server", 0, 2),
                             _Kid("worker", 0, 3))
    sup = _sup(sched, server, worker)
    ended = LocalRun(sup, None, shutdown_timeout=10.0).ended
    worker.status = 0
    assert ended(0.0) is None and ended(JOIN_GRACE) is None
    no_join = ended(JOIN_GRACE + 0.01)
    assert (no_join.exit_code, no_join.message.split(":")[0]) == \
        (1, "no worker joined the parameter server")
    sched.status = 0
    assert ended(JOIN_GRACE + 0.01) is None and ended(10.0) is None
    hung = ended(10.01)
    assert (hung.exit_code, hung.message) == \
        (0, "all workers exited 0; server 0 did not exit within 10 s and were stopped")
    server.status = 0
    assert ended(0.0).message == ("job finished: 1 worker(s), 1 server(s) and the scheduler "
                                  "exited 0")


def test_close_closes_the_lease_pipe_of_a_child_whose_guard_never_started():
    """An ssh child that fails before its guard starts gets no lease, so its stdin pipe is the
    supervisor's to close (else a ResourceWarning at some later garbage collection)."""
    sup = Supervisor(io.StringIO())
    child = sup.spawn("worker", 0, ["true"], lease=True)
    child.wait_exit()
    sup.close(grace=1.0)
    assert child.popen.stdin is not None and child.popen.stdin.closed


@pytest.mark.parametrize("case", ["exits", "again", "timeout", "sigterm", "finished"])
def test_ctrl_c_asks_rank_0_to_stop_and_waits_for_a_process_to_exit(tmp_path, case):
    """The user's first Ctrl-C while rank 0 trains writes the stop file and says so; the job is
    torn down once a process exited (rank 0, after it kept what it had), at a second signal,
    or after STOP_WAIT s. SIGTERM, or a rank 0 whose work is done, tears down at once."""
    put(tmp_path, 0, 5, phase=FINISHED if case == "finished" else "train")
    put(tmp_path, 1, 5)
    worker = _Kid("worker", 0, 100)
    received = [signal.SIGTERM if case == "sigterm" else signal.SIGINT]
    events = {"exits": {3: lambda: setattr(worker, "status", 130)},
              "again": {2: lambda: received.append(signal.SIGINT)}}.get(case, {})
    run, log, stop = _Run(events), [], threading.Event()
    stop.set()
    out_lines = io.StringIO()
    sup = Supervisor(out_lines)
    sup.children = [worker]
    reports = WorkerReports(tmp_path, None, lambda line: None, clock=run.clock)
    out = supervise(sup, _backend(log), None, stop, received, reports=reports, clock=run.clock,
                    sleep=run.sleep)
    asked = case not in ("sigterm", "finished")
    assert (log, (tmp_path / STOP_FILE).exists()) == ([("terminated", received[0])], asked)
    assert out.exit_code == 128 + received[0]
    assert ("Ctrl-C: rank 0 stops after its step" in out_lines.getvalue()) == asked
    expected = {"exits": 3, "again": 2, "timeout": int(STOP_WAIT / POLL_INTERVAL) + 1}
    assert run.sleeps == pytest.approx(expected.get(case, 0), abs=1)
