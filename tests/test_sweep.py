"""The sweep file loader and the grid: messages, override order, shipped sweeps."""
from pathlib import Path

import pytest

from mxlarge.cli import main
from mxlarge.config import ConfigError
from mxlarge.sweep import cell_overrides, expand, load_sweep
from tests.helpers import write_yaml

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "experiments/proxy/digits-baseline.yaml"       # relative to the repository root
LARGE = "experiments/proxy/digits-largebatch.yaml"


@pytest.mark.parametrize("tree,message", [
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE}], "seeds": [0], "seed": 1},
     "unknown key 'seed' (did you mean 'seeds'?)"),
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE, "overide": []}], "seeds": [0]},
     "unknown key 'runs[0].overide' (did you mean 'runs[0].overrides'?)"),
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE}] * 2, "seeds": [0]},
     "runs[].label = 'a': expected labels that are unique"),
    ({"name": "x", "runs": [{"label": "a", "config": "nope.yaml"}], "seeds": [0]},
     "runs[0].config = 'nope.yaml': expected an existing file"),
    ({"name": "x y", "runs": [{"label": "a", "config": BASELINE}], "seeds": [0]},
     "name = 'x y'"),
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE}], "seeds": []}, "seeds = []"),
    ({"name": "x", "runs": [{"label": "a", "config": LARGE}], "seeds": [0]},
     "dist.kvstore = 'dist_sync': expected a local store in mode train"),
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE, "overrides": ["optim.lr=1"]}],
      "seeds": [0]}, "unknown key 'optim.lr'"),
    ({"name": "x", "runs": [{"label": "a", "config": BASELINE, "overrides": ["train.seed=1"]}],
      "seeds": [0]}, "the seed comes from 'seeds'"),
])
def test_bad_sweep_file_exits_2_naming_file_and_key(tmp_path, capsys, monkeypatch, tree,
                                                    message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    path = write_yaml(tmp_path / "bad.yaml", tree)
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err, err
    assert not (tmp_path / "mlruns.db").exists()


def test_report_of_unknown_sweep_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    assert main(["report", "nothing-here"]) == 2
    assert "no FINISHED run tagged sweep=nothing-here" in capsys.readouterr().err
    assert main(["report", "x", "--target-fraction", "1.5"]) == 2


def test_shipped_sweeps_expand_and_override_order():
    for path in sorted((ROOT / "experiments/sweeps").glob("*.yaml")):
        sweep = load_sweep(path)
        cells = expand(sweep)
        assert len(cells) == len(sweep.runs) * len(sweep.seeds)
        assert len({c.config_hash for c in cells}) == len(cells)
        assert [c.seed for c in cells[:len(sweep.seeds)]] == list(sweep.seeds)
    sweep = load_sweep(ROOT / "experiments/sweeps/digits-ablation.yaml")
    assert [r.label for r in sweep.runs] == ["baseline", "16x recipe", "16x no warmup",
                                             "16x constant warmup", "16x no LR scaling"]
    cells = expand(sweep, ["train.epochs=40"])
    big = [c for c in cells if c.label != "baseline"]
    assert all(c.cfg.data.batch_size == 256 and c.cfg.dist.kvstore == "local" for c in big)
    assert all(c.cfg.train.epochs == 40 and not c.cfg.train.progress for c in cells)
    assert cell_overrides(sweep, sweep.runs[1], ["a.b=1"], 7)[-2:] == ["a.b=1", "train.seed=7"]
    with pytest.raises(ConfigError, match="the seed comes from 'seeds'"):
        expand(sweep, ["train.seed=1"])



def test_precision_sweep_is_the_16x_recipe_as_launched_2_worker_jobs():
    sweep = load_sweep(ROOT / "experiments/sweeps/mnist1d-precision.yaml")
    assert [r.label for r in sweep.runs] == ["float32", "16-bit wire", "bfloat16 AMP"]
    assert sweep.mode == "launch" and sweep.seeds == (0, 1, 2, 3, 4)
    assert sweep.target.reference == "float32" and sweep.target.tolerance == 0.003
    cells = expand(sweep)
    from mxlarge.plan import world_of

    for c in cells:
        w = world_of(c.cfg)
        # 2 real workers x 256: the peers' accuracy twin (benchmarks/peer_accuracy_worker.py)
        assert (c.workers, c.servers, w.simulated, w.batch, w.global_batch) == (2, 1, 1, 256, 512)
        assert c.cfg.dist.kvstore == "dist_sync" and c.cfg.train.gns_every == 0
        precision = (c.cfg.dist.wire_dtype, c.cfg.train.amp)
        assert precision == {"float32": ("float32", "none"), "16-bit wire": ("float16", "none"),
                             "bfloat16 AMP": ("float32", "bfloat16")}[c.label]

@pytest.mark.slow
def test_processes_starting_on_a_new_sqlite_store_together_all_get_it(tmp_path):
    """The two ``--part``s of a sweep start on a fresh store together: MLflow's schema creation
    must not race (without the lock in ``tracking.client``, 3 of 4 processes failed with
    'table ... already exists' or an alembic migration error)."""
    import subprocess
    import sys

    uri = f"sqlite:///{tmp_path}/store/mlruns.db"
    code = ("import sys; from mxlarge import tracking; tracking.check_reachable(sys.argv[1]); "
            "print(tracking.client(sys.argv[1]).search_experiments()[0].name)")
    procs = [subprocess.Popen([sys.executable, "-c", code, uri], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    for rc, out, err in results:
        assert rc == 0, err.strip().splitlines()[-1]
        assert out.strip() == "Default"


def test_the_final_error_is_one_number_in_percent_on_console_report_and_mlflow(tmp_path):
    """The sweep's line, the report's table and the run's metric ``val/final_error_pct`` show
    the same final error, in percent (the unit the metric's name states)."""
    import dataclasses

    from mxlarge.reporting.runs import RunData
    from mxlarge.reporting.summary import summarize
    from mxlarge.reporting.tables import markdown_table
    from mxlarge.stats import final_error
    from mxlarge.sweep import CellOutcome, summary_line
    from mxlarge.tracking import best_and_final

    errors = [0.30, 0.05, 0.04, 0.0123, 0.02, 0.03]  # median of the last 5: 0.03
    logged = best_and_final(errors)["val/final_error_pct"]
    assert logged == pytest.approx(3.0)
    path = write_yaml(tmp_path / "s.yaml", {"name": "s", "runs": [{"label": "a", "config":
                                            str(ROOT / BASELINE)}], "seeds": [0]})
    (cell,) = expand(load_sweep(path))
    line = summary_line(CellOutcome(cell, "FINISHED", "r" * 32, 1.0, final_error(errors)), 1)
    rows = tuple({"train/epoch": float(i + 1), "val/error_top1": e, "val/accuracy": 1 - e}
                 for i, e in enumerate(errors))
    run = dataclasses.replace(RunData("r" * 32, "a", 0, workers=1), rows=rows)
    table = markdown_table(summarize([run], 0.99))
    assert f"final error {logged:.2f} %" in line
    assert f"| {logged:.2f} ± n/a |" in table
