"""`mxlarge report` against real MLflow stores: one written with the metric names and tags of
stores made before the MLflow sections (train/, val/, perf/, gns/) reads exactly like the same
runs written with the current names, and the sweep's parent run gets the labels compared in one
picture, the table and the plots as its description, and no per-label metrics."""
import re

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from mxlarge import tracking
from mxlarge.reporting.cli import write_report
from mxlarge.reporting.runs import LEGACY_METRICS
from mxlarge.reporting.store import load_sweep_runs

# per seed: val errors of 3 epochs (logged at steps 10, 20, 30), images/s, per-step losses
RUNS = {0: ([0.5, 0.3, 0.2], 100.0), 1: ([0.6, 0.25, 0.15], 120.0)}


def _write(uri: str, legacy: bool) -> None:
    c = MlflowClient(tracking_uri=uri)
    found = c.get_experiment_by_name("mxlarge")
    exp = found.experiment_id if found else c.create_experiment("mxlarge")
    parent = tracking.sweep_parent(uri, "mxlarge", "old", {"sweep.seeds": "0,1"}, "grid")
    for seed, (errors, ips) in RUNS.items():
        plan = {"workers": "1", "global_batch": "32", "peak_lr": "0.1"}
        tags = {"sweep": "old", "sweep_label": "base", "seed": str(seed),
                "mlflow.parentRunId": parent.run_id}
        if legacy:  # the plan as tags, the commit twice
            tags.update(plan, git_commit="c" * 40)
        run = c.create_run(exp, tags=tags).info.run_id
        c.log_batch(run, params=[] if legacy else [Param(f"plan.{k}", v)
                                                   for k, v in plan.items()])
        ms = []
        for e, err in enumerate(errors):
            step = 10 * (e + 1)
            for key, value in (("train/epoch", e + 1.0), ("val/error_top1", err),
                               ("val/accuracy", 1 - err), ("perf/train_seconds", 2.0 * step),
                               ("perf/images_per_sec", ips), ("train/loss", 2.0 - e / 2),
                               ("train/lr", 0.1)):
                ms.append(Metric(LEGACY_METRICS[key] if legacy else key, value, 0, step))
        c.log_batch(run, metrics=ms)
        c.set_terminated(run, "FINISHED")
    parent.end(True)


def _numbers(uri: str, tmp_path):
    runs = sorted(load_sweep_runs(uri, "mxlarge", "old"), key=lambda r: r.seed)
    text = write_report("old", tmp_path / "rep", uri=uri).read_text()
    table = text[text.index("| label |"):text.index("\n\n", text.index("| label |"))]
    return ([(r.seed, r.workers, r.global_batch, r.peak_lr, r.rows, r.lr, r.loss)
             for r in runs], table)


@pytest.mark.timeout(240)
def test_report_reads_a_store_with_the_old_names_as_one_with_the_new(tmp_path, mlflow_uri):
    old_uri = f"sqlite:///{tmp_path}/old.db"
    _write(old_uri, legacy=True)
    _write(mlflow_uri, legacy=False)
    old, old_table = _numbers(old_uri, tmp_path / "o")
    new, new_table = _numbers(mlflow_uri, tmp_path / "n")
    assert old == new and old_table == new_table
    seed0 = old[0]
    assert seed0[1:4] == (1, 32, 0.1)  # workers, global batch, peak LR: from the old tags
    assert [r["val/error_top1"] for r in seed0[4]] == RUNS[0][0]
    assert seed0[6] == ((10, 2.0), (20, 1.5), (30, 1.0))  # train_loss_step read as train/loss
    # final error = median of the evaluations (3 < 5 here): 0.3 and 0.25; mean ± sample std
    assert "| 27.50 ± 3.54 |" in new_table


@pytest.mark.timeout(240)
def test_sweep_parent_shows_the_comparison_the_table_and_the_plots(tmp_path, mlflow_uri):
    _write(mlflow_uri, legacy=False)
    write_report("old", tmp_path / "rep", uri=mlflow_uri)
    parent = tracking.find_sweep_parent(mlflow_uri, "mxlarge", "old")
    c = MlflowClient(tracking_uri=mlflow_uri)
    run = c.get_run(parent.run_id)
    note = run.data.tags["mlflow.note.content"]
    # the comparison first, then the table that fits (finals: medians 0.3 and 0.25; images/s:
    # 100 and 120; its own reference), then the other plots
    src = f"get-artifact?path={{}}&run_uuid={parent.run_id}"
    caption = "the labels side by side: base"
    compare = f"![{caption}]({src.format('compare.png')})\n*{caption}*"
    row = "| base | 1 | 32 | 27.50 ± 3.54 | 110 | ref. |"
    assert note.startswith("**sweep old**") and compare in note and row in note
    assert note.index(compare) < note.index(row) < note.index(src.format("val_error.png"))
    shown = re.findall(r"!\[[^]]*\]\(get-artifact\?path=([^&]+)&", note)
    assert shown == ["compare.png", "val_error.png", "final_error_vs_batch.png", "loss_lr.png"]
    assert set(shown) <= {a.path for a in c.list_artifacts(parent.run_id)}
    # no per-label metric (each would be a chart of one bar), no logged images
    assert run.data.metrics == {}
    assert not c.list_artifacts(parent.run_id, "images")
    assert run.data.params["sweep.seeds"] == "0,1"


def _write_simulated(uri: str) -> None:
    """The noise-scale sweep's two cells as training logs them: one process of 16 (4)
    simulated workers of 16 images, images/s 300 (200)."""
    c = MlflowClient(tracking_uri=uri)
    exp = c.create_experiment("mxlarge")
    parent = tracking.sweep_parent(uri, "mxlarge", "sim", {"sweep.seeds": "0"}, "grid")
    for label, k, ips in (("16x (16 workers x 16)", 16, 300.0), ("4x (4 workers x 16)", 4, 200.0)):
        params = {"data.batch_size": "16", "dist.simulate_workers": str(k),
                  "dist.bn_stats": "reduce", "optim.base_lr": "0.1", "plan.workers": "1",
                  "plan.devices_per_worker": "1", "plan.simulated_workers": str(k),
                  "plan.world_size": str(k), "plan.global_batch": str(16 * k),
                  "plan.peak_lr": str(0.1 * k)}
        run = c.create_run(exp, tags={"sweep": "sim", "sweep_label": label, "seed": "0",
                                      "mlflow.parentRunId": parent.run_id}).info.run_id
        c.log_batch(run, params=[Param(key, v) for key, v in params.items()], metrics=[
            Metric(key, v, 0, 10) for key, v in (("train/epoch", 1.0), ("val/error_top1", 0.1),
                                               ("val/accuracy", 0.9),
                                               ("perf/images_per_sec", ips))])
        c.set_terminated(run, "FINISHED")
    parent.end(True)


@pytest.mark.timeout(240)
def test_simulated_workers_are_the_tables_workers_and_one_label_is_the_reference(mlflow_uri):
    """A label of 16 simulated workers on one process shows 16 workers, not 1; of the two
    labels of one config the smaller world is the reference and the other a speedup against it
    (images/s 300 ÷ 200 = 1.5×, efficiency 1.5 ÷ (16 / 4) = 38%)."""
    from mxlarge.reporting.summary import summarize
    from mxlarge.reporting.tables import description_table, markdown_table

    _write_simulated(mlflow_uri)
    summary = summarize(load_sweep_runs(mlflow_uri, "mxlarge", "sim"), 0.99,
                        order=["16x (16 workers x 16)", "4x (4 workers x 16)"])
    table = description_table(summary)
    assert "| 16x (16 workers x 16) | 16 simulated | 256 | 10.00 ± n/a | 300 | 1.50× vs 4x " \
           "(4 workers x 16) |" in table
    assert "| 4x (4 workers x 16) | 4 simulated | 64 | 10.00 ± n/a | 200 | ref. |" in table
    big = markdown_table(summary).splitlines()[2]
    assert "| 1.50× vs 4x (4 workers x 16) | 38% | " in big
