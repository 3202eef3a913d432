"""Every shipped experiment loads; the ImageNet ones derive the paper's numbers and run 2 steps."""
import subprocess
import sys
from pathlib import Path

import pytest

from mxlarge.config import derive, load_config
from mxlarge.schedulers import from_config
from tests.datagen import make_imagenet

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = sorted([*(ROOT / "experiments/proxy").glob("*.yaml"),
                      *(ROOT / "experiments/imagenet").glob("*.yaml")])
IMAGENET = 1_281_167


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_every_experiment_loads(path):
    cfg = load_config(path)
    assert cfg.name


@pytest.mark.parametrize("name,machines,peak", [("baseline-256", 1, 0.1),
                                                ("mxnet-128gpu-4k", 16, 1.6),
                                                ("goyal-8k", 32, 3.2)])
def test_imagenet_derived_numbers(name, machines, peak):
    """The real layouts: one worker per machine driving 8 GPUs, 32 images per GPU."""
    cfg = load_config(ROOT / f"experiments/imagenet/{name}.yaml")
    assert cfg.dist.workers == machines and cfg.dist.devices == 8
    assert cfg.dist.device_type == "gpu" and cfg.data.batch_size == 32
    workers = machines * 8
    assert cfg.model.name == "resnet50_v1b" and cfg.optim.weight_decay == 1e-4
    assert not cfg.optim.decay_bn_bias and cfg.model.zero_gamma
    d = derive(cfg, cfg.dist.workers, cfg.data.train_samples)
    assert d.train_samples == IMAGENET
    assert d.global_batch == 32 * workers
    assert d.peak_lr == pytest.approx(peak)
    spe = IMAGENET // (32 * workers)
    assert d.steps_per_epoch == spe
    assert d.decay_steps == (30 * spe, 60 * spe, 80 * spe)
    s = from_config(cfg, d)
    if cfg.optim.warmup == "none":
        assert d.warmup_steps == 0 and s(0) == pytest.approx(peak)
    else:
        assert d.warmup_steps == 5 * spe
        assert s(0) == pytest.approx(0.1) and s(d.warmup_steps) == pytest.approx(peak)
    assert s(d.decay_steps[0]) == pytest.approx(peak / 10)
    assert s(d.decay_steps[2]) == pytest.approx(peak / 1000)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["baseline-256", "mxnet-128gpu-4k", "goyal-8k"])
def test_imagenet_experiment_runs_two_steps_on_tiny_recordio(tmp_path, name):
    paths = make_imagenet(tmp_path, num_train=24, num_val=8, num_classes=4)
    r = subprocess.run(
        [sys.executable, "-m", "mxlarge.cli", "train",
         str(ROOT / f"experiments/imagenet/{name}.yaml"),
         f"data.train_rec={paths['train_rec']}", f"data.val_rec={paths['val_rec']}",
         "data.train_samples=null", "data.num_classes=4", "data.batch_size=4",
         "data.image_size=32", "data.resize=36", "data.threads=1", "dist.kvstore=local",
         "dist.workers=1", "dist.devices=1", "dist.device_type=cpu", "train.max_steps=2",
         "train.progress=false", "tracking.enabled=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done: 2 steps on 1 worker(s)" in r.stdout


@pytest.mark.timeout(400)
def test_128_gpu_math_simulated_on_one_box(tmp_path):
    """`simulate_workers=128` on the 128-GPU experiment: 2 real steps of 128 micro-batches."""
    paths = make_imagenet(tmp_path, num_train=260, num_val=8, num_classes=4)
    r = subprocess.run(
        [sys.executable, "-m", "mxlarge.cli", "train",
         str(ROOT / "experiments/imagenet/mxnet-128gpu-4k.yaml"),
         f"data.train_rec={paths['train_rec']}", f"data.val_rec={paths['val_rec']}",
         "data.train_samples=null", "data.num_classes=4", "data.batch_size=1",
         "data.image_size=32", "data.resize=36", "data.threads=1", "dist.kvstore=local",
         "dist.workers=1", "dist.devices=1", "dist.device_type=cpu", "dist.simulate_workers=128",
         "train.max_steps=2", "train.progress=false",
         "tracking.enabled=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=380)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "done: 2 steps on 1 worker(s) simulating 128 workers" in r.stdout
