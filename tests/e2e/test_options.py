"""Options that were wired through but never run end to end: cosine and polynomial decay, and
``dist.bn_stats=broadcast`` on a launched job."""
import math

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import BN_CONFIG, cli, load_params

# digits: 1,400 training images; global batch 32 -> 43 steps per epoch, 4 epochs = 172 steps,
# 1 warmup epoch = 43 steps from 0.1 to the peak 0.1 * 32 / 16 = 0.2.
SCHEDULE_CONFIG = """
name: sched
data: {dataset: digits, batch_size: 32}
model: {name: small_plain, width: 4}
optim: {base_lr: 0.1, reference_batch: 16, warmup: linear, warmup_epochs: 1,
        decay: DECAY, poly_power: 3.0, momentum: 0.9, weight_decay: 0.0005}
train: {epochs: 4, log_every: 1, progress: false}
"""
PEAK, WARMUP_LR, WARMUP, TOTAL = 0.2, 0.1, 43, 172


def _expected(decay: str, t: int) -> float:
    """The closed forms, written out here rather than taken from mxlarge.schedulers."""
    if t < WARMUP:
        return WARMUP_LR + (PEAK - WARMUP_LR) * t / WARMUP
    x = (t - WARMUP) / (TOTAL - WARMUP)
    if decay == "cosine":
        return PEAK * (1 + math.cos(math.pi * x)) / 2
    return PEAK * (1 - x) ** 3.0


@pytest.mark.timeout(400)
@pytest.mark.parametrize("decay", ["cosine", "poly"])
def test_decay_schedule_through_the_config(tmp_path, mlflow_uri, decay):
    """Every step's LR in MLflow (metric ``train/lr`` at step t is update t's) equals the closed
    form: linear warmup, then cosine or (1 − x)^3 decay to 0 over the remaining steps."""
    cfg = tmp_path / "sched.yaml"
    cfg.write_text(SCHEDULE_CONFIG.replace("DECAY", decay))
    r = cli(["train", str(cfg)], tmp_path, timeout=380, env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mxlarge").experiment_id])
    got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/lr")}
    assert sorted(got) == list(range(TOTAL + 1))  # from step 0 (warmup's start) on
    for t in (0, 20, WARMUP - 1, WARMUP, 80, 107, 150, TOTAL - 1):
        assert got[t] == pytest.approx(_expected(decay, t), rel=1e-9, abs=1e-12), t
    assert got[TOTAL - 1] < 0.01 * PEAK  # decayed to (nearly) zero by the end


@pytest.mark.timeout(300)
def test_bn_stats_broadcast_gives_rank_0s_statistics(tmp_path):
    """Launched 2 workers: the final parameters of both ranks carry rank 0's own running
    statistics bitwise (and those differ from rank 1's)."""
    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG)
    r = cli(["launch", str(cfg), "-n", "2", "-s", "1", "dist.bn_stats=broadcast",
             f"train.save_params={tmp_path}/bn-{{rank}}.params"], tmp_path, timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shared = [load_params(tmp_path / f"bn-{i}.params") for i in range(2)]
    local = [load_params(tmp_path / f"bn-{i}.params.local") for i in range(2)]
    stats = [n for n in local[0] if "running_" in n]
    assert stats
    assert any(not np.array_equal(local[0][n], local[1][n]) for n in stats)
    for rank in range(2):
        for n in stats:
            np.testing.assert_array_equal(shared[rank][n], local[0][n])


# digits baseline for 4 epochs at batch 16 without decay (348 steps): without LARS it reaches
# 0.72 validation accuracy; LARS at its former default (gamma = the SGD LR 0.05) stayed at 0.10.
LARS_CONFIG = """
name: lars
data: {dataset: digits, batch_size: 16, augment: true}
model: {name: small_resnet, width: 16}
optim: {base_lr: 0.05, reference_batch: 16, warmup: none, decay: none, momentum: 0.9,
        weight_decay: 0.0005, lars: true, lars_lr: 5.0}
train: {epochs: 4, progress: false}
tracking: {enabled: false}
"""


@pytest.mark.timeout(400)
def test_lars_trains_with_its_global_lr(tmp_path):
    """``optim.lars=true`` with its own global LR trains digits past 60% in 4 epochs (measured
    0.82; chance is 0.10)."""
    cfg = tmp_path / "lars.yaml"
    cfg.write_text(LARS_CONFIG)
    r = cli(["train", str(cfg)], tmp_path, timeout=380)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    acc = float(r.stdout.rsplit("final validation accuracy ", 1)[1].split()[0])
    assert acc > 0.6, r.stdout[-2000:]
