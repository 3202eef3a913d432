"""A launched job's run carries every rank's step breakdown (mxlarge.breakdown): a real
scheduler, server and 2 workers on 127.0.0.1, the digits config; a script of one's own under the
launcher fills its heartbeat's."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge import breakdown as B
from mxlarge.breakdown import PARTS
from mxlarge.protocol import heartbeat

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"
OWN_LOOP = REPO / "tests" / "scripts" / "own_loop.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_launched_run_has_each_ranks_breakdown_its_summary_and_picture(tmp_path):
    """Both ranks' parts at (nearly) every epoch's end, the summary's metrics and its tag naming
    the slowest rank and its host, the picture under breakdown/."""
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n", "2",
                        "-s", "1", "train.epochs=24"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=280, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c = MlflowClient(uri)
    run = c.search_runs([e.experiment_id for e in c.search_experiments()])[0]
    m = run.data.metrics
    for rank in (0, 1):
        parts = {p: m[f"breakdown/rank{rank}/{p}_ms"] for p in (*PARTS, "step")}
        assert parts["data"] >= 0 and all(parts[p] > 0 for p in PARTS[1:]), parts
        # each part of a step is at most the step, so are their medians (0.1 ms rounding)
        assert all(parts[p] <= parts["step"] + 0.1 for p in PARTS), parts
        history = c.get_metric_history(run.info.run_id, f"breakdown/rank{rank}/compute_ms")
        # at each epoch's end (5 steps an epoch; step 1 is the first sampled)
        assert [h.step for h in history] == [5 * e for e in range(1, 25)]
    assert m["breakdown/slowest_rank"] in (0.0, 1.0)
    assert m["breakdown/spread"] >= 1.0
    assert 0.0 <= m["breakdown/wait_others_share"] < m["breakdown/wait_share"] < 1.0
    slowest = int(m["breakdown/slowest_rank"])
    assert run.data.tags["breakdown"].startswith(
        f"worker rank {slowest} on {socket.gethostname()} is the slowest: "), run.data.tags
    assert [a.path for a in c.list_artifacts(run.info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"]


@pytest.mark.timeout(180)
def test_a_scripts_own_trainer_step_fills_the_heartbeats_breakdown(tmp_path):
    """tests/scripts/own_loop.py (``mxlarge.Trainer.step`` in a loop of its own, 50 ms of sleep
    before each step) under ``python -m mxlarge.launcher``: each worker's heartbeat carries the
    coarse breakdown (mxlarge.breakdown.StepClock): forward+backward is the time between the
    calls, so at least the sleep; no wait for data is seen."""
    job, seen, out = [], {}, []
    with subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                           "--", sys.executable, str(OWN_LOOP), "--steps", "45",
                           "--sleep-from", "0", "--sleep", "0.05"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            out.append(line)
            if (m := re.match(r"\[launcher\] job (\w+):", line)):
                job.append(m.group(1))
            if "own_loop rank=0 step=30" in line:
                for r in (0, 1):
                    (path,) = Path(tempfile.gettempdir()).glob(
                        f"mxlarge-heartbeat-{job[0]}-*/worker-{r}.json")
                    seen[r] = heartbeat.Record.decode(path.read_bytes())
    assert proc.returncode == 0, "".join(out)[-3000:]
    for r in (0, 1):
        parts = seen[r].parts
        assert parts is not None and parts["at"] in (14.0, 27.0), parts
        assert parts["n"] == sum(map(B.sampled, range(int(parts["at"]) + 1)))  # 1, 6, 14 (, 27)
        assert parts["data"] == 0.0 and parts["compute"] >= 50.0 and parts["update"] > 0.0
        assert parts["step"] >= parts["compute"]
