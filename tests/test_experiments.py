"""Every shipped experiment loads; the ImageNet ones derive the paper's numbers and run 2 steps."""
from pathlib import Path

import pytest

from mxlarge.config import load_config
from mxlarge.plan import plan_for

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
    d = plan_for(cfg)  # the data is not at hand: N comes from data.train_samples
    assert (d.train_samples, d.samples_from) == (IMAGENET, "data.train_samples")
    assert d.world.processes == machines and d.world.units == workers
    assert d.global_batch == 32 * workers
    assert d.peak_lr == pytest.approx(peak)
    spe = IMAGENET // (32 * workers)
    assert d.steps_per_epoch == spe
    assert d.decay_steps == (30 * spe, 60 * spe, 80 * spe)
    s = d.schedule
    if cfg.optim.warmup == "none":
        assert d.warmup_steps == 0 and s(0) == pytest.approx(peak)
    else:
        assert d.warmup_steps == 5 * spe
        assert s(0) == pytest.approx(0.1) and s(d.warmup_steps) == pytest.approx(peak)
    assert s(d.decay_steps[0]) == pytest.approx(peak / 10)
    assert s(d.decay_steps[2]) == pytest.approx(peak / 1000)
