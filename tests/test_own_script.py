"""A user's own Gluon script (tests/own_loop.py) under ``python -m mxlarge.launcher``: what
mxlarge.Trainer gives it without the script knowing about ps-lite (fail-fast, heartbeats)."""
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import dmlc_processes

SCRIPT = str(Path(__file__).with_name("own_loop.py"))


class Run:
    """A finished launcher process: exit code, output lines with their arrival times."""

    def __init__(self, returncode, lines, ended):
        self.returncode = returncode
        self.lines = lines  # [(monotonic time, line)]
        self.ended = ended
        self.stdout = "\n".join(line for _, line in lines)

    def first(self, text):
        return next(t for t, line in self.lines if text in line)


def launcher(args, cwd, marker, timeout=180, during=None):
    """``python -m mxlarge.launcher ARGS`` with ``marker`` in every process's environment;
    ``during(line)`` sees each output line as it arrives."""
    env = {**os.environ, "MXLARGE_TEST_MARKER": marker}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if during is not None:
                during(line)
            assert time.monotonic() < deadline, "launcher did not finish in time"
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return Run(proc.returncode, lines, time.monotonic())


@pytest.mark.timeout(180)
def test_rank_1_raising_at_step_5_takes_the_job_down(tmp_path):
    marker = f"own-{uuid.uuid4().hex}"
    r = launcher(["-n", "2", "-s", "1", "--", sys.executable, SCRIPT, "--steps", "400",
                  "--raise-rank", "1", "--raise-step", "5"], tmp_path, marker)
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    assert out.count("Traceback (most recent call last)") == 1, out[-3000:]
    assert out.count("RuntimeError: own_loop raising at step 5") == 1, out[-3000:]
    assert "exited with status 1" in out
    assert "own_loop rank=0 done" not in out  # rank 0 did not run on by itself
    # without fail-fast the job never ends (ps-lite's exit barrier)
    assert r.ended - r.first("RuntimeError: own_loop raising") < 30
    assert dmlc_processes(marker) == []


@pytest.mark.timeout(180)
def test_own_script_finishing_normally_exits_0(tmp_path):
    """Fail-fast must not break normal completion: rank 0 still stops the servers."""
    marker = f"own-{uuid.uuid4().hex}"
    r = launcher(["-n", "2", "-s", "1", "--", sys.executable, SCRIPT, "--steps", "8"], tmp_path,
                 marker)
    out = r.stdout
    assert r.returncode == 0, out[-3000:]
    assert "own_loop rank=0 done" in out and "own_loop rank=1 done" in out
    assert "job finished" in out and "were stopped" not in out
    assert dmlc_processes(marker) == []
