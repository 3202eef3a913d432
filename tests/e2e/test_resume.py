"""Nothing lost: straight runs equal checkpoint + resume runs bitwise; the divergence guard."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import cli, dmlc_processes

CONFIG = """
name: rs
data: {dataset: digits, batch_size: 64, augment: true}
model: {name: small_resnet, width: 4}
optim: {base_lr: 0.05, reference_batch: 16, warmup: linear, warmup_epochs: 1, decay: step,
        decay_epochs: [3], momentum: 0.9}
train: {epochs: 4, progress: false, checkpoint_every: 1}
dist: {kvstore: local}
"""


def _same(a: Path, b: Path):
    x, y = mx.nd.load(str(a)), mx.nd.load(str(b))
    assert x.keys() == y.keys()
    for k in x:
        np.testing.assert_array_equal(x[k].asnumpy(), y[k].asnumpy(), err_msg=k)


def _runs(tmp_path):
    c = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    return c, c.search_runs([c.get_experiment_by_name("mxlarge").experiment_id])


@pytest.fixture(scope="module")
def launched_reference(tmp_path_factory) -> Path:
    """The uninterrupted 4-epoch 2-worker launch, shared by the launched resume tests: its
    checkpoints in ``<dir>/a``, its MLflow run in ``<dir>/mlruns.db``."""
    ref = tmp_path_factory.mktemp("ref")
    cfg = ref / "r.yaml"
    cfg.write_text(CONFIG)
    a = cli(["launch", str(cfg), "-n", "2", "-s", "1", f"train.checkpoint_dir={ref}/a"], ref)
    assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-2000:]
    return ref


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("verb", ["train", "launch"])
def test_four_epochs_equal_two_plus_resume_plus_two(tmp_path, request, verb):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(CONFIG)
    extra = ["-n", "2", "-s", "1"] if verb == "launch" else []
    spe = 1400 // (64 * (2 if verb == "launch" else 1))
    if verb == "launch":
        ref = request.getfixturevalue("launched_reference")
    else:
        ref = tmp_path
        a = cli([verb, str(cfg), f"train.checkpoint_dir={tmp_path}/a"], tmp_path)
        assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-2000:]
    b1 = cli([verb, str(cfg), *extra, f"train.checkpoint_dir={tmp_path}/b",
               f"train.max_steps={2 * spe}"], tmp_path)
    assert b1.returncode == 0, b1.stdout[-2000:] + b1.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["epoch-0001", "epoch-0002"]
    b2 = cli([verb, str(cfg), *extra, f"train.checkpoint_dir={tmp_path}/b", "--resume"],
              tmp_path)
    assert b2.returncode == 0, b2.stdout[-2000:] + b2.stderr[-2000:]
    for name in ["model.params", "momentum.nd", "bn-0.nd"] + (["bn-1.nd"] if extra else []):
        _same(ref / "a/epoch-0004" / name, tmp_path / "b/epoch-0004" / name)
    # keep_last = 3 retention
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "epoch-0002", "epoch-0003", "epoch-0004"]
    runs = []
    for where in {ref, tmp_path}:
        client, found = _runs(where)
        runs += [(client, r) for r in found]
    assert len(runs) == 2  # a, and b continued in one run
    for client, run in runs:
        assert run.info.status == "FINISHED"
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")]
        assert steps == [spe, 2 * spe, 3 * spe, 4 * spe]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_killed_worker_then_resume_finishes_like_an_uninterrupted_run(tmp_path,
                                                                     launched_reference):
    cfg = tmp_path / "r.yaml"
    cfg.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(cfg), "-n", "2",
                             "-s", "1", f"train.checkpoint_dir={tmp_path}/b"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (tmp_path / "b/epoch-0001/meta.json").exists():
            time.sleep(0.05)  # an epoch is 10 steps: kill well before the last
        assert (tmp_path / "b/epoch-0001/meta.json").exists()
        victims = dmlc_processes(str(tmp_path), "worker")
        assert victims
        os.kill(victims[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, out[-2000:]
    assert not (tmp_path / "b/epoch-0004").exists()
    again = cli(["launch", str(cfg), "-n", "2", "-s", "1", f"train.checkpoint_dir={tmp_path}/b",
                  "--resume"], tmp_path)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    for name in ("model.params", "momentum.nd", "bn-0.nd", "bn-1.nd"):
        _same(launched_reference / "a/epoch-0004" / name, tmp_path / "b/epoch-0004" / name)
    client, runs = _runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # killed, resumed in one run


@pytest.mark.timeout(200)
def test_divergence_guard_stops_a_warmup_explosion(tmp_path):
    cfg = tmp_path / "boom.yaml"
    cfg.write_text(CONFIG.replace("base_lr: 0.05", "base_lr: 50.0")
                   .replace("warmup: linear", "warmup: none"))
    r = cli(["train", str(cfg), "train.log_every=1", "model.zero_gamma=false",
              f"train.checkpoint_dir={tmp_path}/ck"], tmp_path)
    assert r.returncode == 1
    assert "training diverged at step" in r.stderr and "lr 200" in r.stderr  # 50 x 64/16
    assert "(epoch 1" in r.stderr
    assert not (tmp_path / "ck").exists()  # no checkpoint of a diverged state
    client, runs = _runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert "DivergenceError" in runs[0].data.tags["failure"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_divergence_on_a_launched_job_fails_fast(tmp_path):
    """Ranks see different local losses, so one rank may stop while the others wait in
    push/pull: the failing worker must still exit at once (fail-fast) and take the job down."""
    cfg = tmp_path / "boom.yaml"
    cfg.write_text(CONFIG.replace("base_lr: 0.05", "base_lr: 50.0")
                   .replace("warmup: linear", "warmup: none"))
    t0 = time.time()
    r = cli(["launch", str(cfg), "-n", "2", "-s", "1", "train.log_every=1",
              "model.zero_gamma=false"], tmp_path, timeout=150)
    took = time.time() - t0
    assert r.returncode != 0
    assert "training diverged at step" in r.stdout + r.stderr
    assert took < 60, took
    client, runs = _runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert runs[0].data.tags["failed_role"] == "worker"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_from_the_last_checkpoint_finishes_with_nothing_left(tmp_path):
    """A restart right after the final checkpoint (a job killed before it ended) resumes with
    no step left: it must end cleanly, not fail exporting a graph no forward built."""
    cfg = tmp_path / "r.yaml"
    short = CONFIG.replace("epochs: 4", "epochs: 2").replace(
        "decay: step,\n        decay_epochs: [3]", "decay: none")
    cfg.write_text(short + f"tracking: {{enabled: true, uri: 'sqlite:///{tmp_path}/mlruns.db'}}\n")
    a = cli(["train", str(cfg), f"train.checkpoint_dir={tmp_path}/c"], tmp_path)
    assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-2000:]
    b = cli(["train", str(cfg), f"train.checkpoint_dir={tmp_path}/c", "--resume"], tmp_path)
    assert b.returncode == 0, b.stdout[-2000:] + b.stderr[-2000:]
    assert "the model symbol is not exported" in b.stdout
    _, runs = _runs(tmp_path)
    assert [r.info.status for r in runs] == ["FINISHED"]
