"""A config's launched run keeps what it had however the job ends: stopped with Ctrl-C it is
KILLED with its metrics, the ranks' breakdown picture and the model of its last whole step (a
worker killed: FAILED with the picture beside its evidence, tests/e2e/test_dist.py)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge import tracking

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
