"""The one plan: world arithmetic, the refusals, and `show` printing what runs."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mxlarge.cli import main
from mxlarge.config import Config, ConfigError, DistConfig, load_config
from mxlarge.plan import World, check_processes, plan, plan_for, world_of

ROOT = Path(__file__).resolve().parents[1]
README_128 = ["experiments/imagenet/mxnet-128gpu-4k.yaml", "dist.kvstore=local", "dist.workers=1",
              "dist.devices=1", "dist.device_type=cpu", "dist.simulate_workers=128"]


def test_world_arithmetic():
    w = World(processes=16, devices=8, simulated=1, batch=32)
    assert (w.units, w.per_process_batch, w.global_batch) == (128, 256, 4096)
    assert w.describe() == "16 worker(s) x 8 device(s) x 32 images = global batch 4096"
    s = World(processes=1, simulated=128, batch=32)
    assert (s.units, s.per_process_batch, s.global_batch) == (128, 4096, 4096)


def test_local_store_with_several_workers_is_refused_saying_what_to_set():
    cfg = dataclasses.replace(Config(), dist=DistConfig(kvstore="local", workers=16))
    with pytest.raises(ConfigError, match=r"dist.workers = 16: expected 1 with dist.kvstore = "
                                          r"'local'.*dist.simulate_workers=16"):
        world_of(cfg, "x.yaml")


def test_a_launched_worker_refuses_another_number_of_processes():
    with pytest.raises(ConfigError, match="dist.workers = 16, but this job has 2 worker process"
                                          r"\(es\): launch it with -n 16"):
        check_processes(World(processes=16), 2)
    check_processes(World(processes=2), 2)


def test_readme_128_gpu_command_prints_4096_and_1_6(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["show", *README_128, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["plan"]
    assert (p["global_batch"], p["world_size"], p["workers"]) == (4096, 128, 1)
    assert p["peak_lr"] == pytest.approx(1.6)
    assert p["train_samples"] == 1_281_167 and p["train_samples_from"] == "data.train_samples"


def test_show_refuses_the_old_128_gpu_command(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    old = [a for a in README_128 if a != "dist.workers=1"]
    assert main(["show", *old]) == 2
    assert "dist.workers = 16: expected 1 with dist.kvstore = 'local'" in capsys.readouterr().err


def test_launch_n_is_the_dist_workers_override():
    """`launch -n 3` against a file that declares 2 workers runs 3: the command line wins."""
    from mxlarge.launch_cli import launch_overrides

    path = ROOT / "experiments/proxy/digits-largebatch.yaml"
    cfg = load_config(path)
    assert cfg.dist.workers == 2
    launched = load_config(path, launch_overrides(cfg, 3, None))
    shown = load_config(path, ["dist.workers=3"])
    assert plan_for(launched) == plan_for(shown)
    assert plan_for(shown).world.processes == 3


def test_plan_is_pure_and_schedule_follows_it():
    cfg = load_config(ROOT / "experiments/imagenet/goyal-8k.yaml")
    a = plan(cfg, world_of(cfg), 1_281_167)
    assert a == plan(cfg, world_of(cfg), 1_281_167)
    assert (a.global_batch, a.steps_per_epoch, a.warmup_steps) == (8192, 156, 780)
    assert a.schedule(a.warmup_steps) == pytest.approx(a.peak_lr) == pytest.approx(3.2)


def test_noise_scale_of_one_contributor_is_refused():
    cfg = load_config(ROOT / "experiments/proxy/digits-baseline.yaml", ["train.gns_every=1"])
    with pytest.raises(ConfigError, match="needs 2 or more workers"):
        plan_for(cfg)
    assert plan_for(load_config(ROOT / "experiments/proxy/digits-baseline.yaml",
                                ["train.gns_every=1", "dist.simulate_workers=2"]))
