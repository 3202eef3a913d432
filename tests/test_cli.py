"""CLI polish, in process: --version, help without RST, show --explain, launchers that work."""
from pathlib import Path

import pytest

from mxlarge import __version__
from mxlarge.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"mxlarge {__version__}"


def test_top_level_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":data:" not in out
    assert "mxlarge show   --explain KEY" in out and "exit status: 0 done" in out
    assert "sge" not in out and "yarn" not in out


def test_show_explain_prints_the_field_doc(capsys):
    assert main(["show", "--explain", "optim.base_lr"]) == 0
    assert capsys.readouterr().out.strip() == ("optim.base_lr: reference LR, valid at "
                                               "reference_batch (default: 0.1)")
    assert main(["show", "--explain", "optim.base_l"]) == 2
    assert "did you mean 'optim.base_lr'" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["sge", "yarn"])
def test_broken_launchers_are_refused_with_the_reason(name, capsys):
    with pytest.raises(SystemExit) as e:
        main(["launch", str(ROOT / "experiments/proxy/digits-largebatch.yaml"),
              "--launcher", name])
    assert e.value.code == 2
    assert f"'{name}' is not supported: dmlc_tracker's {name} backend" in capsys.readouterr().err


def test_make_clean_removes_mlflow_artifacts():
    clean = (ROOT / "Makefile").read_text().split("clean:", 1)[1].splitlines()[1]
    assert {"mlruns", "mlruns.db"} <= set(clean.split())


LOCAL = ["dist.kvstore=local", "dist.workers=1", "dist.check_every=0"]


def test_train_world_is_the_world_it_trains_in(tmp_path, capsys):
    """`train --world 1x1x2x8` (what a launcher passes) trains exactly as the config's own
    `dist.simulate_workers=2`: bitwise the same weights and per-unit BN statistics."""
    import glob

    from tests.helpers import BN_CONFIG, load_params

    cfg = tmp_path / "w.yaml"
    cfg.write_text(BN_CONFIG)
    assert main(["train", str(cfg), *LOCAL, f"train.save_params={tmp_path}/w-{{rank}}.params",
                 "--world", "1x1x2x8"]) == 0
    assert ("done: 12 steps on 1 worker(s) x 2 simulated worker(s) x 8 images = global batch "
            "16") in capsys.readouterr().out
    assert main(["train", str(cfg), *LOCAL, "dist.simulate_workers=2",
                 f"train.save_params={tmp_path}/c-{{rank}}.params"]) == 0
    saved = sorted(glob.glob(f"{tmp_path}/w-*"))
    assert len(saved) == 4  # 2 units x (weights, own BN statistics)
    for path in saved:
        a, b = load_params(path), load_params(path.replace("/w-", "/c-"))
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


@pytest.mark.parametrize("world,message", [
    ("2x1", "--world '2x1': expected PROCESSESxDEVICESxSIMULATEDxBATCH, four integers >= 1 "
            "(e.g. 2x1x1x32)"),
    ("1x1x2x9", "--world 1x1x2x9: data.batch_size = 8 in the config, 9 in the world; expected "
                "8 (a world changes only the processes and simulated workers)"),
    ("2x1x1x8", "--world 2x1x1x8: 2 processes, expected 1 with dist.kvstore = 'local' (a local "
                "store trains in one process)"),
])
def test_train_refuses_a_world_that_cannot_run_in_one_line(tmp_path, capsys, world, message):
    from tests.helpers import EQ_CONFIG

    cfg = tmp_path / "w.yaml"
    cfg.write_text(EQ_CONFIG)
    assert main(["train", str(cfg), *LOCAL, "--world", world]) == 2
    assert capsys.readouterr().err == f"mxlarge: error: {message}\n"
