"""LineSink: which output failures are absorbed (the pumps must keep draining) and which are
bugs that must surface; how an exit status is named; how a process is named (real processes
are tests/e2e/test_launcher.py)."""
import io

import pytest

from mxlarge.launcher.child import LineSink, describe_status, process_label


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


@pytest.mark.parametrize("role,rank,launch,label", [
    ("worker", 1, 1, "worker 1"), ("worker", 1, 0, "worker 1 (launch 0)"),
    ("worker", None, 0, "worker (launch 0)"), ("server", 0, None, "server 0"),
    ("scheduler", None, None, "scheduler")])
def test_a_process_is_named_by_its_kvstore_rank_once_known(role, rank, launch, label):
    assert process_label(role, rank, launch) == label
