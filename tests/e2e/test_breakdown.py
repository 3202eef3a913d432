"""A launched job's run carries every rank's step breakdown (mxlarge.breakdown): a real
scheduler, server and 2 workers on 127.0.0.1, the digits config."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.breakdown import PARTS

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"


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
        # medians of the parts need not add up to the median step, but come close
        assert 0.5 * parts["step"] < sum(parts[p] for p in PARTS) < 1.5 * parts["step"]
        history = c.get_metric_history(run.info.run_id, f"breakdown/rank{rank}/compute_ms")
        # at each epoch's end from the first sampled step on: 5 steps an epoch, step 0 (the
        # warm-up) is not counted, step 10 is the third epoch's
        assert [h.step for h in history] == [5 * e for e in range(3, 25)]
    assert m["breakdown/slowest_rank"] in (0.0, 1.0)
    assert m["breakdown/spread"] >= 1.0
    assert 0.0 <= m["breakdown/wait_others_share"] < m["breakdown/wait_share"] < 1.0
    slowest = int(m["breakdown/slowest_rank"])
    assert run.data.tags["breakdown"].startswith(
        f"worker rank {slowest} on {socket.gethostname()} is the slowest: "), run.data.tags
    assert [a.path for a in c.list_artifacts(run.info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"]
