"""The stall watchdog on real jobs: SIGSTOP of a real worker of a launched `mxlarge launch` job
(its rules with a test clock are tests/launcher/test_watchdog.py)."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.protocol import heartbeat
from tests.e2e.test_launcher import Collector, fakes  # noqa: F401  (fakes: fake ssh on PATH)
from tests.helpers import dmlc_processes

OWN_LOOP = Path(__file__).resolve().parents[1] / "scripts" / "own_loop.py"


STALL_CONFIG = """
name: stall
data: {dataset: digits, batch_size: 16}
model: {name: small_resnet, width: 4}
optim: {base_lr: 0.05, reference_batch: 16, warmup: none, decay: none}
train: {epochs: 200, progress: false, checkpoint_every: 1}
dist: {kvstore: dist_sync, workers: 2}
"""


def stop_rank_while_stepping(marker, rank, steps_per_epoch, deadline):
    """SIGSTOP the worker of kvstore rank ``rank`` mid-epoch (its heartbeat says so), not in
    its epoch-end hooks, where it may hold the MLflow sqlite lock the others need. Returns
    its pid."""
    pid = dmlc_processes(marker, "worker")[0]
    env = dict(kv.split("=", 1) for kv in
               Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    beats = env[heartbeat.ENV]
    while time.time() < deadline:
        rec = heartbeat.read_all(beats).get(rank)
        if rec is not None and rec.phase == "train" and 5 <= rec.done % steps_per_epoch <= 30:
            os.kill(rec.pid, signal.SIGSTOP)
            return rec.pid
        time.sleep(0.02)
    raise AssertionError("no moment to stop the worker")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigstop_of_a_worker_stops_the_job_named_and_failed(tmp_path):
    """The acceptance test: down within stall-timeout + 30 s, the stopped rank named, the run
    FAILED with failure=stalled, nothing left running. Checkpoints and evaluation run every
    epoch before the stop, and must not trip the short timeout."""
    cfg = tmp_path / "stall.yaml"
    cfg.write_text(STALL_CONFIG)
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    timeout = 20
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", str(cfg), "-n", "2",
                             "-s", "1", "--stall-timeout", str(timeout),
                             f"train.checkpoint_dir={tmp_path}/ck"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    try:
        deadline = time.time() + 150
        while time.time() < deadline and not (tmp_path / "ck/epoch-0002/meta.json").exists():
            time.sleep(0.2)
        assert (tmp_path / "ck/epoch-0002/meta.json").exists()
        victim = stop_rank_while_stepping(str(tmp_path), 1, 1400 // 32, deadline)
        stopped_at = time.time()
        out, _ = proc.communicate(timeout=timeout + 60)
        took = time.time() - stopped_at
    finally:
        if victim is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(victim, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 124, out[-3000:]
    assert took < timeout + 30, took
    assert re.search(r"warning: no worker advanced for \d+ s .*behind: worker rank \d at step "
                     rf"\d+ on \S+ \(pid {victim}\)", out), out[-3000:]
    assert re.search(r"stalled: no worker advanced for \d+ s \(stall timeout 20 s\); behind: "
                     rf"worker rank \d at step \d+ on \S+ \(pid {victim}\), not responding", out), \
        out[-3000:]
    assert out.count("stalled: no worker advanced") >= 1
    time.sleep(0.5)
    assert dmlc_processes(str(tmp_path)) == []
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("mxlarge").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FAILED"
    assert runs[0].data.tags["failure"] == "stalled"
    assert f"pid {victim}" in runs[0].data.tags["failure_detail"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_own_script_sigstop_is_caught_by_the_launcher(tmp_path):
    """A user's own script gets the watchdog through mxlarge.Trainer's heartbeat."""
    marker = f"own-{os.getpid()}-{time.time_ns()}"
    script = str(OWN_LOOP)
    env = {**os.environ, "MXLARGE_TEST_MARKER": marker}
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                             "--stall-timeout", "10", "--", sys.executable, script, "--steps",
                             "100000", "--sleep-from", "0", "--sleep", "0.02"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    try:
        for line in proc.stdout:
            if "own_loop rank=1 step=30" in line:
                break
        victim = dmlc_processes(marker, "worker")[0]
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.time()
        out = proc.communicate(timeout=90)[0]
        took = time.time() - stopped_at
    finally:
        if victim is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(victim, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 124, out[-3000:]
    assert took < 10 + 30
    assert re.search(rf"stalled: .*behind: worker rank \d at step \d+ on \S+ \(pid {victim}\)",
                     out), out[-3000:]
    time.sleep(0.5)
    assert dmlc_processes(marker) == []


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.usefixtures("fakes")
def test_cluster_ssh_job_stall_is_caught_through_shared_heartbeat_files(tmp_path, monkeypatch):
    """dmlc_tracker's ssh backend (fake ssh running the remote command locally in a clean
    environment): heartbeats travel through files in a directory shared with the launcher
    (``.mxlarge-heartbeat/<job id>`` in the launch directory, which ssh jobs cd to)."""
    from mxlarge.launcher import JobSpec, run_job
    from mxlarge.plan import World

    marker = f"own-{os.getpid()}-{time.time_ns()}"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n127.0.0.1\n")
    monkeypatch.chdir(tmp_path)
    out = Collector()
    stopped: list[int] = []

    def stop_one() -> None:
        deadline = time.time() + 90
        while time.time() < deadline:
            beats = next((tmp_path / ".mxlarge-heartbeat").glob("*"), None)
            rec = None if beats is None else heartbeat.read_all(beats).get(0)
            if rec is not None and rec.done >= 20:
                os.kill(rec.pid, signal.SIGSTOP)
                stopped.append(rec.pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stop_one, daemon=True)
    thread.start()
    try:
        rc = run_job(JobSpec(
            "ssh", [sys.executable, str(OWN_LOOP), "--steps",
                    "100000", "--sleep-from", "0", "--sleep", "0.02"],
            World(2), 1, hostfile=str(hosts),
            env={"MXLARGE_TEST_MARKER": marker, "PYTHONPATH": os.pathsep.join(sys.path)},
            host_ip="127.0.0.1", grace=5.0, stall_timeout=10), out).exit_code
    finally:
        thread.join(5)
        for pid in stopped:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
    text = out.text()
    assert stopped, text[-3000:]
    assert rc == 124, text[-3000:]
    assert re.search(rf"stalled: .*behind: worker rank 0 at step \d+ on \S+ \(pid {stopped[0]}\)",
                     text), text[-3000:]
    assert not any((tmp_path / ".mxlarge-heartbeat").glob("*"))  # the job's beats removed
    time.sleep(0.5)
    assert dmlc_processes(marker) == []


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_bad_stall_timeout_is_refused_before_anything_starts(tmp_path, value):
    option = ["--stall-timeout", value]
    for argv in (["-m", "mxlarge.cli", "launch", "cfg.yaml", "-n", "2", *option],
                 ["-m", "mxlarge.launcher", "-n", "2", *option, "--", "true"]):
        r = subprocess.run([sys.executable, *argv], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert f"--stall-timeout: expected seconds >= 0 (0 disables), got '{value}'" in r.stderr
        assert not list(tmp_path.iterdir())
