"""The study section of `mxlarge report`: target from the sweep file, Welch marks, MLPerf."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from mxlarge import stats
from mxlarge.config import ConfigError
from mxlarge.reporting import study
from mxlarge.reporting.plots import plot_study
from mxlarge.reporting.runs import RunData
from mxlarge.reporting.summary import summarize
from mxlarge.reporting.tables import largest_within, render_markdown, study_markdown
from mxlarge.sweep import cell_tags, expand
from mxlarge.sweep_file import sweep_from_dict

ROOT = Path(__file__).resolve().parents[2]
TARGET = json.dumps({"reference": "1x recipe", "tolerance": 0.003})


def _run(label, seed, batch, errors, steps_per_epoch, gns=(), start=0):
    rows = tuple({"train/epoch": float(e + 1), "step": float((e + 1) * steps_per_epoch),
                  "val/error_top1": err, "perf/train_seconds": 2.0 * (e + 1)}
                 for e, err in enumerate(errors))
    return RunData(run_id=f"{label}-{seed}".ljust(32, "0"), label=label, seed=seed,
                   start_time=start, global_batch=batch, peak_lr=0.05 * batch / 32, rows=rows,
                   gns=tuple(gns), sweep_target=TARGET)


def _sweep(**target):
    tree = {"name": "s", "runs": [{"label": "1x recipe",
                                   "config": "experiments/proxy/mnist1d-recipe.yaml"}],
            "seeds": [0]}
    if target:
        tree["target"] = target
    return sweep_from_dict(tree, "s.yaml", ROOT)


def test_sweep_target_is_validated_and_written_on_every_run():
    sweep = _sweep(reference="1x recipe", tolerance=0.003)
    assert (sweep.target.reference, sweep.target.tolerance) == ("1x recipe", 0.003)
    cell = expand(sweep)[0]
    assert json.loads(cell_tags(sweep, cell)["sweep_target"]) == {"reference": "1x recipe",
                                                                  "tolerance": 0.003}
    assert "sweep_target" not in cell_tags(_sweep(), cell)
    with pytest.raises(ConfigError, match=r"s.yaml: target.reference = 'base': expected one of "
                                          r"the run labels: 1x recipe"):
        _sweep(reference="base", tolerance=0.01)
    with pytest.raises(ConfigError, match=r"s.yaml: target.tolerance = 2: expected a number "
                                          r">= 0 and < 1"):
        _sweep(reference="1x recipe", tolerance=2)
    with pytest.raises(ConfigError, match="unknown key 'target.tol'"):
        _sweep(reference="1x recipe", tol=0.1)


def _study_runs():
    runs = []
    # 1x: final errors 0.010..0.014 (median of the last 5 = the value held over the last epochs)
    for s in range(5):
        e = 0.010 + 0.001 * s
        runs.append(_run("1x recipe", s, 32, [0.5, 0.1, 0.02] + [e] * 5, 100))
    # 16x recipe: reaches the target (0.012 + 0.003 = 0.015) at epoch 3 or 4, one seed never
    for s in range(5):
        e = 0.013 + 0.0005 * s if s < 4 else 0.03
        early = [0.5, 0.2, 0.014, 0.014] if s % 2 else [0.5, 0.2, 0.03, 0.014]
        runs.append(_run("16x recipe", s, 512, early + [e] * 5, 7,
                         gns=[(i, 500.0 + i) for i in range(20)]))
    for s in range(5):
        runs.append(_run("16x no warmup", s, 512, [0.9] * 4 + [0.05 + 0.001 * s] * 5, 7))
    return runs


def test_rows_target_versus_welch_and_mlperf():
    runs = _study_runs()
    target = study.target_from_runs(runs)
    assert target.reference == "1x recipe"
    assert target.error == pytest.approx(0.012 + 0.003)
    rows = {r.label: r for r in study.rows(runs, target, ["16x no warmup", "1x recipe"])}
    assert list(rows) == ["1x recipe", "16x recipe", "16x no warmup"]  # by batch, recipe first
    one, big, nowarm = rows["1x recipe"], rows["16x recipe"], rows["16x no warmup"]
    assert one.versus is None and big.versus == "1x recipe" and nowarm.versus == "16x recipe"
    assert one.final_errors == pytest.approx([0.010, 0.011, 0.012, 0.013, 0.014])
    assert one.interval == pytest.approx(stats.t_interval(one.final_errors))
    w = stats.welch(nowarm.final_errors, big.final_errors)
    assert nowarm.test == w and w.p < 0.01
    # 1x reaches 0.015 at epoch 4 (step 400) in every seed
    assert (one.steps.value, one.epochs.value, one.steps.reached) == (400, 4, 5)
    # 16x: odd seeds at epoch 3 (21 steps), even seeds at epoch 4 (28), seed 4 included although
    # its final error misses: 28, 21, 28, 21, 28 -> drop a 21 and a 28 -> mean(21, 28, 28)
    assert big.steps.value == pytest.approx(statistics.fmean([21, 28, 28]))
    assert big.steps.reached == 5
    assert nowarm.steps.value is None and nowarm.steps.why == "not reached by 5 of 5 runs"
    # B_simple: per run the median after the first 10% (2 of 20 points), median over seeds
    assert big.b_simple == pytest.approx(statistics.median([500.0 + i for i in range(2, 20)]))
    assert one.b_simple is None


def test_markdown_and_plot(tmp_path):
    runs = _study_runs()
    target = study.target_from_runs(runs)
    rows = study.rows(runs, target, [])
    text = "\n".join(study_markdown(rows, target))
    assert "validation error ≤ **1.50%** = mean final error of '1x recipe' + 0.30 points" in text
    assert "| 16x no warmup | 512 | n/a | 0.8 | 5 |" in text
    assert "not reached by 5 of 5 runs" in text and "**" in text
    assert "| 1x recipe | 32 | n/a | 0.05 | 5 | 1.20 ± 0.16 |" in text
    plot_study(rows, tmp_path / "study.png", "t")
    assert (tmp_path / "study.png").stat().st_size > 10_000
    md = render_markdown("s", summarize(runs, 0.99), runs, [], {}, [], text)
    assert md.index("## Study") < md.index("## How the numbers are computed")


def test_no_target_no_study():
    runs = [RunData(run_id="a" * 32, label="x", seed=0)]
    assert study.target_from_runs(runs) is None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_with_target_reports_the_study_end_to_end(tmp_path):
    import os
    import subprocess
    import sys

    import yaml

    recipe = "experiments/proxy/mnist1d-recipe.yaml"
    tiny = ["train.progress=false", "train.epochs=2", "optim.warmup_epochs=1",
            "optim.decay_epochs=[1]", "data.mnist1d_train=640", "data.mnist1d_val=160",
            f"data.cache_dir={tmp_path}", "model.width=4"]
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "st", "runs": [
            {"label": "1x recipe", "config": recipe},
            {"label": "4x recipe", "config": recipe,
             "overrides": ["dist.simulate_workers=4", "train.gns_every=1"]},
            {"label": "1x LR 1e4", "config": recipe,
             "overrides": ["optim.base_lr=10000", "optim.warmup=none"]}],
        "seeds": [0], "overrides": tiny,
        "target": {"reference": "1x recipe", "tolerance": 0.05}}))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns.db"}

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "mxlarge.cli", *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=280)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        return r.stdout

    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "sweep", str(sweep)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=280)
    assert r.returncode == 1 and "1x LR 1e4, seed 0: FAILED" in r.stdout, r.stdout[-2000:]
    assert "DivergenceError: training diverged" in r.stdout
    out = run("report", "st", "--out", "rep")
    text = (tmp_path / "rep/report.md").read_text()
    assert "## Study" in text and "mean final error of '1x recipe' + 5.00 points" in text
    assert "| 4x recipe | 128 |" in text and "only 1 run: MLPerf asks for 5" in text
    assert "| label | global batch | B_simple" in out  # printed too
    assert (tmp_path / "rep/study.png").stat().st_size > 10_000
    # the commit the runs were made at and the report's own, read from git here
    from mxlarge.tracking import git_commit

    head = git_commit()[:12]
    assert len(head) == 12
    assert f"Runs made at commit `{head}` (3 runs)." in text  # the diverged one too
    assert f"at commit `{head}`; summary run" in text
    assert "**Where the recipe holds** (mean final error within 5.00 points" in text
    # the diverged run is a result: in the study, never reaching the target, named in the notes
    assert "| 1x LR 1e4 | 32 | n/a | 1e+04 | 1 | diverged (1 of 1) |" in text
    assert "(1x LR 1e4, seed 0) is FAILED: diverged (training diverged at step" in text


def test_sweep_parts_are_disjoint_and_cover_the_grid():
    from mxlarge.sweep import load_sweep, select_part

    cells = expand(load_sweep(ROOT / "experiments/sweeps/mnist1d-study.yaml"))
    assert len(cells) == 90
    parts = [select_part(cells, f"{i}/3") for i in (1, 2, 3)]
    keys = [(c.label, c.seed) for p in parts for c in p]
    assert sorted(keys) == sorted((c.label, c.seed) for c in cells)
    assert [c.index for c in parts[1]] == list(range(30))
    assert (parts[1][0].label, parts[1][0].seed) == (cells[1].label, cells[1].seed)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ConfigError, match=r"--part .*: expected I/N with integers"):
            select_part(cells, bad)


def test_sweep_label_filter(tmp_path, monkeypatch, capsys):
    from mxlarge.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    path = str(ROOT / "experiments/sweeps/mnist1d-study.yaml")
    assert main(["sweep", path, "--label", "16x LARS", "--label", "1x recipe", "--part", "2/2",
                 "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    # 10 cells in grid order (1x seeds 0-4, then 16x LARS), numbered within the selection;
    # part 2/2 takes every second one
    assert [x.split(",")[0:2] for x in lines] == [
        ["[1/5] 1x recipe", " seed 1"], ["[2/5] 1x recipe", " seed 3"],
        ["[3/5] 16x LARS", " seed 0"], ["[4/5] 16x LARS", " seed 2"],
        ["[5/5] 16x LARS", " seed 4"]]
    assert main(["sweep", path, "--label", "16x LARS", "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("[")]
    assert [x.split(",")[0] for x in lines] == [f"[{i}/5] 16x LARS" for i in range(1, 6)]
    assert main(["sweep", path, "--label", "2x recipe", "--dry-run"]) == 2
    assert "--label '2x recipe': expected one of the labels of" in capsys.readouterr().err


def test_largest_batch_within_the_tolerance_is_stated():
    runs = _study_runs()
    target = study.target_from_runs(runs)
    rows = study.rows(runs, target, [])
    # 16x recipe: mean of 0.013, 0.0135, 0.014, 0.0145, 0.03 = 0.017, 0.5 points above 1x's 0.012
    text = largest_within(rows, target)[0]
    assert "up to global batch **32** ('1x recipe')" in text
    assert "1x recipe (batch 32) +0.00 points, holds" in text
    assert "16x recipe (batch 512) +0.50 points, misses" in text
    assert text in "\n".join(study_markdown(rows, target))
    # with a 0.6-point tolerance 16x holds too
    wide = study.Target(target.reference, 0.006, target.error - target.tolerance + 0.006)
    assert "up to global batch **512** ('16x recipe')" in " ".join(largest_within(rows, wide))
    # the reference missing: no statement
    assert largest_within(rows, study.Target("1x recipe", 0.003, None)) == []



def test_variants_of_the_reference_are_compared_with_it():
    """Labels without a recipe at their batch (precision variants of one job) get their Welch
    test against the reference at the same batch, and no 'where the recipe holds' line."""
    ref = json.dumps({"reference": "float32", "tolerance": 0.003})
    runs = []
    for label, base in (("float32", 0.007), ("16-bit wire", 0.0072), ("bfloat16 AMP", 0.009),
                        ("at 1x", 0.005)):
        for s in range(5):
            run = _run(label, s, 32 if label == "at 1x" else 512,
                       [0.5, 0.2] + [base + 0.0005 * (s % 3)] * 5, 7)
            runs.append(dataclasses.replace(run, sweep_target=ref))
    target = study.target_from_runs(runs)
    rows = {r.label: r for r in study.rows(runs, target, [])}
    errors = {k: r.final_errors for k, r in rows.items()}
    assert rows["float32"].versus is None and rows["float32"].test is None
    for label in ("16-bit wire", "bfloat16 AMP"):
        assert rows[label].versus == "float32"
        assert rows[label].test == stats.welch(errors[label], errors["float32"])
    assert rows["at 1x"].versus is None  # another batch: nothing to compare with
    assert largest_within(list(rows.values()), target) == []
    text = "\n".join(study_markdown(list(rows.values()), target))
    assert "| 16-bit wire | 512 | n/a | 0.8 | 5 |" in text and "| float32 | +0.02 |" in text
    assert "Where the recipe holds" not in text

def test_diverged_runs_count_as_never_reaching_the_target(tmp_path):
    import dataclasses

    from mxlarge.reporting.runs import diverged_runs, select_runs

    runs = _study_runs()
    failed = dict(status="FAILED", rows=(), gns=())
    lars = [dataclasses.replace(_run("16x LARS", s, 512, [], 7, start=10), **failed,
                                diverged="training diverged at step 59")
            for s in range(5)]
    # seed 0 also has an older FAILED run without the tag (a crash): superseded, not counted
    crash = dataclasses.replace(_run("16x LARS", 0, 512, [], 7, start=5), **failed,
                                run_id="crash".ljust(32, "0"))
    # one of five 16x-no-warmup seeds diverged in an older run and FINISHED when re-run
    rerun = dataclasses.replace(runs[-1], run_id="old".ljust(32, "0"), start_time=-1, **failed,
                                diverged="training diverged at step 3")
    every = [*runs, *lars, crash, rerun]
    used, notes = select_runs(every)
    assert {r.run_id for r in diverged_runs(every)} == {r.run_id for r in lars}
    assert all(r.status == "FINISHED" for r in used)
    assert sum("diverged (training diverged at step 59)" in n for n in notes) == 5
    assert any(n.startswith("run crash000") and "no FINISHED run" in n for n in notes)
    assert any(n.startswith("run old00000") and "superseded" in n for n in notes)
    target = study.target_from_runs(used)
    rows = {r.label: r for r in study.rows([*used, *diverged_runs(every)], target, [])}
    row = rows["16x LARS"]
    assert (row.diverged, row.seeds, row.final_errors) == (5, (0, 1, 2, 3, 4), ())
    assert row.steps.value is None and row.steps.why == "not reached by 5 of 5 runs"
    assert row.versus == "16x recipe" and row.test is None
    assert rows["16x no warmup"].diverged == 0
    text = "\n".join(study_markdown(list(rows.values()), target))
    assert ("| 16x LARS | 512 | n/a | 0.8 | 5 | diverged (5 of 5) | n/a | 16x recipe | — | — |"
            in text)
    plot_study(list(rows.values()), tmp_path / "study.png")  # a row without final errors
    assert (tmp_path / "study.png").stat().st_size > 10_000
