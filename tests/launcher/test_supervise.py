"""LineSink: which output failures are absorbed (the pumps must keep draining) and which are
bugs that must surface; how an exit status is named."""
import io

import pytest

from mxlarge.launcher._supervise import LineSink, describe_status


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
