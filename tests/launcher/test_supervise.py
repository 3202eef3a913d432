"""LineSink: which output failures are absorbed (the pumps must keep draining) and which are
bugs that must surface; how an exit status is named; the one stall rule of every backend."""
import io
from collections import deque
from types import SimpleNamespace

import pytest

from mxlarge.launcher._supervise import LineSink, describe_status, stall_outcome
from mxlarge.launcher.watchdog import Watchdog
from tests.launcher.test_watchdog import Clock, put


class _Broken(io.StringIO):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.exc = exc

    def write(self, text: str) -> int:
        raise self.exc


def test_prefixed_lines():
    out = io.StringIO()
    LineSink(out).emit("worker 1", "hello")
    assert out.getvalue() == "[worker 1] hello\n"


@pytest.mark.parametrize("exc", [BrokenPipeError(32, "EPIPE"), OSError(28, "ENOSPC")])
def test_broken_output_drops_the_line(exc):
    LineSink(_Broken(exc)).emit("server 0", "x")


def test_closed_output_drops_the_line():
    out = io.StringIO()
    out.close()
    LineSink(out).emit("server 0", "x")  # ValueError: I/O operation on closed file


def test_other_errors_propagate():
    with pytest.raises(TypeError):
        LineSink(_Broken(TypeError("not a stream"))).emit("worker 0", "x")


@pytest.mark.parametrize("status,text", [(0, "status 0"), (3, "status 3"), (255, "status 255"),
                                         (-9, "signal 9 (SIGKILL)"), (-15, "signal 15 (SIGTERM)"),
                                         (-200, "signal 200 (unknown)")])
def test_describe_status_names_the_signal(status, text):
    assert describe_status(status) == text


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


def _child(pid, index, status=None, role="worker"):
    # what stall_outcome reads of a Child: no process is needed for the rule
    return SimpleNamespace(role=role, index=index, pid=pid, status=status,
                           tail=deque([f"line of {pid}"]))


def test_one_stall_rule_names_the_local_worker_behind(tmp_path):
    """A local job: the worker whose pid the stalled rank's heartbeat names, with its launch
    index, kvstore rank, host, the job's step and its last lines."""
    children = [_child(100, 0), _child(101, 1), _child(7, 0, role="server")]
    out = stall_outcome(_stalled_dog(tmp_path), children)
    assert out is not None
    assert (out.exit_code, out.reason, out.failed_role, out.failed_rank, out.failed_launch,
            out.failed_kvstore_rank, out.failed_host, out.step, out.failed_output) == \
        (124, "stalled", "worker", 1, 1, 1, "hostA", 5, ("line of 101",))
    assert out.message.startswith("stalled: no worker advanced for 10 s")


def test_one_stall_rule_for_remote_workers_and_ended_ones(tmp_path):
    """A cluster job's local children (ssh clients, mpirun, srun) carry no worker's pid: the
    stall names no process but keeps the step; once a worker's process ended there is no
    stall verdict (its exit is the failure); no watchdog, no verdict."""
    remote = [_child(9001, 0), _child(9002, 1)]
    out = stall_outcome(_stalled_dog(tmp_path / "a"), remote)
    assert out is not None
    assert (out.exit_code, out.reason, out.failed_role, out.failed_rank, out.step) == \
        (124, "stalled", None, None, 5)
    ended = [_child(100, 0), _child(101, 1, status=0)]
    assert stall_outcome(_stalled_dog(tmp_path / "b"), ended) is None
    assert stall_outcome(None, remote) is None
