"""The ImageNet experiments run: 2 steps each on a tiny generated RecordIO set, and the 128-GPU
math simulated on one box."""
import subprocess
import sys
from pathlib import Path

import pytest

from mxlarge.data.tiny import make_imagenet

ROOT = Path(__file__).resolve().parents[2]


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
    assert "done: 2 steps on 1 worker(s) x 4 images = global batch 4" in r.stdout


@pytest.mark.slow
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
    assert ("done: 2 steps on 1 worker(s) x 128 simulated worker(s) x 1 images = global batch "
            "128") in r.stdout
