"""``python -m mxlarge.launcher --max-restarts 1 --elastic -- python my_script.py``: a script of
the user's own (tests/scripts/elastic_script.py: each of ``trainer.units()``, resumed through
``mxlarge.resume``) loses worker 1's "host" for good, continues as 1 worker x 2 simulated
workers and ends bitwise like the uninterrupted 2-worker job: weights, momentum and each
unit's own BN statistics. Its one MLflow run records the world change.

A local job's hosts are its worker processes (``worker-<i>``); ``--local-lost FILE`` lists
those that are gone for good."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.test_elastic import _worker

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "elastic_script.py")
STEPS = 60
FILES = ("params-0.nd", "params-1.nd", "momentum.nd")


def same_state(a: Path, b: Path) -> None:
    """Two of the script's final checkpoints are bitwise equal; the units' own BN statistics
    differ (so a unit computed under the other's statistics cannot pass)."""
    import mxnet as mx
    for name in FILES:
        x, y = mx.nd.load(str(a / name)), mx.nd.load(str(b / name))
        assert x.keys() == y.keys(), name
        for k in x:
            np.testing.assert_array_equal(x[k].asnumpy(), y[k].asnumpy(), err_msg=f"{name} {k}")
    u0, u1 = (mx.nd.load(str(a / f"params-{u}.nd")) for u in (0, 1))
    spread = max(float(np.abs(u0[k].asnumpy() - u1[k].asnumpy()).max())
                 for k in u0 if "running" in k)
    assert spread > 1e-3, spread


def _wait(path: Path, deadline: float) -> None:
    while not path.exists():
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_own_script_loses_a_worker_and_finishes_as_one_simulating_two_bitwise(tmp_path):
    marker = f"own-el-{uuid.uuid4().hex}"
    env = {**os.environ, "MXLARGE_TEST_MARKER": marker}
    base = [sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1"]
    script = [sys.executable, SCRIPT, "--steps", str(STEPS)]
    ref = subprocess.run([*base, "--", *script, "--ckpt", str(tmp_path / "a"),
                          "--final", str(tmp_path / "fa")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-2000:]
    lost = tmp_path / "lost"
    proc = subprocess.Popen([*base, "--max-restarts", "1", "--elastic", "--local-lost",
                             str(lost), "--run-name", "elastic", "--", *script, "--ckpt",
                             str(tmp_path / "b"), "--final", str(tmp_path / "fb"),
                             "--sleep", "0.1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait(tmp_path / "b/step-00000020/step.json", time.time() + 120)
        lost.write_text("worker-1\n")
        os.kill(_worker(marker, 1), signal.SIGKILL)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    assert ("[launcher] restart 1: world 1 worker(s) x 2 simulated worker(s) (lost: worker-1)"
            in out), out[-4000:]
    assert "elastic_script rank=0 units=2 start=20" in out or \
        "elastic_script rank=0 units=2 start=30" in out, out[-4000:]
    same_state(tmp_path / f"fa/step-{STEPS:08d}", tmp_path / f"fb/step-{STEPS:08d}")
    c = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = next(r for e in c.search_experiments() for r in c.search_runs([e.experiment_id])
               if r.info.run_name == "elastic")
    assert run.info.status == "FINISHED"
    assert (run.data.tags["world_0"], run.data.tags["world_1"]) == \
        ("2 worker(s)", "1 worker(s) x 2 simulated worker(s)")
    assert run.data.tags["workers_lost"] == "worker-1"
    assert run.data.tags["restarts"] == "1"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, message", [
    (["--elastic"], "--elastic: expected --max-restarts N >= 1"),
    (["--min-workers", "1"], "--min-workers: expected together with --elastic"),
])
def test_elastic_options_that_cannot_apply_are_refused(tmp_path, extra, message):
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", *extra, "--",
                        sys.executable, SCRIPT, "--ckpt", str(tmp_path / "c")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_trainer_told_by_the_launcher_refuses_its_own_simulate_workers(monkeypatch):
    from mxlarge.trainer.settings import resolve
    monkeypatch.setenv("MXLARGE_SIMULATE_WORKERS", "2")
    assert resolve("sgd", {"learning_rate": 0.1}, None, None, None).simulate_workers == 2
    with pytest.raises(ValueError, match="simulate_workers=3: the launcher runs this attempt "
                                         "with MXLARGE_SIMULATE_WORKERS=2"):
        resolve("sgd", {"learning_rate": 0.1}, None, None, None, simulate_workers=3)
