"""The one-line migration: a GluonCV-style script (tests/gluon_script.py) with its
``gluon.Trainer`` line replaced by ``mxlarge.Trainer`` gives the recipe's update, eq. (9) with
the LR scaled to the global batch and warmed up, in one process and as 2 workers + 1 server."""
import difflib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_params

SCRIPT = Path(__file__).resolve().parents[1] / "gluon_script.py"
GLUON_LINE = ('trainer = gluon.Trainer(net.collect_params(), "sgd", optimizer_params, '
              'kvstore=kv)')
MXLARGE_LINE = ('import mxlarge; trainer = mxlarge.Trainer(net.collect_params(), "sgd", '
                'optimizer_params, kvstore=kv, reference_batch=8, warmup_steps=4)')
STEPS, N_REF, LR, M, WD, WARMUP, DROP = 12, 8, 0.05, 0.9, 5e-4, 4, 8


def _data(path: Path) -> tuple[np.ndarray, np.ndarray]:
    from mxlarge.data.digits import load_split

    x, y = load_split()[:2]
    x = x.reshape(len(x), -1).astype(np.float32)
    np.savez(path, x=x, y=y.astype(np.float32))
    return x, y.astype(int)


def _eq9(x, y, w0, b0, global_batch):
    """Goyal eq. (9) in float64 for softmax regression: u ← m·u + (g/B + λ·w), w ← w − η_t·u,
    η_t the MultiFactor schedule (÷10 after 8 updates) times B/8, warmed up linearly from
    0.05 over 4 updates; no decay on the bias (1-D)."""
    w, b = w0.astype(np.float64), b0.astype(np.float64)
    uw, ub = np.zeros_like(w), np.zeros_like(b)
    peak = LR * global_batch / N_REF

    def main(t):
        return peak * (0.1 if t >= DROP else 1.0)

    for t in range(STEPS):
        lr = LR + (main(WARMUP) - LR) * t / WARMUP if t < WARMUP else main(t)
        xb = x[t * global_batch:(t + 1) * global_batch].astype(np.float64)
        yb = y[t * global_batch:(t + 1) * global_batch]
        z = xb @ w.T + b
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(yb)), yb] -= 1.0
        uw = M * uw + (p.T @ xb / global_batch + WD * w)
        ub = M * ub + p.sum(axis=0) / global_batch
        w, b = w - lr * uw, b - lr * ub
    return w, b


def _run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def _weights(path):
    p = load_params(path)
    return p["weight"], p["bias"]


@pytest.mark.timeout(600)
def test_one_line_migration_gives_eq9_in_one_process_and_launched(tmp_path):
    source = SCRIPT.read_text()
    assert source.count(GLUON_LINE) == 1
    migrated = tmp_path / "script_mxlarge.py"
    migrated.write_text(source.replace(GLUON_LINE, MXLARGE_LINE))
    changed = [line for line in difflib.unified_diff(source.splitlines(),
                                                     migrated.read_text().splitlines(), n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-" + GLUON_LINE, "+" + MXLARGE_LINE]
    x, y = _data(tmp_path / "d.npz")
    common = ["--data", str(tmp_path / "d.npz"), "--steps", str(STEPS)]

    # one process, n = 16: global batch 16
    _run([sys.executable, str(migrated), *common, "--batch-size", "16",
          "--out", str(tmp_path / "one")], tmp_path)
    w0, b0 = _weights(tmp_path / "one-init.params")
    want = _eq9(x, y, w0, b0, 16)
    got = _weights(tmp_path / "one-0.params")
    for g, e in zip(got, want):
        assert float(np.abs(g - e).max()) <= 1e-5

    # 2 workers x 8 + 1 server: the same global batch, so the same weights on both ranks
    _run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1", "--",
          sys.executable, str(migrated), *common, "--kvstore", "dist_sync", "--batch-size", "8",
          "--out", str(tmp_path / "two")], tmp_path)
    np.testing.assert_array_equal(load_params(tmp_path / "two-init.params")["weight"], w0)
    ranks = [_weights(tmp_path / f"two-{r}.params") for r in range(2)]
    for g, e in zip(ranks[0], want):
        assert float(np.abs(g - e).max()) <= 1e-5
    for a, b in zip(*ranks):
        np.testing.assert_array_equal(a, b)

    # the unmodified script (stock gluon.Trainer: eq. (10), no scaling, no warmup) is not it
    _run([sys.executable, str(SCRIPT), *common, "--batch-size", "16",
          "--out", str(tmp_path / "gluon")], tmp_path)
    stock = _weights(tmp_path / "gluon-0.params")
    assert max(float(np.abs(g - e).max()) for g, e in zip(stock, want)) > 1e-3


@pytest.mark.timeout(600)
def test_migrated_loop_equals_mxlarge_train_on_the_same_data(tmp_path):
    """The Gluon-form Trainer in a script's own loop, launched as 2 workers x 8 + 1 server, and
    `mxlarge train` in one process with batch 16 (the same global batches, tests/e2e/test_dist),
    with the same schedule expressed both ways: MultiFactorScheduler(step=[10]) at 0.05 scaled
    by 16/8 and warmed up over 7 steps = the config's base_lr 0.05 at reference_batch 8,
    warmup 0.08 epochs and a drop at 0.12 epochs of 87 steps. Weights within 1e-5."""
    from tests.helpers import EQ_CONFIG, cli

    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG.replace("reference_batch: 16", "reference_batch: 8"))
    ref = cli(["train", str(cfg), "dist.kvstore=local", "dist.workers=1", "data.batch_size=16",
               f"train.save_params={tmp_path}/ref.params"], tmp_path)
    assert ref.returncode == 0, ref.stdout[-2000:] + ref.stderr[-3000:]
    _run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1", "--", sys.executable,
          str(SCRIPT.parent / "gluon_mxlarge_data_script.py"), str(cfg), "dist_sync",
          str(tmp_path / "mig")], tmp_path)
    want = load_params(tmp_path / "ref.params")
    for rank in range(2):
        got = load_params(tmp_path / f"mig-{rank}.params")
        assert got.keys() == want.keys()
        assert max(float(np.abs(got[n] - want[n]).max()) for n in want) <= 1e-5
