"""A config's launched run keeps what it had however the job ends: stopped with Ctrl-C it is
KILLED with its metrics, the ranks' breakdown picture and the model of its last whole step (a
worker killed: FAILED with the picture beside its evidence, tests/e2e/test_dist.py); the picture
is there while the job still runs, too."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient

from mxlarge import tracking

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"
STOP_AT = 40  # rank 0's step: 8 epochs of 5 steps, every rank's parts in its heartbeat
DRAWN_WITHIN = 60.0  # s after step 1, the first step sampled: every rank has parts from it on


class _Launch:
    """The digits config launched with 2 workers and 1 server for ``epochs`` (more than a test
    waits: 400 epochs are ~45 s on 2 cores), read until worker 0 reached ``step``; a thread
    reads the rest of its output."""

    def __init__(self, cwd: Path, step: int, epochs: int = 400) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n", "2", "-s", "1",
             f"train.epochs={epochs}", "train.progress=false"],
            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ))
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.match(r"\[worker 0(?: \(launch \d\))?\] step (\d+)/", line)
            if m and int(m.group(1)) >= step:
                break
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout or []),
                                       daemon=True)
        self.reader.start()

    def stop(self) -> str:
        """Ctrl-C to the launcher (what Ctrl-C sends it); its output once it exited 130."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(60)
        self.reader.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        out = "".join(self.lines)
        assert code == 130, out[-3000:]
        return out


def _the_run(uri: str) -> tuple[MlflowClient, Run]:
    """The store's one run, and a client of the store."""
    c = MlflowClient(uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    return c, run


def _pictures(c: MlflowClient, run_id: str) -> list[str]:
    return [a.path for a in c.list_artifacts(run_id, "breakdown")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_config_run_stopped_with_ctrl_c_is_killed_and_keeps_its_metrics_and_picture(
        tmp_path, mlflow_uri):
    out = _Launch(tmp_path, STOP_AT).stop()
    c, run = _the_run(mlflow_uri)
    assert run.info.status == "KILLED", out[-3000:]
    steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert max(steps) >= STOP_AT, steps
    assert {"val/accuracy", "perf/images_per_sec", "breakdown/rank1/step_ms"} <= \
        set(run.data.metrics), sorted(run.data.metrics)
    assert _pictures(c, run.info.run_id) == ["breakdown/ranks.png"], out[-3000:]
    # the model so far: rank 0 stopped at a step's end and logged it, the weights of that step
    assert "Ctrl-C: rank 0 stops after its step" in out, out[-3000:]
    stopped = int(run.data.tags["stopped_step"])
    assert stopped >= STOP_AT, run.data.tags
    assert re.search(rf"^\[worker 0[^]]*\] mxlarge: stopped after {stopped} steps", out, re.M)
    reference = subprocess.run(
        [sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n", "2", "-s", "1",
         "train.epochs=400", "train.progress=false", f"train.max_steps={stopped}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert reference.returncode == 0, reference.stdout[-3000:]
    (done,) = [r for r in c.search_runs([run.info.experiment_id]) if r.info.status == "FINISHED"]
    assert_same_weights(tracking.load(run.info.run_id, mlflow_uri),
                        tracking.load(done.info.run_id, mlflow_uri))


def assert_same_weights(net, reference) -> None:
    """Bitwise the same parameters but the BN running statistics (the stopped rank 0 keeps its
    own; the finished job's are the workers' shared ones)."""
    mine = {k: v.data().asnumpy() for k, v in net.collect_params().items()}
    theirs = {k: v.data().asnumpy() for k, v in reference.collect_params().items()}
    assert mine.keys() == theirs.keys()
    weights = [k for k in mine if "running_" not in k]
    assert len(weights) > 10, sorted(mine)
    for k in weights:
        assert (mine[k] == theirs[k]).all(), k


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_config_runs_picture_is_drawn_while_the_job_runs(tmp_path, mlflow_uri):
    """The launcher draws the ranks' picture as soon as every rank has parts
    (mxlarge.launcher.reports.WorkerReports' ``drawn``), not only at the job's end."""
    job = _Launch(tmp_path, 1, epochs=10_000)  # still running when the wait gives up
    try:
        c, run = _the_run(mlflow_uri)
        deadline = time.monotonic() + DRAWN_WITHIN
        while not (drawn := _pictures(c, run.info.run_id)) and time.monotonic() < deadline:
            time.sleep(1.0)
        running = job.proc.poll() is None
    finally:
        out = job.stop()
    assert drawn == ["breakdown/ranks.png"], out[-3000:]
    assert running, out[-3000:]  # drawn while the job ran, not by its end
    assert c.get_run(run.info.run_id).info.status == "KILLED", out[-3000:]
