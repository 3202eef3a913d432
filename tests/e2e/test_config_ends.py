"""A config's launched run keeps what it had however the job ends: stopped with Ctrl-C it is
KILLED with its metrics and the ranks' breakdown picture (a worker killed: FAILED with the
picture beside its evidence, tests/e2e/test_dist.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"
STOP_AT = 40  # rank 0's step: 8 epochs of 5 steps, every rank's parts in its heartbeat


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_config_run_stopped_with_ctrl_c_is_killed_and_keeps_its_metrics_and_picture(
        tmp_path, mlflow_uri):
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG),
                             "-n", "2", "-s", "1", "train.epochs=400", "train.progress=false"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ))
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        m = re.match(r"\[worker 0(?: \(launch \d\))?\] step (\d+)/", line)
        if m and int(m.group(1)) >= STOP_AT:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher
            break
    lines.extend(proc.stdout)
    proc.stdout.close()
    out = "".join(lines)
    assert proc.wait(60) == 130, out[-3000:]
    c = MlflowClient(mlflow_uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert run.info.status == "KILLED", out[-3000:]
    steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/loss")]
    assert max(steps) >= STOP_AT, steps
    assert {"val/accuracy", "perf/images_per_sec", "breakdown/rank1/step_ms"} <= \
        set(run.data.metrics), sorted(run.data.metrics)
    assert [a.path for a in c.list_artifacts(run.info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"], out[-3000:]
