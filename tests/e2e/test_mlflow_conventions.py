"""MLflow's conventions, end to end: MLFLOW_EXPERIMENT_NAME and MLFLOW_RUN_ID, system tags,
one lr per step, only applicable params, a loadable model, and a sweep as one parent run with
children, seen through the client and through a running `mlflow server`'s REST API."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[2]
BASELINE = str(ROOT / "experiments/proxy/digits-baseline.yaml")
# 1,400 images / 64 = 21 steps per epoch: the epoch ends on a logging step (7, 14, 21)
TINY = ["data.batch_size=64", "train.epochs=1", "train.log_every=7", "train.progress=false",
        "optim.decay_epochs=[0.5]"]


@pytest.mark.timeout(400)
def test_train_follows_mlflow_conventions_and_logs_a_loadable_model(tmp_path, mlflow_uri):
    import mxnet as mx

    import mxlarge
    from mxlarge.data.digits import load_split

    r = cli(["train", BASELINE, *TINY], tmp_path,
            env={"MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_EXPERIMENT_NAME": "digits-study"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    c = MlflowClient(tracking_uri=mlflow_uri)
    exp = c.get_experiment_by_name("digits-study")
    assert exp is not None
    (run,) = c.search_runs([exp.experiment_id])
    tags, params = run.data.tags, run.data.params
    assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.user"]
    assert tags["mlflow.source.name"] == "mxlarge train"
    assert len(tags["mlflow.source.git.commit"]) == 40
    assert "data.train_rec" not in params and "data.threads" not in params  # ImageNet keys
    assert params["data.batch_size"] == "64" and params["data.augment"] == "True"
    lr_steps = [m.step for m in c.get_metric_history(run.info.run_id, "train/lr")]
    assert lr_steps == [0, 7, 14, 21]  # from step 0, once per step, the epoch's end included

    model = mxlarge.load(run.info.run_id, mlflow_uri)
    _, _, x_val, y_val, _, _ = load_split()  # stored standardised, as the net reads them
    pred = model(mx.nd.array(x_val)).asnumpy().argmax(axis=1)
    acc = float((pred == y_val).mean())
    assert acc == pytest.approx(run.data.metrics["val/accuracy"], abs=1e-6)


@pytest.mark.timeout(300)
def test_mlflow_run_id_is_the_callers_run(tmp_path, mlflow_uri):
    c = MlflowClient(tracking_uri=mlflow_uri)
    exp = c.create_experiment("mxlarge")
    mine = c.create_run(exp).info.run_id
    r = cli(["train", BASELINE, *TINY], tmp_path,
            env={"MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_RUN_ID": mine})
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x.info.run_id for x in c.search_runs([exp])] == [mine]
    run = c.get_run(mine)
    assert "val/accuracy" in run.data.metrics
    assert run.info.status == "RUNNING"  # the caller opened it, so the caller ends it


def _free_port() -> int:
    from mxlarge.launcher import free_port

    return free_port()


def _rest(port: int, path: str, body: dict | None = None) -> dict:
    url = f"http://127.0.0.1:{port}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # a loaded machine
        return json.loads(resp.read() or b"{}")


@pytest.mark.timeout(600)
def test_sweep_is_one_parent_run_with_children_in_client_and_server(tmp_path, mlflow_uri):
    sweep = tmp_path / "nest.yaml"
    sweep.write_text(yaml.safe_dump({"name": "nest", "mode": "train",
                                     "runs": [{"label": "base", "config": BASELINE}],
                                     "seeds": [0, 1], "overrides": TINY}))
    env = {"MLFLOW_TRACKING_URI": mlflow_uri}
    r = cli(["sweep", str(sweep)], tmp_path, env=env, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    r = cli(["report", "nest", "--out", str(tmp_path / "rep")], tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]

    c = MlflowClient(tracking_uri=mlflow_uri)
    exp = c.get_experiment_by_name("mxlarge")
    runs = c.search_runs([exp.experiment_id])
    parents = [x for x in runs if x.data.tags.get("sweep_parent") == "nest"]
    assert len(parents) == 1 and len(runs) == 3  # no separate summary run
    parent = parents[0]
    children = [x for x in runs if x.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(x.data.tags["seed"] for x in children) == ["0", "1"]
    assert parent.info.status == "FINISHED"
    assert "report.md" in {a.path for a in c.list_artifacts(parent.info.run_id)}

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", mlflow_uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(2)
        found = _rest(port, "/api/2.0/mlflow/runs/search", {
            "experiment_ids": [exp.experiment_id],
            "filter": f"tags.mlflow.parentRunId = '{parent.info.run_id}'"})
        assert len(found["runs"]) == 2
        top = _rest(port, f"/api/2.0/mlflow/runs/get?run_id={parent.info.run_id}")
        assert {t["key"]: t["value"] for t in top["run"]["data"]["tags"]}["sweep_parent"] == "nest"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
