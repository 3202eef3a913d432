"""`mxlarge sweep` and `mxlarge report` end to end on digits, in a fresh MLflow store each."""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.cli import main
from mxlarge.reporting.cli import write_report
from mxlarge.reporting.store import load_sweep_runs
from tests import helpers
from tests.helpers import write_yaml

ROOT = Path(__file__).resolve().parents[2]
BASELINE = "experiments/proxy/digits-baseline.yaml"       # relative to the repository root
LARGE = "experiments/proxy/digits-largebatch.yaml"
TINY = ["train.progress=false", "train.epochs=2", "optim.decay_epochs=[1]",
        "optim.warmup_epochs=1"]


def cli(args, cwd, uri, timeout=240):
    return helpers.cli(args, cwd, timeout, env={"MLFLOW_TRACKING_URI": uri})


def sweep_runs(uri: str, name: str):
    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("mxlarge")
    return c, [r for r in c.search_runs([exp.experiment_id])
               if r.data.tags.get("sweep") == name]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_tiny_sweep_resumes_and_reports(tmp_path, mlflow_uri, capsys):
    sweep = write_yaml(tmp_path / "tiny.yaml", {
        "name": "tiny", "mode": "train",
        "runs": [{"label": "small batch", "config": BASELINE,
                  "overrides": ["data.batch_size=64"]},
                 {"label": "large batch", "config": LARGE,
                  "overrides": ["data.batch_size=256", "dist.kvstore=local", "dist.workers=1"]}],
        "seeds": [0, 1], "overrides": TINY[:1]})
    r = cli(["sweep", str(sweep), *TINY[1:]], tmp_path, mlflow_uri)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count(": FINISHED in") == 4, r.stdout
    assert "\r" not in r.stdout + r.stderr  # no tqdm frames in a pipe
    c, runs = sweep_runs(mlflow_uri, "tiny")
    assert len(runs) == 4 and {x.info.status for x in runs} == {"FINISHED"}
    cells = {(x.data.tags["sweep_label"], x.data.tags["seed"]) for x in runs}
    assert cells == {(lbl, s) for lbl in ("small batch", "large batch") for s in ("0", "1")}
    for x in runs:
        assert len(x.data.tags["config_hash"]) == 64
        assert x.data.params["train.epochs"] == "2"
        assert x.data.params["train.seed"] == x.data.tags["seed"]
        assert x.data.params["plan.world_size"] == "1"
    assert {x.data.params["plan.global_batch"] for x in runs} == {"64", "256"}

    # again: every cell is found in MLflow and skipped, nothing new is created
    r = cli(["sweep", str(sweep), *TINY[1:]], tmp_path, mlflow_uri)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count(": skipped, ") == 4 and "FINISHED in" not in r.stdout
    assert len(sweep_runs(mlflow_uri, "tiny")[1]) == 4
    # another setting is another config hash: those cells are still to run
    assert main(["sweep", str(sweep), "train.epochs=3", *TINY[2:], "--dry-run"]) == 0
    assert capsys.readouterr().out.count(": to run") == 4

    r = cli(["report", "tiny", "--out", "rep"], tmp_path, mlflow_uri)
    assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path / "rep"
    text = (out / "report.md").read_text()
    assert "| small batch | 1 | 64 |" in text and "| large batch | 1 | 256 |" in text
    for png in ("val_error.png", "final_error_vs_batch.png", "loss_lr.png"):
        assert (out / png).stat().st_size > 1000
    # the report is logged to the sweep's one parent run (run twice, the sweep kept one parent)
    exp = c.get_experiment_by_name("mxlarge")
    parents = [x for x in c.search_runs([exp.experiment_id])
               if x.data.tags.get("sweep_parent") == "tiny"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    arts = {a.path for a in c.list_artifacts(parents[0].info.run_id)}
    assert {"report.md", "report.json", "val_error.png", "loss_lr.png"} <= arts
    # the parent run is not read back as a run of the sweep
    assert len(load_sweep_runs(mlflow_uri, "mxlarge", "tiny")) == 4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_failed_cell_fails_the_sweep_and_runs_again(tmp_path, mlflow_uri):
    sweep = write_yaml(tmp_path / "f.yaml", {
        "name": "f",
        "runs": [{"label": "ok", "config": BASELINE},
                 {"label": "diverges", "config": BASELINE,
                  "overrides": ["optim.base_lr=1000000.0", "train.log_every=1"]}],
        "seeds": [0],
        "overrides": ["train.progress=false", "train.epochs=1", "optim.decay=none",
                      "data.batch_size=128"]})
    r = cli(["sweep", str(sweep)], tmp_path, mlflow_uri)
    assert r.returncode == 1
    assert "1 cell(s) failed: diverges seed 0" in r.stderr and "DivergenceError" in r.stderr
    r = cli(["sweep", str(sweep)], tmp_path, mlflow_uri)
    assert r.returncode == 1
    assert "ok, seed 0: skipped" in r.stdout and "diverges, seed 0: FAILED" in r.stdout
    _, runs = sweep_runs(mlflow_uri, "f")
    assert sorted(x.info.status for x in runs) == ["FAILED", "FAILED", "FINISHED"]
    assert all("failure" in x.data.tags for x in runs if x.info.status == "FAILED")
    text = write_report("f", tmp_path / "rep", uri=mlflow_uri).read_text()
    assert "| diverges | n/a |" in text and "| ok | 1 | 128 |" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_mode_tags_the_launched_run_and_skips_it_next_time(tmp_path, mlflow_uri, capsys):
    sweep = write_yaml(tmp_path / "l.yaml", {
        "name": "l", "mode": "launch", "workers": 2, "servers": 1,
        "runs": [{"label": "k2", "config": LARGE}], "seeds": [3],
        "overrides": ["train.progress=false", "train.epochs=1", "optim.decay=none",
                      "optim.warmup=none", "train.max_steps=2"]})
    r = cli(["sweep", str(sweep)], tmp_path, mlflow_uri)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _, runs = sweep_runs(mlflow_uri, "l")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    tags = runs[0].data.tags
    assert (tags["sweep_label"], tags["seed"]) == ("k2", "3")
    assert runs[0].data.params["plan.world_size"] == "2"
    assert runs[0].data.params["train.seed"] == "3"
    assert main(["sweep", str(sweep), "--dry-run"]) == 0      # next time: nothing to run
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith("[1/1] k2, seed 3, k=2, config ") and line.endswith(": done"), line


