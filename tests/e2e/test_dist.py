"""dist_sync for real: scheduler, server and worker processes on 127.0.0.1 via `mxlarge launch`.

Each launch costs ~8 s here (mostly `import mxnet` in four processes on two cores).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from mxlarge.kvstore.fusion import piece_floats
from tests.helpers import BN_CONFIG, EQ_CONFIG, cli, dmlc_processes, load_params

HERE = Path(__file__).resolve().parents[1]  # tests/: the worker scripts live there
# k workers x n against one process with k·n: measured max |diff| 3.0e-8 (float rounding inside
# the reductions, see tests/e2e/test_simulate.py); ~7x margin.
ONE_PROCESS_TOL = 2e-7

@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("k", [2, 3])
def test_k_workers_equal_one_process_with_global_batch(tmp_path, k):
    """Weights after 12 steps through warmup and a decay, with momentum: k workers × n equal one
    process with k·n up to float rounding inside the reductions (measured max |diff| 3.0e-8 for
    k = 2 and 3; asserted <= 2e-7, which a corrupted first pull or a wrong scale exceeds by
    orders of magnitude), and the replicas are bitwise identical. Launched twice per k (4 in
    all) so that the first-step init/push race would show up."""
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    ref = cli(["train", str(cfg), "dist.kvstore=local", "dist.workers=1",
                f"data.batch_size={8 * k}", f"train.save_params={tmp_path}/ref.params"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-3000:]
    want = load_params(tmp_path / "ref.params")
    for attempt in range(2):
        out = tmp_path / f"k{k}-{attempt}"
        r = cli(["launch", str(cfg), "-n", str(k), "-s", "1",
                  f"train.save_params={out}-{{rank}}.params"], tmp_path)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        ranks = [load_params(f"{out}-{rank}.params") for rank in range(k)]
        for got in ranks:
            assert got.keys() == want.keys()
            diff = max(float(np.abs(got[n] - want[n]).max()) for n in want)
            assert diff <= ONE_PROCESS_TOL, (attempt, diff)
        for other in ranks[1:]:  # replicas identical bitwise
            for n in want:
                np.testing.assert_array_equal(other[n], ranks[0][n])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fused_and_per_key_push_pull_give_bitwise_identical_weights(tmp_path):
    """10 steps of a BN net (momentum, warmup, weight decay), 2 workers + 2 servers with arrays
    above 500 elements split over both servers: gradients fused into buckets of 2 KiB (several
    buckets, big tensors alone) and into one 4 MiB bucket give bitwise the same weights on
    every rank as one key per tensor; so do buckets of 512 bytes with the tensors over 2 · 128
    floats in pieces (as on several hosts: ``MXLARGE_PIECES=1``), exchanged concurrently
    through aliases of the gradient (:mod:`mxlarge.kvstore.pieces`), with the exchange order
    measured or set (``MXLARGE_LEAD``: 30% or none of the bytes in backward order, the rest
    after backward in forward order, :mod:`mxlarge.kvstore.order`)."""
    cfg = tmp_path / "fuse.yaml"
    cfg.write_text(BN_CONFIG.replace("max_steps: 12", "max_steps: 10"))
    weights = {}
    for fusion, pieces, lead in ((0, "0", ""), (2048, "0", ""), (4 << 20, "0", ""),
                                 (512, "1", ""), (512, "1", "0.3"), (2048, "1", "0")):
        out = tmp_path / f"f{fusion}-{pieces}-{lead}"
        env = {"MXNET_KVSTORE_BIGARRAY_BOUND": "500", "MXLARGE_PIECES": pieces,
               "MXLARGE_LEAD": lead}
        r = cli(["launch", str(cfg), "-n", "2", "-s", "2", f"dist.fusion_bytes={fusion}",
                 f"train.save_params={out}-{{rank}}.params"], tmp_path, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        weights[fusion, pieces, lead] = [load_params(f"{out}-{rank}.params") for rank in range(2)]
    ref = weights[0, "0", ""][0]
    assert any(np.abs(ref[n]).sum() > 0 for n in ref)
    assert sum(ref[n].size > piece_floats(2, 512 // 4, True) for n in ref) >= 2
    for fusion, ranks in weights.items():
        for got in ranks:
            assert got.keys() == ref.keys()
            for n in ref:
                np.testing.assert_array_equal(got[n], ref[n], err_msg=f"{fusion} {n}")


@pytest.mark.timeout(300)
def test_bn_net_weights_identical_statistics_local_and_reduced(tmp_path):
    """Also with 2 servers: MXNet's key-to-server hash overflows above key 215,330."""
    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG)
    r = cli(["launch", str(cfg), "-n", "2", "-s", "2", "dist.bn_stats=reduce",
              f"train.save_params={tmp_path}/bn-{{rank}}.params"], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shared = [load_params(tmp_path / f"bn-{i}.params") for i in range(2)]
    local = [load_params(tmp_path / f"bn-{i}.params.local") for i in range(2)]
    stats = [n for n in local[0] if "running_" in n]
    trained = [n for n in local[0] if "running_" not in n]
    assert stats and any(n.endswith("gamma") for n in trained)
    for n in trained:  # weights, gamma, beta: bitwise equal across ranks
        np.testing.assert_array_equal(local[0][n], local[1][n])
    # each worker's BN statistics are its own ...
    assert any(not np.array_equal(local[0][n], local[1][n]) for n in stats)
    # ... and `reduce` evaluates/checkpoints with their mean, on every rank
    for n in stats:
        np.testing.assert_allclose(shared[0][n], (local[0][n] + local[1][n]) / 2, rtol=1e-6,
                                   atol=1e-7)
        np.testing.assert_array_equal(shared[0][n], shared[1][n])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("bn_stats", ["local", "reduce"])
def test_bn_statistics_are_never_exchanged_as_parameters(tmp_path, bn_stats):
    """At init every trained parameter is pulled once (rank 0's initial values) and no BN
    statistic is (each worker keeps its own, loaded ones included); during training no statistic
    is pushed or pulled under its parameter key, and only `reduce` exchanges statistics, on
    their own keys, once per evaluation."""
    from mxlarge.kvstore.fusion import FUSE_KEY
    from mxlarge.kvstore.sync import STAT_KEY
    from mxlarge.launcher import run_local

    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG.replace("max_steps: 12", "max_steps: 6")
                   .replace("check_every: 1", f"check_every: 0, bn_stats: {bn_stats}"))
    with open(tmp_path / "log.txt", "w") as log:
        outcome = run_local([sys.executable, str(HERE / "scripts" / "dist_worker.py"), str(cfg),
                             str(tmp_path)], workers=2, servers=1, output=log)
    assert outcome.exit_code == 0, (tmp_path / "log.txt").read_text()[-3000:]
    for rank in range(2):
        rec = json.loads((tmp_path / f"keys-{rank}.json").read_text())
        roles = rec["roles"]
        stat_idx = {i for i, r in enumerate(roles) if r["local_stat"]}
        pushed_idx = {i for i, r in enumerate(roles) if r["pushed"]}
        assert stat_idx and pushed_idx
        # init: one pull of every parameter key but the statistics'; nothing pushed
        assert sorted(rec["pulled_init"]) == sorted(set(range(len(roles))) - stat_idx)
        assert rec["pushed_init"] == []
        # training: statistics never under their parameter keys, in either direction, nor
        # inside a fused bucket
        assert not (set(rec["pushed_train"]) | set(rec["pulled_train"])) & stat_idx
        travelled = {i for b in rec["buckets"] if b["key"] in rec["pushed_train"]
                     for i in b["members"]}
        assert not travelled & stat_idx
        assert travelled == pushed_idx  # every gradient went through the store
        for direction in ("pushed_train", "pulled_train"):
            stat_keys = [k for k in rec[direction] if STAT_KEY <= k < FUSE_KEY]
            if bn_stats == "local":
                assert stat_keys == []
            else:  # only for evaluation (one per epoch; 1 epoch here), each statistic once
                assert sorted(stat_keys) == sorted(STAT_KEY + i for i in stat_idx)


KILL_CONFIG = """
name: kill
data: {dataset: digits, batch_size: 16}
model: {name: small_resnet, width: 8}
optim: {base_lr: 0.05, reference_batch: 16, warmup: none, decay: none}
train: {epochs: 200, progress: false}
dist: {kvstore: dist_sync, workers: 2}
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", ["worker", "server"])
def test_kill_9_takes_the_job_down_and_marks_the_run_failed(tmp_path, victim):
    cfg = tmp_path / "kill.yaml"
    cfg.write_text(KILL_CONFIG)
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(cfg),
                             "-n", "2", "-s", "1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 90
        target = None
        while time.time() < deadline and target is None:
            for pid in dmlc_processes(str(tmp_path)):
                try:
                    env_b = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:
                    continue
                if f"DMLC_ROLE={victim}".encode() in env_b:
                    target = pid
                    break
            time.sleep(0.5)
        assert target is not None, "job did not start"
        seen = []  # let training run: until rank 0's first progress line
        for line in proc.stdout:
            seen.append(line)
            if re.search(r"\] step \d+/", line):
                break
        os.kill(target, signal.SIGKILL)
        killed_at = time.time()
        out, _ = proc.communicate(timeout=60)
        out = "".join(seen) + out
        took = time.time() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert took < 30, took
    # the killed process by role and launch index, not just the word (the banner names every
    # role); and the job's own verdict line
    assert re.search(rf"^mxlarge: job failed: {victim} \d+(?: \(launch \d+\))? exited with "
                     r"signal 9 \(SIGKILL\)$", out, re.M), out[-2000:]
    time.sleep(0.5)
    assert dmlc_processes(str(tmp_path)) == []
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("mxlarge").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    tags = runs[0].data.tags
    assert tags["failed_role"] == victim
    # the evidence: where and when it failed, and its last lines as the launcher printed them
    index = int(tags["failed_launch_index"])
    assert tags["failed_host"] == socket.gethostname()
    assert int(tags["failed_step"]) >= 1  # killed after rank 0's first progress line
    # the kvstore rank: a worker's from its heartbeat, the only server's is 0
    assert tags["failed_kvstore_rank"] in (("0", "1") if victim == "worker" else ("0",))
    name = f"{victim}-{tags['failed_kvstore_rank']}"
    log = client.download_artifacts(runs[0].info.run_id, f"failure/{name}.log", str(tmp_path))
    head, *lines = Path(log).read_text().splitlines()
    # named by its kvstore rank, with its launch index in brackets where they differ
    m = re.match(rf"# ({victim} \d+(?: \(launch {index}\))?) exited with signal 9 \(SIGKILL\); "
                 "its last", head)
    assert m, head
    label = m.group(1)
    printed = [x[len(f"[{label}] "):] for x in out.splitlines() if x.startswith(f"[{label}] ")]
    # after the launcher's view (lines "# ..."), its output as printed
    assert [x for x in lines if not x.startswith("# ")] == printed[-200:]
    # beside the evidence, the ranks' picture the launcher drew from their heartbeats
    assert [a.path for a in client.list_artifacts(runs[0].info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launched_demo_job_is_one_finished_mlflow_run(tmp_path):
    """What `make demo` does, shortened: one run, params and rank-suffixed throughput."""
    demo = HERE.parent / "experiments/proxy/digits-largebatch.yaml"
    r = cli(["launch", str(demo), "-n", "2", "-s", "1", "train.epochs=3",
              "optim.decay_epochs=[1,2]", "optim.warmup_epochs=1", "train.progress=false"],
             tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "final validation accuracy" in r.stdout and "FINISHED" in r.stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([client.get_experiment_by_name("mxlarge").experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["dist.kvstore"] == "dist_sync"
    assert run.data.params["dist.workers"] == "2"
    assert run.data.params["plan.world_size"] == "2"
    assert run.data.params["plan.global_batch"] == "256"
    steps = 1400 // 256
    hist = client.get_metric_history(run.info.run_id, "val/accuracy")
    assert [m.step for m in hist] == [steps, 2 * steps, 3 * steps]
    per_rank = [client.get_metric_history(run.info.run_id, f"perf/images_per_sec_rank{rank}")
                for rank in (0, 1)]
    assert [len(h) for h in per_rank] == [3, 3]
    # the global rate is measured: the sum of both workers' own rates (summed in float32), not
    # rank 0's rate x 2
    glob = client.get_metric_history(run.info.run_id, "perf/images_per_sec")
    for g, a, b in zip(sorted(glob, key=lambda m: m.step), *(sorted(h, key=lambda m: m.step)
                                                             for h in per_rank)):
        assert g.step == a.step == b.step
        assert g.value == pytest.approx(a.value + b.value, rel=1e-6)
        assert a.value != b.value  # two clocks: equality would hide a rank-0-times-2 rule
    arts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "final.params", "training_curves.png"} <= arts


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_mxnet_tools_launch_py_runs_the_same_job(tmp_path):
    """MXNet's own launch.py (through the 3.11 compatibility layer) with `mxlarge train` as the
    command: scheduler and server roles start from that command, result as with mxlarge launch."""
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    ref = cli(["train", str(cfg), "dist.kvstore=local", "dist.workers=1", "data.batch_size=16",
                f"train.save_params={tmp_path}/ref.params"], tmp_path)
    assert ref.returncode == 0, ref.stderr[-2000:]
    cmd = (f"{sys.executable} -m mxlarge.cli train {cfg} "
           f"train.save_params={tmp_path}/ml-{{rank}}.params")
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher.mxnet_launch", "-n", "2", "-s",
                        "1", "--launcher", "local", cmd], cwd=tmp_path, capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    want = load_params(tmp_path / "ref.params")
    for rank in (0, 1):
        got = load_params(tmp_path / f"ml-{rank}.params")
        assert max(float(np.abs(got[n] - want[n]).max()) for n in want) <= ONE_PROCESS_TOL
    time.sleep(0.5)
    assert dmlc_processes(str(tmp_path)) == []
