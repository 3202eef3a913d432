"""The one plan: world arithmetic, the refusals, and `show` printing what runs."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from mxlarge.cli import main
from mxlarge.config import Config, ConfigError, DistConfig, load_config
from mxlarge.plan import (
    World,
    WorldError,
    check_processes,
    elastic_world,
    factorisations,
    plan,
    plan_for,
    same_math,
    with_world,
    world_of,
)

ROOT = Path(__file__).resolve().parents[1]
# the 128-GPU check on one box that docs/trainer.md gives ("Several devices, simulated workers")
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


def test_a_worker_refuses_a_store_of_another_size_naming_both_numbers():
    with pytest.raises(ConfigError, match=r"^x.yaml: the world has 16 worker process\(es\) "
                                          r"\(dist.workers\), but this job's store has 2: launch "
                                          r"it with -n 16, or set dist.workers=2$"):
        check_processes(World(processes=16), 2, "x.yaml")
    check_processes(World(processes=2), 2)


@pytest.mark.parametrize("world", [World(1), World(2, 1, 1, 32), World(16, 8, 1, 32),
                                   World(1, 1, 128, 32), World(3, 2, 5, 7)])
def test_a_world_round_trips_through_its_command_line_word(world):
    assert World.parse(world.to_arg()) == world
    assert World(2, 1, 1, 32).to_arg() == "2x1x1x32"


@pytest.mark.parametrize("text", ["", "2", "2x1x1", "2x1x1x32x1", "0x1x1x32", "2x1x1x-3",
                                  "2X1X1X32", "2x1.5x1x32", "two", "2x1x1x32 "])
def test_a_bad_world_word_is_refused_in_one_line_naming_it(text):
    with pytest.raises(ConfigError) as e:
        World.parse(text, "--world")
    assert str(e.value) == (f"--world {text!r}: expected PROCESSESxDEVICESxSIMULATEDxBATCH, four "
                            "integers >= 1 (e.g. 2x1x1x32)")


def test_with_world_sets_the_processes_and_simulated_workers_only():
    cfg = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml")
    world = World(1, cfg.dist.devices, 2 * cfg.dist.workers, cfg.data.batch_size)
    run = with_world(cfg, world)
    assert world_of(run) == world
    assert run == dataclasses.replace(cfg, dist=dataclasses.replace(
        cfg.dist, workers=1, simulate_workers=world.simulated))


@pytest.mark.parametrize("change,message", [
    ({"batch": 33}, "--world 2x1x1x33: data.batch_size = 32 in the config, 33 in the world; "
                    "expected 32 (a world changes only the processes and simulated workers)"),
    ({"devices": 2}, "--world 2x2x1x32: dist.devices = 1 in the config, 2 in the world; "
                     "expected 1 (a world changes only the processes and simulated workers)"),
])
def test_with_world_refuses_a_world_that_contradicts_the_config(change, message):
    cfg = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml", ["data.batch_size=32"])
    with pytest.raises(ConfigError) as e:
        with_world(cfg, dataclasses.replace(world_of(cfg), **change))
    assert str(e.value) == message


def test_with_world_keeps_the_configs_own_rules():
    cfg = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml", ["dist.devices=2"])
    with pytest.raises(ConfigError, match=r"^--world 1x2x2x\d+: dist.simulate_workers = 2: "
                                          "expected dist.devices = 1"):
        with_world(cfg, dataclasses.replace(world_of(cfg), processes=1, simulated=2))


def test_with_world_refuses_several_processes_on_a_local_store():
    cfg = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml",
                      ["dist.kvstore=local", "dist.workers=1"])
    assert with_world(cfg, World(1, 1, 4, cfg.data.batch_size)).dist.simulate_workers == 4
    with pytest.raises(ConfigError, match=r"^--world 2x1x1x\d+: 2 processes, expected 1 with "
                                          r"dist.kvstore = 'local' \(a local store trains in one "
                                          r"process\)$"):
        with_world(cfg, World(2, 1, 1, cfg.data.batch_size))


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


def test_launch_n_runs_what_show_prints_with_the_dist_workers_override():
    """`launch -n 3` against a file that declares 2 workers runs 3: the command line wins, and
    the world is a value (its workers get no `dist.workers=` text)."""
    from mxlarge.launch_cli import launch_config

    path = ROOT / "experiments/proxy/digits-largebatch.yaml"
    assert load_config(path).dist.workers == 2
    launched, world, overrides = launch_config(path, ["train.epochs=30"], 3, None)
    shown = load_config(path, ["train.epochs=30", "dist.workers=3"])
    assert launched == shown
    assert plan_for(launched, world=world) == plan_for(shown)
    assert world == plan_for(shown).world and world.processes == 3
    assert overrides == ["train.epochs=30"]  # a dist config: launching adds nothing to it
    _, _, local = launch_config(path, ["dist.kvstore=local"], None, 2)
    assert local == ["dist.kvstore=local", "dist.kvstore=dist_sync", "dist.servers=2"]


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


def test_show_warns_on_stderr_when_zero_gamma_skips_blocks(tmp_path, capsys):
    """Pre-activation blocks are left as built: `show` says so where the user looks."""
    cfg = tmp_path / "v2.yaml"
    cfg.write_text("model: {name: cifar_resnet20_v2}\n")
    assert main(["show", str(cfg), "--json"]) == 0
    out = capsys.readouterr()
    assert "mxlarge: warning: zero-gamma applies to 0 of 9 residual blocks" in out.err
    assert json.loads(out.out)["zero_gamma"]["blocks"] == 0
    cfg.write_text("model: {name: cifar_resnet20_v1}\n")
    assert main(["show", str(cfg)]) == 0
    out = capsys.readouterr()
    assert "warning" not in out.err and "zero_gamma: 9 of 9 residual blocks" in out.out


# -- world changes that keep the math (elastic restarts) ----------------------------------------
def test_same_math_is_units_and_per_unit_batch():
    assert same_math(World(2, batch=16), World(1, simulated=2, batch=16))
    assert same_math(World(4, batch=8), World(2, simulated=2, batch=8))
    assert same_math(World(2, batch=8), World(1, devices=2, batch=8))
    assert not same_math(World(2, batch=16), World(1, batch=32))  # same B, other BN batches
    assert not same_math(World(2, batch=16), World(1, simulated=3, batch=16))


def test_factorisations_keep_the_global_batch():
    w = World(4, simulated=3, batch=8)
    got = factorisations(w)
    assert [(f.processes, f.simulated) for f in got] == [
        (1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert {f.global_batch for f in got} == {w.global_batch}
    # simulated workers need one device: with 2 devices only simulated = 1 is a world
    assert factorisations(World(2, devices=2, batch=8)) == [World(2, devices=2, batch=8)]


def test_elastic_world_takes_the_most_live_workers_that_fit():
    assert elastic_world(World(2, batch=16), live=1) == World(1, simulated=2, batch=16)
    assert elastic_world(World(4, batch=8), live=3) == World(2, simulated=2, batch=8)
    assert elastic_world(World(4, batch=8), live=4) == World(4, batch=8)  # grown back
    assert elastic_world(World(3, batch=8), live=2) == World(1, simulated=3, batch=8)
    assert elastic_world(World(2, simulated=2, batch=8), live=1) == World(1, simulated=4,
                                                                          batch=8)


def test_elastic_world_refuses_below_the_floor_naming_the_factorisations():
    with pytest.raises(WorldError) as e:
        elastic_world(World(4, batch=8), live=3, min_workers=3)
    assert str(e.value) == (
        "no world keeps global batch 32 (4 units x 8 images) on 3 live worker host(s) with "
        "--min-workers 3: possible worker x simulated-worker factorisations are 1 x 4; 2 x 2; "
        "4 x 1")
    with pytest.raises(WorldError, match="on 0 live worker host"):
        elastic_world(World(2, batch=8), live=0)
    with pytest.raises(WorldError, match="2 x 1 x 2 devices"):  # devices: only simulated = 1
        elastic_world(World(2, devices=2, batch=8), live=1)


def test_show_prints_the_layout_with_the_bytes_each_worker_host_moves(capsys, monkeypatch):
    """`--server-hosts` is `dist.server_hosts` (what `show` reads); `show` gives each worker
    host |g| each way with server hosts and 2(n-1)/n·|g| co-located, |g| = 4 bytes per pushed
    element (2 on the 16-bit wire), and each of S server hosts n·|g|/S."""
    from mxlarge.launch_cli import launch_config

    monkeypatch.chdir(ROOT)
    path = "experiments/proxy/digits-largebatch.yaml"
    cfg, _, overrides = launch_config(path, [], 3, 2, "10.0.0.8, 10.0.0.9")
    assert cfg.dist.server_hosts == ("10.0.0.8", "10.0.0.9")
    assert overrides[-1] == "dist.server_hosts=[10.0.0.8,10.0.0.9]"
    with pytest.raises(ConfigError, match="--server-hosts ',': expected HOST"):
        launch_config(path, [], 3, None, ",")
    assert main(["show", path, "dist.workers=3", *overrides, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    g = 4 * out["param_roles"]["pushed_elements"]
    assert out["layout"] == {"servers": 2, "server_hosts": ["10.0.0.8", "10.0.0.9"],
                             "worker_host_bytes_each_way": g,
                             "colocated_bytes_each_way": int(2 * 2 / 3 * g),
                             "server_hosts_bytes_each_way": g,
                             "server_host_bytes_each_way": int(3 * g / 2)}
    assert main(["show", path, "dist.workers=3", "dist.wire_dtype=float16"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("layout:"))
    assert line == (f"layout: 1 server(s) co-located with the workers: each worker host sends "
                    f"and receives 2(n-1)/n·|g| = {4 / 3 * g / 2 / 1e6:.3g} MB per step (with "
                    f"server hosts, dist.server_hosts: |g| = {g / 2 / 1e6:.3g} MB)")


@pytest.mark.parametrize("warmup_lr", [None, 0.5])
def test_a_global_batch_below_the_reference_starts_the_warmup_at_the_scaled_lr(warmup_lr):
    """Global batch 2 workers x 64 = 128 against reference 256: peak 0.05, and the warmup
    never ramps down to it from base_lr 0.1 (or a warmup_lr above the peak); the plan
    carries the line."""
    over = ["optim.base_lr=0.1", "optim.reference_batch=256", "data.batch_size=64",
            "optim.warmup_epochs=1"]
    if warmup_lr is not None:
        over.append(f"optim.warmup_lr={warmup_lr}")
    cfg = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml", over)
    p = plan(cfg, world_of(cfg), 1280)
    assert p.peak_lr == pytest.approx(0.05) and p.warmup_lr == pytest.approx(0.05)
    lrs = [p.schedule(t) for t in range(p.warmup_steps + 2)]
    assert all(b >= a - 1e-12 for a, b in zip(lrs, lrs[1:])) and lrs[0] == pytest.approx(0.05)
    assert p.lr_note == ("the global batch of 128 is below the reference batch of 256: the LR "
                         "is scaled down 0.5x (linear scaling), from 0.1 to 0.05, and any "
                         "warmup starts there (it never ramps the LR down)")
    big = load_config(ROOT / "experiments/proxy/digits-largebatch.yaml",
                      [*over[:2], "data.batch_size=256", "optim.warmup_epochs=1"])
    up = plan(big, world_of(big), 5120)
    assert up.lr_note is None and up.warmup_lr == pytest.approx(0.1)
