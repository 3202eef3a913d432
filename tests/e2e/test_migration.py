"""The one-line migration: a GluonCV-style script (tests/scripts/gluon_script.py) with its
``gluon.Trainer`` line replaced by ``mxlarge.Trainer`` gives the recipe's update, eq. (9) with
the LR scaled to the global batch and warmed up, in one process and as 2 workers + 1 server."""
import difflib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import load_params, one_script_run

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gluon_script.py"
GLUON_LINE = ('trainer = gluon.Trainer(net.collect_params(), opt.optimizer, optimizer_params, '
              'kvstore=kv)')
MXLARGE_LINE = ('import mxlarge; trainer = mxlarge.Trainer(net.collect_params(), opt.optimizer, '
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


# -- real-world shapes: a GluonCV-style script, a Horovod-style one, an unmodified one -----------
# Each launch is 2 workers + 1 server and checks several points of the drop-in promise at once.

HOROVOD = SCRIPT.parent / "horovod_script.py"
GLUONCV = ["--net", "conv-bn", "--hybridize", "--optimizer", "nag", "--lr-mode", "cosine",
           "--warmup-epochs", "1", "--epochs", "4", "--steps", "3", "--batch-size", "8"]
NOTE = "mxlarge.Trainer (kvstore rank 0 of 2): note: the update differs from gluon.Trainer's"
UNSHARDED = ("mxlarge.Trainer (kvstore rank 0 of 2): warning: the first gradients of all 2 "
             "workers are bitwise equal")


def _migrated(tmp_path, line, name="script_mxlarge.py"):
    path = tmp_path / name
    path.write_text(SCRIPT.read_text().replace(GLUON_LINE, line))
    return path


def _launch(args, cwd, timeout=120):
    """``python -m mxlarge.launcher -n 2 -s 1 -- ARGS``: (exit code, merged output)."""
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1", "--",
                        sys.executable, *map(str, args)], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def _trainable(params):
    return {k: v for k, v in params.items() if not k.endswith(("running_mean", "running_var"))}


def _assert_ranks_equal(prefix):
    """Weights, γ and β bitwise equal on both ranks (BN running statistics are per worker)."""
    ranks = [_trainable(load_params(f"{prefix}-{r}.params")) for r in range(2)]
    assert ranks[0].keys() == ranks[1].keys()
    for k in ranks[0]:
        np.testing.assert_array_equal(ranks[0][k], ranks[1][k], err_msg=k)
    return ranks[0]


def _assert_first_forward_used_rank0s_values(prefix, net, batch):
    """Rank 1's first forward ran with rank 0's initial values: its parameters then are rank
    0's (every worker seeded with its rank, so its own differ), and its output is what rank 0's
    parameters give on rank 1's batch (recomputed here, training mode)."""
    import mxnet as mx
    from mxnet import autograd

    first = [_trainable(load_params(f"{prefix}-first-{r}.params")) for r in range(2)]
    for k in first[0]:
        np.testing.assert_array_equal(first[1][k], first[0][k], err_msg=k)
    net.load_parameters(f"{prefix}-first-0.params")
    with autograd.record():
        want = net(mx.nd.array(batch)).asnumpy()
    np.testing.assert_allclose(np.load(f"{prefix}-out0-1.npy"), want, rtol=1e-5, atol=1e-6)


def _conv_bn_net():
    from mxnet import gluon

    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(8, 3, padding=1), gluon.nn.BatchNorm(), gluon.nn.Activation("relu"),
            gluon.nn.MaxPool2D(2), gluon.nn.Dense(10))
    return net


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gluoncv_style_script_deferred_init_nag_lrsequential_resume_launched(tmp_path):
    """GluonCV's shape (deferred init with BN, hybridized, NAG, LRSequential warmup + cosine,
    ``step(batch_size)``), only its Trainer line changed, 2 workers + 1 server: the first
    forward of every rank uses rank 0's values; the ranks end bitwise equal; rank 0 says once
    what differs from gluon.Trainer; sharded data draws no warning; ``optimizer.num_update`` is
    the count. Resumed at epoch 2 from mxlarge's own states file (``--resume-states``, a new
    launch, every rank from its own parameters): bitwise the 4-epoch run on every rank, schedule,
    momentum correction and each rank's BN running statistics included (the Trainer built
    after ``load_parameters`` keeps them)."""
    x, _ = _data(tmp_path / "d.npz")
    script = _migrated(tmp_path, MXLARGE_LINE.replace(", reference_batch=8, warmup_steps=4", ""))
    (tmp_path / "ckpt").mkdir()
    common = [script, "--data", tmp_path / "d.npz", "--kvstore", "dist_sync", *GLUONCV]
    code, out = _launch([*common, "--save-dir", tmp_path / "ckpt", "--out", tmp_path / "w"],
                        tmp_path)
    assert code == 0, out[-3000:]
    _assert_ranks_equal(tmp_path / "w")
    _assert_first_forward_used_rank0s_values(tmp_path / "w", _conv_bn_net(),
                                             x[8:16].reshape(8, 1, 8, 8))
    assert out.count(NOTE) == 1, out[-3000:]
    assert "[worker" in out.split(NOTE)[0].rsplit("\n", 1)[-1]
    assert UNSHARDED not in out
    epochs = [line.split("] ", 1)[1] for line in out.splitlines() if "[Epoch " in line]
    assert [e.split("num_update=")[1] for e in epochs] == ["3", "6", "9", "12"], out[-3000:]
    one_script_run(script.name, "nag")

    code, out2 = _launch([*common, "--resume-epoch", "2", "--resume-params",
                          tmp_path / "ckpt" / "e2-{rank}.params", "--resume-states",
                          tmp_path / "ckpt" / "e2.states", "--out", tmp_path / "r"], tmp_path)
    assert code == 0, out2[-3000:]
    _assert_ranks_equal(tmp_path / "r")
    for r in range(2):  # every rank, its own BN running statistics included
        resumed = load_params(tmp_path / f"r-{r}.params")
        want = load_params(tmp_path / f"w-{r}.params")
        assert resumed.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(resumed[k], want[k], err_msg=f"rank {r}: {k}")
    assert [line.split("] ", 1)[1] for line in out2.splitlines() if "[Epoch " in line] == \
        epochs[2:]


@pytest.mark.timeout(300)
def test_gluoncv_style_script_resumes_a_gluon_trainer_run_bitwise(tmp_path):
    """The unmodified script (gluon.Trainer, one process) 2 epochs, then the migrated one with
    ``momentum_correction=False, decay_bn_bias=True`` resumed from gluon's states file for 2
    more: bitwise gluon.Trainer's 4 epochs (the LRSequential warmup is not replayed)."""
    _data(tmp_path / "d.npz")
    (tmp_path / "ckpt").mkdir()
    opts = [*GLUONCV, "--optimizer", "sgd", "--lr-mode", "step"]
    _run([sys.executable, str(SCRIPT), "--data", str(tmp_path / "d.npz"), *map(str, opts),
          "--save-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "g")], tmp_path)
    script = _migrated(tmp_path, MXLARGE_LINE.replace(
        "reference_batch=8, warmup_steps=4", "momentum_correction=False, decay_bn_bias=True"))
    _run([sys.executable, str(script), "--data", str(tmp_path / "d.npz"), *map(str, opts),
          "--resume-epoch", "2", "--resume-params", str(tmp_path / "ckpt" / "e2.params"),
          "--resume-states", str(tmp_path / "ckpt" / "e2.states"), "--out", str(tmp_path / "m")],
         tmp_path)
    want, got = load_params(tmp_path / "g-0.params"), load_params(tmp_path / "m-0.params")
    assert want.keys() == got.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.timeout(300)
def test_horovod_style_script_with_its_own_store_and_unsharded_data(tmp_path):
    """A Horovod-style migration: its own ``mx.kv.create('dist')`` for rank and size and
    ``kvstore='dist_sync'`` to the Trainer (the same synchronous store to MXNet; it hangs in a
    second store's barrier: mxlarge reuses the process's); a deferred, non-hybridized net
    without BN; every worker reads the whole dataset: rank 0 warns once, naming the fix; the
    ranks stay bitwise equal. Horovod's ``--fp16-allreduce`` runs the 16-bit wire."""
    from mxnet import gluon

    x, _ = _data(tmp_path / "d.npz")
    code, out = _launch([HOROVOD, "--data", tmp_path / "d.npz", "--out", tmp_path / "h",
                         "--unsharded", "--fp16-allreduce"], tmp_path, timeout=120)
    assert code == 0, out[-3000:]
    assert out.count("done, wire float16") == 2, out[-3000:]  # --fp16-allreduce: 16-bit wire
    _assert_ranks_equal(tmp_path / "h")
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(32, activation="relu"), gluon.nn.Dense(10))
    _assert_first_forward_used_rank0s_values(tmp_path / "h", net, x[:16])
    assert out.count(UNSHARDED) == 1, out[-3000:]
    warning = next(line for line in out.splitlines() if UNSHARDED in line)
    assert "num_parts=trainer.num_workers, part_index=trainer.rank" in warning
    assert "SplitSampler" in warning
    one_script_run(Path(HOROVOD).name, "sgd")


@pytest.mark.timeout(300)
def test_unmodified_script_under_the_launcher_is_told_no_worker_joined(tmp_path):
    """The unmodified script (gluon.Trainer, local store) under the launcher: every worker
    trains alone and exits 0; the launcher says at once that no worker joined the parameter
    server (not "did not exit within 30 s"), exit 1, every launcher line once."""
    import time

    _data(tmp_path / "d.npz")
    started = time.monotonic()
    code, out = _launch([SCRIPT, "--data", tmp_path / "d.npz", "--steps", "2",
                         "--out", tmp_path / "u"], tmp_path)
    assert time.monotonic() - started < 25, out[-3000:]
    assert code == 1, out[-3000:]
    launcher_lines = [line for line in out.splitlines() if line.startswith("[launcher]")
                      and not line.startswith("[launcher] MLflow run ")]
    assert len(launcher_lines) == len(set(launcher_lines)) == 2, out[-3000:]
    assert launcher_lines[1].startswith("[launcher] no worker joined the parameter server: "
                                        "all 2 workers exited 0"), out[-3000:]
    assert "did not exit within" not in out


@pytest.mark.timeout(300)
def test_horovod_style_script_asking_for_another_dist_store_is_refused_at_once(tmp_path):
    """The script's own 'dist' store and ``kvstore='dist_device_sync'`` to the Trainer, run
    through MXNet's launch.py (``python -m mxlarge.launcher.mxnet_launch --launcher local``):
    the refusal naming both stores (MXNet would hang in the second store; the first worker to
    fail ends the job, so the other may not get to print it), the wrapper
    exits with the workers' status within seconds, and no process of the job is left."""
    import time

    _data(tmp_path / "d.npz")
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher.mxnet_launch", "-n", "2", "-s",
                        "1", "--launcher", "local", sys.executable, str(HOROVOD), "--data",
                        str(tmp_path / "d.npz"), "--out", str(tmp_path / "h"),
                        "--trainer-kvstore", "dist_device_sync"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    code, out = r.returncode, r.stdout + r.stderr
    assert time.monotonic() - started < 40, out[-3000:]
    assert code == 1, out[-3000:]
    assert out.count("InputError: kvstore 'dist_device_sync': this process already has a "
                     "'dist' store and MXNet hangs creating a second one") >= 1, out[-3000:]
    assert "[launcher] worker " in out and "stopping the job" in out, out[-3000:]
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
