"""The strict loader: each bad input gets one message naming file, key, value and expectation."""
import dataclasses
import json
from pathlib import Path

import pytest

from mxlarge.config import ConfigError, load_config
from mxlarge.plan import plan, world_of
from mxlarge.schedulers import scaled_lr
from tests.config import GOOD, write

ROOT = Path(__file__).resolve().parents[2]


def _error(tmp_path, text, overrides=()):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(p, overrides)
    msg = str(info.value)
    assert str(p) in msg, msg
    return msg


BAD = [
    # (yaml, overrides, fragments the message must contain)
    ("data: {dataset: digits, batch_sise: 16}\n", (), ["unknown key 'data.batch_sise'",
                                                      "did you mean 'data.batch_size'"]),
    ("data: {batch_size: -3}\n", (), ["data.batch_size = -3", "an integer >= 1"]),
    ("data: {batch_size: 0}\n", (), ["data.batch_size = 0", ">= 1"]),
    ("data: {batch_size: sixteen}\n", (), ["data.batch_size = 'sixteen'", "an integer"]),
    ("optim: {base_lr: -0.1}\n", (), ["optim.base_lr = -0.1", "> 0"]),
    ("optim: {base_lr: .nan}\n", (), ["optim.base_lr", "finite"]),
    ("train: {epochs: 0}\n", (), ["train.epochs = 0", ">= 1"]),
    ("data: {dataset: mnist}\n", (), ["data.dataset = 'mnist'", "one of digits, synthetic"]),
    ("dist: {kvstore: horovod}\n", (), ["dist.kvstore = 'horovod'", "one of local, device"]),
    ("model: {zero_gamma: yes please}\n", (), ["model.zero_gamma", "true or false"]),
    ("data: {scale: [0.08]}\n", (), ["data.scale = [0.08]", "a list of 2 numbers"]),
    ("optim: {decay_epochs: [60, 30]}\ntrain: {epochs: 90}\n", (),
     ["optim.decay_epochs = [60.0, 30.0]", "increasing"]),
    ("optim: {decay_epochs: [30, 95]}\ntrain: {epochs: 90}\n", (),
     ["optim.decay_epochs", "before the last epoch"]),
    ("data: {dataset: cifar10}\n", (), ["data.root = None", "directory"]),
    ("data: {dataset: imagenet}\n", (), ["data.train_rec = None", ".rec"]),
    ("optimizer: {base_lr: 0.1}\n", (), ["unknown key 'optimizer'", "did you mean 'optim'"]),
    ("data: [1, 2]\n", (), ["data = [1, 2]", "a mapping"]),
    ("data: {dataset: digits\n", (), ["malformed YAML", "line"]),
    (GOOD, ["optim.base_lr=abc"], ["optim.base_lr = 'abc'", "a number"]),
    (GOOD, ["optim.momentum=1.5"], ["optim.momentum = 1.5", "< 1"]),
    (GOOD, ["optim.nosuch=1"], ["unknown key 'optim.nosuch'"]),
    (GOOD, ["dist.compression=2bit"], ["dist.compression = '2bit'", "dist store"]),
]


@pytest.mark.parametrize("text,overrides,fragments", BAD)
def test_bad_config_messages(tmp_path, text, overrides, fragments):
    msg = _error(tmp_path, text, overrides)
    for frag in fragments:
        assert frag in msg, msg


def test_bad_override_syntax(tmp_path):
    p = write(tmp_path, GOOD)
    with pytest.raises(ConfigError, match="expected KEY.PATH=VALUE"):
        load_config(p, ["optim.base_lr"])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_good_config_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["optim.base_lr=0.2", "optim.decay_epochs=[1,2]"])
    assert cfg.optim.base_lr == 0.2 and cfg.optim.decay_epochs == (1.0, 2.0)
    assert cfg.data.batch_size == 16 and cfg.train.epochs == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.optim.base_lr = 1.0


def test_batch_that_does_not_fit_the_data(tmp_path):
    cfg = load_config(write(tmp_path, GOOD), ["data.batch_size=800"])
    with pytest.raises(ConfigError, match=r"global batch 1600 is larger than the 1400"):
        plan(cfg, dataclasses.replace(world_of(cfg), processes=2), 1400, source="exp.yaml")


def test_scaling_rules():
    assert scaled_lr(0.1, 256, 8192, "linear") == pytest.approx(3.2)
    assert scaled_lr(0.1, 256, 1024, "sqrt") == pytest.approx(0.2)
    assert scaled_lr(0.1, 256, 8192, "none") == 0.1


def test_cli_bad_config_exits_2_and_writes_nothing(tmp_path, run_cli):
    p = write(tmp_path, "optim: {momentun: 0.9}\n")
    before = sorted(tmp_path.iterdir())
    r = run_cli(["train", p], cwd=tmp_path)
    assert r.returncode == 2
    assert "unknown key 'optim.momentun'" in r.stderr
    assert "did you mean 'optim.momentum'" in r.stderr
    assert sorted(tmp_path.iterdir()) == before  # no mlruns.db, no outputs


def test_cli_show_json_plan(tmp_path, run_cli):
    r = run_cli(["show", ROOT / "experiments/proxy/digits-baseline.yaml", "--json",
                 "--lr-at", "0,1305"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    d = out["plan"]
    assert d["global_batch"] == 16 and d["steps_per_epoch"] == 1400 // 16
    assert d["lr_at"]["0"] == pytest.approx(0.05) and d["lr_at"]["1305"] == pytest.approx(0.005)
    assert out["param_roles"]["local_stats"] > 0
    assert out["config"]["data"]["dataset"] == "digits"


@pytest.mark.parametrize("text", ["5e-4", "1e-4", "1E-3", ".5e-1"])
def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path, text):
    cfg = load_config(write(tmp_path, GOOD), [f"optim.weight_decay={text}"])
    assert cfg.optim.weight_decay == float(text)
    cfg = load_config(write(tmp_path, GOOD + f"model: {{fc_init_std: {text}}}\n"))
    assert cfg.model.fc_init_std == float(text)
    with pytest.raises(ConfigError, match="optim.weight_decay = 'x1e-4': expected a number"):
        load_config(write(tmp_path, GOOD), ["optim.weight_decay=x1e-4"])


def test_output_dir_is_gone(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'tracking.output_dir'"):
        load_config(write(tmp_path, GOOD), ["tracking.output_dir=x"])


def test_cli_dist_store_without_a_launcher_is_one_line(tmp_path, run_cli):
    r = run_cli(["train", write(tmp_path, GOOD), "dist.kvstore=dist_sync",
                 "tracking.enabled=false"], cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "needs a launched job" in r.stderr and "mxlarge launch" in r.stderr
