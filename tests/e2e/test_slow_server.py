"""Slow servers named on real jobs: `mxlarge launch` of the digits config, 2 workers + 2 servers
on loopback (buckets of 16 KiB, so both servers sum gradients), one server slowed by
SIGSTOP/SIGCONT in a duty cycle; and the worker's onset step (the rule on heartbeats written by
hand: tests/launcher/test_servers.py; a server host under a CPU quota: tests/cluster/)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mxlarge.launcher.straggler import Rules
from tests.e2e.test_straggler import CONFIG, NAMED_WITHIN, Lines, the_run
from tests.helpers import DutyCycle, dmlc_processes

pytestmark = pytest.mark.slow
FLOORS = Rules()
# every straggler line: the ratio and the wait the rule judged, never printed below its floors
FIGURES = re.compile(r"\(?([\d.]+)×.*wait (\d+)% of each step")


def launch(tmp_path: Path, epochs: int) -> tuple[subprocess.Popen[str], Lines]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns.db"}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n",
                             "2", "-s", "2", f"train.epochs={epochs}",
                             "dist.fusion_bytes=16384"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, Lines(proc)


def training(out: Lines, timeout: float) -> None:
    """Until the workers log their 20th epoch (every rank's window of sampled steps is full)."""
    assert out.wait_for(r"epoch 20/", timeout) is not None, out.text()[-3000:]


def servers(marker: str) -> list[int]:
    found = dmlc_processes(marker, "server")
    assert len(found) == 2, found
    return found


def assert_floors(text: str) -> None:
    for line in text.splitlines():
        if line.startswith("[launcher] straggler:"):
            m = FIGURES.search(line)
            assert m, line
            assert float(m.group(1)) >= FLOORS.onset, line
            assert int(m.group(2)) >= 100 * FLOORS.min_wait, line


@pytest.mark.timeout(400)
def test_a_slowed_server_is_named_with_its_pid_then_its_recovery(tmp_path):
    proc, out = launch(tmp_path, epochs=5000)
    cycle = None
    try:
        training(out, 150)
        victim = servers(str(tmp_path))[1]
        cycle = DutyCycle(victim, off=0.03, on=0.01)
        slowed = time.monotonic()
        named = out.wait_for(r"^\[launcher\] straggler:", NAMED_WITHIN + 30)
        cycle.stop()
        assert named is not None, out.text()[-4000:]
        back = out.wait_for(r"^\[launcher\] straggler recovered:", 90)
    finally:
        if cycle is not None:
            cycle.stop()
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        out.close()
    took, line = named
    print(f"named {took - slowed:.1f} s after the slowdown began: {line}")
    assert re.fullmatch(rf"\[launcher\] straggler: server rank [01] \(pid {victim}\) on "
                        rf"{re.escape(socket.gethostname())} from step \d+: its sums come \d+ ms "
                        r"after the other servers' \([\d.]+×; now [\d.]+×\); it holds \d+% of "
                        r"the gradient bytes; the workers wait \d+% of each step for it",
                        line), line
    assert took - slowed < NAMED_WITHIN, (took - slowed, out.text()[-4000:])
    assert_floors(out.text())
    assert back is not None, out.text()[-4000:]
    assert re.match(rf"\[launcher\] straggler recovered: server rank [01] \(pid {victim}\)",
                    back[1]), back
    assert out.text().count("] straggler") == 2, out.text()[-4000:]
    _, run = the_run(tmp_path)
    assert run.info.status == "KILLED"
    assert re.match(rf"server rank [01] on {re.escape(socket.gethostname())} \(pid {victim}\): "
                    "its sums come", run.data.tags["straggler"]), run.data.tags["straggler"]


@pytest.mark.timeout(300)
def test_the_same_job_unslowed_names_no_server(tmp_path):
    proc, out = launch(tmp_path, epochs=300)
    code = proc.wait(240)
    out.close()
    assert code == 0, out.text()[-4000:]
    assert "straggler" not in out.text(), out.text()[-4000:]
    _, run = the_run(tmp_path)
    assert "straggler" not in run.data.tags
