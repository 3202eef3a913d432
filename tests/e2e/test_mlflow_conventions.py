"""MLflow's conventions, end to end: MLFLOW_EXPERIMENT_NAME and MLFLOW_RUN_ID, system tags,
one lr per step, only applicable params, a loadable model, and a sweep as one parent run with
children, seen through the client and through a running `mlflow server`'s REST API."""
import json
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import cli, mlflow_server

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


@pytest.mark.timeout(400)
def test_a_run_reads_as_ml_engineers_read_it(tmp_path, mlflow_uri):
    """Name, description, params, metric sections, the logged model and system metrics of one
    `mxlarge train`, against closed forms: the plan, the median rule, the exported net."""
    import mlflow
    import mxnet as mx
    import numpy as np

    import mxlarge
    from mxlarge.config import load_config
    from mxlarge.data.digits import load_split
    from mxlarge.plan import plan_for
    from mxlarge.stats import final_error

    args = ["data.batch_size=64", "train.epochs=3", "train.log_every=5", "train.progress=false",
            "optim.decay_epochs=[2]", "optim.warmup=linear", "optim.warmup_epochs=1"]
    r = cli(["train", BASELINE, *args], tmp_path,
            env={"MLFLOW_TRACKING_URI": mlflow_uri, "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    c = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = c.search_runs([c.get_experiment_by_name("mxlarge").experiment_id])
    rid, exp = run.info.run_id, run.info.experiment_id
    tags, params = run.data.tags, run.data.params
    # the training view's URL, with the command that serves it
    assert (f"MLflow run {rid}: http://127.0.0.1:5000/#/experiments/{exp}/runs/{rid}"
            f"?workflowType=machine_learning (serve it with: mlflow ui --backend-store-uri "
            f"{mlflow_uri}; runs list: http://127.0.0.1:5000/#/experiments/{exp}/runs"
            "?viewStateShareKey=mxlarge&workflowType=machine_learning)") in r.stdout
    plan = plan_for(load_config(BASELINE, args))
    # what differs from the file first (the world, the epochs), then the seed
    assert tags["mlflow.runName"] == "digits-baseline 1×64 3ep s0"
    note = tags["mlflow.note.content"]
    assert note.startswith("**digits-baseline** (`experiments/proxy/digits-baseline.yaml`)")
    assert f"| peak_lr | {plan.peak_lr} |" in note and "| global_batch | 64 |" in note

    # params: what applies to digits and small_resnet, the plan, the store as resolved
    # and what takes effect: no LARS, poly decay, noise scale, compression or checkpoints here
    for key in ("data.flip", "data.mean", "data.std", "data.scale", "data.ratio", "name",
                "data.train_rec", "optim.lars_eta", "optim.poly_power", "train.gns_decay",
                "dist.compression_threshold", "train.keep_last", "train.max_steps"):
        assert key not in params, key
    assert {k: params[f"plan.{k}"] for k in ("global_batch", "peak_lr", "total_steps")} == {
        "global_batch": "64", "peak_lr": str(plan.peak_lr), "total_steps": "63"}
    assert params["tracking.uri"] == mlflow_uri and params["net.zero_gamma_blocks"] == "2"
    # nothing twice: no tag repeats a param or MLflow's own commit tag
    assert not {"git_commit", "global_batch", "dataset", "model", "kvstore"} & set(tags)

    # metrics: MLflow's sections, no duplicate series
    metrics = run.data.metrics
    assert {k.split("/")[0] for k in metrics} == {"train", "val", "perf", "system"}
    # one throughput per name: the last epoch's and the median over epochs (the report's)
    ips = [m.value for m in c.get_metric_history(rid, "perf/images_per_sec")]
    assert metrics["perf/images_per_sec_median"] == pytest.approx(float(np.median(ips)))
    assert not any(k.startswith("perf/images_per_sec_rank") for k in metrics)  # 1 worker
    hist = {k: {m.step: m.value for m in c.get_metric_history(rid, k)}
            for k in ("train/lr", "train/samples", "val/error_top1", "val/accuracy",
                      "val/best_accuracy", "val/final_error_pct")}
    assert sorted(hist["train/lr"]) == [0, 5, 10, 15, 20, 21, 25, 30, 35, 40, 42, 45, 50, 55,
                                        60, 63]
    for step, lr in hist["train/lr"].items():  # what `mxlarge show --lr-at STEP` prints
        assert lr == pytest.approx(plan.schedule(step), rel=1e-12), step
    assert hist["train/lr"][0] == pytest.approx(plan.warmup_lr)  # the warmup's start
    assert hist["train/samples"] == {s: 64.0 * s for s in hist["train/lr"]}
    errors = [hist["val/error_top1"][s] for s in (21, 42, 63)]
    assert hist["val/final_error_pct"][63] == pytest.approx(100 * final_error(errors))
    assert hist["val/best_accuracy"] == {s: pytest.approx(max(hist["val/accuracy"][t]
                                                              for t in (21, 42, 63) if t <= s))
                                         for s in (21, 42, 63)}
    assert any(k.startswith("system/cpu_utilization") for k in metrics)  # MLflow's monitor

    # the logged model: a pyfunc whose predictions are the exported net's outputs
    (out,) = run.outputs.model_outputs
    model = c.get_logged_model(out.model_id)
    assert model.source_run_id == rid and model.experiment_id == exp
    assert model.name == "digits-baseline-1x64-3ep-s0"  # named after the run
    # the model's page: the run's params, its description and final metrics
    assert model.params == params and model.tags["mlflow.note.content"] == note
    assert {m.key: m.value for m in model.metrics} == {
        k: v for k, v in metrics.items() if not k.startswith("system/")}
    # the last step's loss is logged (the epoch's end is a step of its own, 63 of 63)
    assert [m.step for m in c.get_metric_history(rid, "train/loss")][-1] == 63
    _, _, x_val, y_val, _, _ = load_split()
    x = x_val.astype(np.float32)
    pyfunc = mlflow.pyfunc.load_model(model.artifact_location)
    assert [tuple(t.shape) for t in pyfunc.metadata.signature.inputs.inputs] == [(-1, 1, 8, 8)]
    got = pyfunc.predict(x)
    want = mxlarge.load(rid, mlflow_uri)(mx.nd.array(x)).asnumpy()
    assert np.array_equal(got, want)
    assert float((got.argmax(axis=1) == y_val).mean()) == pytest.approx(
        metrics["val/accuracy"], abs=1e-6)


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


def _rest(port: int, path: str, body: dict | None = None) -> dict:
    url = f"http://127.0.0.1:{port}{path}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:  # a loaded machine
        return json.loads(resp.read() or b"{}")


@pytest.mark.slow
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
    # names that tell the cells apart, the repo-relative config, the parent's grid and report
    assert sorted(x.data.tags["mlflow.runName"] for x in children) == [
        "base 1×64 1ep s0", "base 1×64 1ep s1"]
    assert {x.data.tags["sweep_config"] for x in children} == {
        "experiments/proxy/digits-baseline.yaml"}
    assert parent.data.params["sweep.seeds"] == "0,1" and parent.data.tags["sweep_labels"] == \
        "base"
    assert "" not in parent.data.params.values()  # no empty params (no target here)
    assert "\n| base | 1 | 64 |" in parent.data.tags["mlflow.note.content"]
    finals = [x.data.metrics["val/final_error_pct"] for x in children]  # in %, as the table
    assert f"| {sum(finals) / 2:.2f} ± " in parent.data.tags["mlflow.note.content"]
    assert not parent.data.metrics  # the labels compared in its description's picture
    url = (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs/"
           f"{parent.info.run_id}?workflowType=machine_learning")
    assert url in r.stdout  # printed by report (and by sweep)

    with mlflow_server(mlflow_uri, tmp_path) as port:
        found = _rest(port, "/api/2.0/mlflow/runs/search", {
            "experiment_ids": [exp.experiment_id],
            "filter": f"tags.mlflow.parentRunId = '{parent.info.run_id}'"})
        assert len(found["runs"]) == 2
        top = _rest(port, f"/api/2.0/mlflow/runs/get?run_id={parent.info.run_id}")
        assert {t["key"]: t["value"] for t in top["run"]["data"]["tags"]}["sweep_parent"] == "nest"
