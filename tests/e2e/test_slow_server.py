"""Slow servers named on real jobs: `mxlarge launch` of the digits config, 2 workers + 2 servers
on loopback (buckets of 16 KiB, so both servers sum gradients), one server slowed by
SIGSTOP/SIGCONT in a duty cycle; and the worker's onset step (the rule on heartbeats written by
hand: tests/launcher/test_servers.py; a server host under a CPU quota: tests/cluster/)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mxlarge.launcher.straggler import Rules
from tests.e2e.test_straggler import (
    CONFIG,
    NAMED_WITHIN,
    Lines,
    assert_names_nobody,
    slowed_until_named,
    the_run,
)
from tests.helpers import dmlc_processes

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

    def second_server() -> int:
        training(out, 150)
        return servers(str(tmp_path))[1]
    seen = slowed_until_named(proc, out, second_server, off=0.03, on=0.01)
    victim, took, line, back = seen.pid, seen.took, seen.line, seen.back
    assert re.fullmatch(rf"\[launcher\] straggler: server rank [01] \(pid {victim}\) on "
                        rf"{re.escape(socket.gethostname())} from step \d+: its sums come \d+ ms "
                        r"after the other servers' \([\d.]+×; now [\d.]+×\); it holds \d+% of "
                        r"the gradient bytes; the workers wait \d+% of each step for it",
                        line), line
    assert took < NAMED_WITHIN, (took, out.text()[-4000:])
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
    assert_names_nobody(*launch(tmp_path, epochs=300), tmp_path)
