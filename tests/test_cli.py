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
