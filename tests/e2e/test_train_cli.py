"""`mxlarge train` end to end in one process: it learns, and MLflow holds the run."""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "experiments/proxy/digits-baseline.yaml"


@pytest.mark.timeout(300)
def test_train_tracks_a_readable_mlflowcli(tmp_path):
    r = cli(["train", str(BASELINE), "train.epochs=4", "optim.decay_epochs=[2,3]",
              "train.progress=false"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "final validation accuracy" in r.stdout
    acc = float(r.stdout.split("final validation accuracy")[1].split()[0])
    assert acc > 0.5  # 4 epochs of digits with the small residual net (chance: 0.10)
    assert (tmp_path / "mlruns.db").exists()

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    exp = client.get_experiment_by_name("mxlarge")
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["optim.base_lr"] == "0.05"
    assert run.data.params["train.epochs"] == "4"
    assert run.data.params["data.dataset"] == "digits"
    assert run.data.params["plan.world_size"] == "1"
    assert run.data.params["plan.global_batch"] == "16"
    hist = client.get_metric_history(run.info.run_id, "val/accuracy")
    assert [m.step for m in hist] == [87, 174, 261, 348]
    assert hist[-1].value == pytest.approx(acc, abs=1e-4)
    lr = client.get_metric_history(run.info.run_id, "train/lr")
    assert min(m.value for m in lr) == pytest.approx(0.0005)
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "final.params", "training_curves.png"} <= arts


def test_unreachable_tracking_uri_fails_before_training(tmp_path):
    r = cli(["train", str(BASELINE), "tracking.uri=http://127.0.0.1:9/nowhere"], cwd=tmp_path,
             env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "3"})
    assert r.returncode != 0
    assert "MLflow tracking URI 'http://127.0.0.1:9/nowhere' is not usable" in r.stderr
    assert "epoch 1" not in r.stdout


@pytest.mark.timeout(300)
def test_train_warns_on_stderr_when_zero_gamma_skips_blocks(tmp_path):
    """A pre-activation net trains, and the user is told that its blocks keep gamma = 1."""
    r = cli(["train", str(BASELINE), "model.name=cifar_resnet20_v2", "train.max_steps=1",
             "train.progress=false", "tracking.enabled=false"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("mxlarge: warning: zero-gamma applies to 0 of 9 residual blocks; skipped "
            "9 x CIFARBasicBlockV2") in r.stderr
