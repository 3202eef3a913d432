"""Stragglers named on real jobs: `mxlarge launch` of the digits config, 2 workers + 1 server on
loopback, one worker slowed by SIGSTOP/SIGCONT in a duty cycle (the rule with heartbeats
written by hand: tests/launcher/test_straggler.py; across hosts: tests/cluster/)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.breakdown import WINDOW, sampled
from mxlarge.protocol import heartbeat
from tests.helpers import DutyCycle, dmlc_processes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"
# as written but for its epochs: 5 steps of 2 x 128 images an epoch, about 40 ms a step on 2
# cores, forward+backward about 20 ms of it
NAMED_WITHIN = 60.0


class Lines:
    """The launcher's output, each line with the time it arrived, read in a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, str] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next(((t, x) for t, x in list(self.lines) if re.search(pattern, x)), None)
            if found is not None:
                return found
            time.sleep(0.2)
        return None

    def text(self) -> str:
        return "\n".join(x for _, x in self.lines)

    def close(self) -> None:
        """After the launcher exited: the rest of its output read, its pipe closed."""
        self._thread.join(10)
        assert self._proc.stdout is not None
        self._proc.stdout.close()


def launch(tmp_path: Path, epochs: int, *extra: str) -> tuple[subprocess.Popen[str], Lines]:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns.db"}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n",
                             "2", "-s", "1", f"train.epochs={epochs}", *extra],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, Lines(proc)


def worker_of_rank(marker: str, rank: int, timeout: float) -> heartbeat.Record:
    """The heartbeat of kvstore rank ``rank`` once both workers report a window of sampled
    steps (``parts``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in dmlc_processes(marker, "worker"):
            try:
                env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text()
                           .split("\0") if "=" in kv)
            except OSError:
                continue
            records = heartbeat.read_all(env[heartbeat.ENV])
            if len(records) == 2 and all(r.parts for r in records.values()):
                return records[rank]
        time.sleep(0.2)
    raise AssertionError("the workers never reported their step breakdown")


def within_a_window(named: int, onset: int) -> bool:
    """Whether at most one heartbeat window of sampled steps (:data:`~mxlarge.breakdown.WINDOW`)
    lies between the step named and the step the slowdown began at."""
    lo, hi = sorted((named, onset))
    return sum(sampled(t) for t in range(lo, hi + 1)) <= WINDOW


def the_run(tmp_path: Path):  # type: ignore[no-untyped-def]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, runs
    return client, runs[0]


@dataclass(frozen=True)
class Slowed:
    """What :func:`slowed_until_named` saw: the victim's pid, what was noted as the slowdown
    began, the seconds until the straggler line, that line, and the recovery line (or None)."""

    pid: int
    noted: Any
    took: float
    line: str
    back: tuple[float, str] | None


def slowed_until_named(proc: subprocess.Popen[str], out: Lines, victim: Callable[[], int],
                       off: float = 0.01, on: float = 0.01,
                       noted: Callable[[], Any] = lambda: None) -> Slowed:
    """The process ``victim()`` slowed by a duty cycle until the launcher names a straggler,
    then left to recover for up to 90 s; the job then stopped with SIGINT (also on a
    failure)."""
    cycle = None
    try:
        pid = victim()
        cycle = DutyCycle(pid, off=off, on=on)
        slowed = time.monotonic()
        note = noted()
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
    return Slowed(pid, note, took - slowed, line, back)


@pytest.mark.timeout(400)
def test_a_slowed_worker_is_named_with_its_pid_and_rank_then_its_recovery(tmp_path):
    proc, out = launch(tmp_path, epochs=5000)
    seen = slowed_until_named(proc, out, lambda: worker_of_rank(str(tmp_path), 1, 150).pid,
                              noted=lambda: worker_of_rank(str(tmp_path), 1, 10).done)
    victim, onset, took, line, back = seen.pid, seen.noted, seen.took, seen.line, seen.back
    m = re.fullmatch(rf"\[launcher\] straggler: worker rank 1 \(pid {victim}\) on "
                     rf"{re.escape(socket.gethostname())} from step (\d+): forward\+backward "
                     r"([\d.]+)× the median \(now [\d.]+×\); the other ranks wait (\d+)% of each "
                     r"step for it", line)
    assert m, line
    assert took < NAMED_WITHIN, (took, out.text()[-4000:])
    # half the time stopped: about twice the forward+backward, the other rank waiting for it;
    # the figures the rule judged, at or above its floors
    assert 1.2 <= float(m.group(2)) <= 4.0 and 10 <= int(m.group(3)) <= 90, line
    # from the step it slowed at, within one window of sampled steps
    first = int(m.group(1))
    assert within_a_window(first, onset), (first, onset)
    assert back is not None, out.text()[-4000:]
    assert back[1].startswith(f"[launcher] straggler recovered: worker rank 1 (pid {victim})")
    assert out.text().count("] straggler") == 2, out.text()[-4000:]
    client, run = the_run(tmp_path)
    tag = run.data.tags["straggler"]
    assert tag.startswith(f"worker rank 1 on {socket.gethostname()} (pid {victim}): "
                          "forward+backward "), tag
    assert f", steps {first} to " in tag, tag
    ratio = sorted(client.get_metric_history(run.info.run_id, "straggler/ratio"),
                   key=lambda m: m.step)
    assert ratio[0].step == first and ratio[0].value >= 1.2, ratio
    assert ratio[-1].value == 1.0, ratio


def assert_names_nobody(proc: subprocess.Popen[str], out: Lines, tmp_path: Path) -> None:
    """The job ends by itself, with no straggler line and no ``straggler`` tag."""
    code = proc.wait(240)
    out.close()
    assert code == 0, out.text()[-4000:]
    assert "straggler" not in out.text(), out.text()[-4000:]
    _, run = the_run(tmp_path)
    assert "straggler" not in run.data.tags


@pytest.mark.timeout(300)
def test_the_same_job_unslowed_names_nobody(tmp_path):
    assert_names_nobody(*launch(tmp_path, epochs=200), tmp_path)


@pytest.mark.timeout(420)
def test_with_the_stall_rule_off_a_straggler_is_named_and_the_timeline_recorded(tmp_path):
    """``--stall-timeout 0`` turns off the stall rule only: the heartbeats still carry the
    workers' step parts, so a slowed worker is named, and the timeline of steps 5-7 is in the
    finished run."""
    proc, out = launch(tmp_path, 400, "--stall-timeout", "0", "train.timeline_start=5",
                       "train.timeline_steps=3")
    cycle = None
    try:
        victim = worker_of_rank(str(tmp_path), 1, 150)
        cycle = DutyCycle(victim.pid)
        named = out.wait_for(r"^\[launcher\] straggler:", NAMED_WITHIN + 30)
        cycle.stop()
        assert named is not None, out.text()[-4000:]
        code = proc.wait(300)
    finally:
        if cycle is not None:
            cycle.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        out.close()
    assert code == 0, out.text()[-4000:]
    assert named[1].startswith(f"[launcher] straggler: worker rank 1 (pid {victim.pid}) on "), \
        named
    assert "[launcher] timeline of steps 5-7: 2 worker rank(s), " in out.text()
    client, run = the_run(tmp_path)
    assert run.info.status == "FINISHED"
    assert run.data.tags["straggler"].startswith(f"worker rank 1 on {socket.gethostname()} "
                                                 f"(pid {victim.pid}): "), run.data.tags
    assert [a.path for a in client.list_artifacts(run.info.run_id, "timeline")] == \
        ["timeline/trace.json", "timeline/trace.png"]


@pytest.mark.timeout(400)
def test_an_own_scripts_straggler_reaches_its_run_and_ctrl_c_kills_it(tmp_path):
    """tests/scripts/own_loop.py under ``python -m mxlarge.launcher``, worker rank 1 slowed by a
    duty cycle: named with its pid within :data:`NAMED_WITHIN` s; then Ctrl-C: the job's run is
    KILLED and carries the straggler tag and metric."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns.db"}
    own = REPO / "tests" / "scripts" / "own_loop.py"
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                             "--", sys.executable, str(own), "--steps", "4000", "--sleep-from",
                             "0", "--sleep", "0.02", "--out", str(tmp_path / "w.params")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = Lines(proc)
    try:
        slow = worker_of_rank(str(tmp_path), 1, 90)
        duty = DutyCycle(slow.pid, off=0.03, on=0.01)
        start = time.monotonic()
        try:
            named = lines.wait_for(rf"^\[launcher\] straggler: worker rank 1 \(pid {slow.pid}\)",
                                   NAMED_WITHIN)
        finally:
            duty.stop()
        assert named is not None, lines.text()[-3000:]
        print(f"named {named[0] - start:.1f} s after the duty cycle began")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130, lines.text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lines.close()
    client, run = the_run(tmp_path)
    assert run.info.status == "KILLED"
    assert f"worker rank 1 on {socket.gethostname()} (pid {slow.pid})" in run.data.tags["straggler"]
    ratio = client.get_metric_history(run.info.run_id, "straggler/ratio")
    assert ratio and ratio[0].value >= 1.2, ratio
