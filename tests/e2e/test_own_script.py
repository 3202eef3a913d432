"""A user's own Gluon script (tests/scripts/own_loop.py) under ``python -m mxlarge.launcher``: what
mxlarge.Trainer gives it without the script knowing about ps-lite (fail-fast, heartbeats)."""
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_launcher import fakes  # noqa: F401  (fixture: fake ssh on PATH)
from tests.helpers import dmlc_processes

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "own_loop.py")


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
@pytest.mark.parametrize("fixed", [None, "0.25", "server hosts"])
def test_exchange_order_is_measured_once_and_the_same_on_every_rank(tmp_path, fixed):
    """As on several hosts (``MXLARGE_PIECES=1``), each rank measures the share of the pushed
    bytes that goes in backward order on its steps 3–5, and every rank uses the median
    (mxlarge.kvstore.order); ``MXLARGE_LEAD`` sets it instead; with server hosts (what the
    cluster launcher says with ``MXLARGE_SERVER_HOSTS=1``) the order stays backward."""
    marker = f"own-{uuid.uuid4().hex}"
    env = ["--env", "MXLARGE_PIECES=1"] + (
        [] if fixed is None else ["--env", "MXLARGE_SERVER_HOSTS=1"] if fixed == "server hosts"
        else ["--env", f"MXLARGE_LEAD={fixed}"])
    r = launcher([*env, "-n", "2", "-s", "2", "--", sys.executable, SCRIPT, "--steps", "8"],
                 tmp_path, marker)
    assert r.returncode == 0, r.stdout[-3000:]
    leads = re.findall(r"own_loop rank=\d done lead=(\S+)", r.stdout)
    assert len(leads) == 2 and leads[0] == leads[1], r.stdout[-3000:]
    if fixed == "server hosts":
        assert leads[0] == "None"
    elif fixed:
        assert float(leads[0]) == float(fixed)
    else:  # φ (t1 - t0) / (t2 - t0) with t0 <= t1 <= t2: in [0, 2], or 1e6 for no exchange time
        assert 0.0 <= float(leads[0]) <= 2.0 or float(leads[0]) == 1e6, leads


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


def _same_params(a, b):
    import mxnet as mx
    import numpy as np
    x, y = mx.nd.load(str(a)), mx.nd.load(str(b))
    assert x.keys() == y.keys()
    for k in x:
        np.testing.assert_array_equal(x[k].asnumpy(), y[k].asnumpy(), err_msg=k)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_own_script_restarted_after_a_crash_resumes_through_its_hook(tmp_path):
    """--max-restarts with docs/trainer.md's resume hook (mxlarge.resume): rank 1 raises at step 10
    in the first attempt only; the second attempt resumes at step 8 (saved every 4) and ends
    with weights bitwise equal to an uninterrupted run's."""
    marker = f"own-{uuid.uuid4().hex}"
    common = [sys.executable, SCRIPT, "--steps", "20", "--save-every", "4"]
    ref = launcher(["-n", "2", "-s", "1", "--", *common, "--ckpt", str(tmp_path / "c1"),
                    "--out", str(tmp_path / "ref.params")], tmp_path, marker)
    assert ref.returncode == 0, ref.stdout[-3000:]
    r = launcher(["-n", "2", "-s", "1", "--max-restarts", "2", "--", *common,
                  "--ckpt", str(tmp_path / "c2"), "--out", str(tmp_path / "got.params"),
                  "--raise-rank", "1", "--raise-step", "10",
                  "--raise-once", str(tmp_path / "raised")], tmp_path, marker)
    out = r.stdout
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"\[launcher\] restart 1/2 after: worker \d( \(launch \d\))? exited with "
                     r"status 1 at step", out), out[-3000:]
    assert out.count("RuntimeError: own_loop raising at step 10") == 1
    assert "own_loop rank=0 pid=" in out and " start=8" in out
    assert "restart 2/2" not in out
    _same_params(tmp_path / "ref.params", tmp_path / "got.params")
    assert dmlc_processes(marker) == []


@pytest.mark.timeout(300)
def test_own_script_failing_the_same_way_twice_is_not_restarted_again(tmp_path):
    marker = f"own-{uuid.uuid4().hex}"
    r = launcher(["-n", "2", "-s", "1", "--max-restarts", "3", "--", sys.executable, SCRIPT,
                  "--steps", "400", "--raise-rank", "1", "--raise-step", "5"], tmp_path, marker)
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    assert out.count("RuntimeError: own_loop raising at step 5") == 2
    assert "[launcher] restart 1/3 after: worker" in out and "restart 2/3" not in out
    assert re.search(r"\[launcher\] not restarting: the same failure at step \d+ twice \(crashed, "
                     r"worker status 1\): a deterministic bug, not a fault", out), out[-3000:]
    assert dmlc_processes(marker) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("fakes")
def test_cluster_launcher_restarts_an_own_script_too(tmp_path):
    """dmlc_tracker's ssh backend (fake ssh, processes on this machine in a clean environment):
    the restart loop sees only the job's exit code, and the script resumes through its hook."""
    marker = f"own-{uuid.uuid4().hex}"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n127.0.0.1\n")
    r = launcher(["-n", "2", "-s", "1", "--launcher", "ssh", "-H", str(hosts), "--host-ip",
                  "127.0.0.1", "--max-restarts", "1", "--env",
                  f"PYTHONPATH={os.pathsep.join(sys.path)}", "--", sys.executable, SCRIPT,
                  "--steps", "20", "--save-every", "4", "--ckpt", str(tmp_path / "c"),
                  "--raise-rank", "0", "--raise-step", "10",
                  "--raise-once", str(tmp_path / "raised")], tmp_path, marker)
    out = r.stdout
    assert r.returncode == 0, out[-3000:]
    # the failing process by its kvstore rank (the script raised on rank 0) and its host
    assert re.search(r"\[launcher\] restart 1/1 after: worker rank 0 on 127\.0\.0\.1 "
                     r"exited with status 1", out), out[-3000:]
    assert " start=8" in out and out.count("own_loop rank=0 done") == 1
    assert not (tmp_path / ".mxlarge-heartbeat").exists()  # heartbeats cleaned up
    assert dmlc_processes(marker) == []


@pytest.mark.timeout(120)
def test_a_job_stuck_before_its_first_step_is_stopped_at_the_start_limit(tmp_path):
    """Every worker sleeps before step 0 (a hang before the first step): with --stall-timeout 1
    the start limit is 10 s; the job is torn down, named, exit 124, no orphan."""
    marker = f"own-{uuid.uuid4().hex}"
    r = launcher(["-n", "2", "-s", "1", "--stall-timeout", "1", "--", sys.executable, SCRIPT,
                  "--steps", "4", "--sleep-from", "0", "--sleep", "600"], tmp_path, marker)
    out = r.stdout
    assert r.returncode == 124, out[-3000:]
    assert re.search(r"\[launcher\] stalled: not every worker completed its first step within "
                     r"\d+ s of the start \(start limit 10 s = 10 x the stall timeout\); behind: "
                     r"worker rank 0 on .* has not completed a step; worker rank 1 on ", out), \
        out[-3000:]
    assert "own_loop rank=0 step=0" not in out
    assert dmlc_processes(marker) == []
