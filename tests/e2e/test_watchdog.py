"""The stall watchdog: its rules on real heartbeat files (with a test clock), then SIGSTOP of a
real worker of a launched `mxlarge launch` job."""
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

from mxlarge.launcher import heartbeat, watchdog
from mxlarge.launcher.heartbeat import Record
from mxlarge.launcher.watchdog import Watchdog
from tests.e2e.test_launcher import Collector, fakes  # noqa: F401  (fakes: fake ssh on PATH)
from tests.helpers import dmlc_processes

OWN_LOOP = Path(__file__).resolve().parents[1] / "own_loop.py"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def put(directory, rank, done, issued=None, here=None, phase="train", tick=1, pid=None):
    rec = Record(rank, "hostA", pid or 100 + rank, done, done if issued is None else issued,
                 done if here is None else here, phase, tick)
    heartbeat.path_for(directory, rank).write_bytes(rec.encode())


def advance(clock, dog, seconds):
    clock.t += seconds
    return dog.check()


def test_beat_writes_records_the_watchdog_reads(tmp_path):
    beat = heartbeat.Beat(tmp_path, rank=3, interval=0.05)
    beat.step(0, 7)      # first update issued at step 7 (a resumed worker)
    beat.step(7, 7)
    beat.step(7, 8)
    beat.step(8, 8)      # update 7 complete
    with beat.busy("evaluating"):
        time.sleep(0.3)  # the writer thread reports the phase
        rec = heartbeat.read_all(tmp_path)[3]
        assert (rec.phase, rec.done, rec.issued, rec.here) == ("evaluating", 8, 8, 1)
    time.sleep(0.3)
    rec = heartbeat.read_all(tmp_path)[3]
    assert rec.phase == "train" and rec.pid == os.getpid() and rec.tick > 3
    assert len(heartbeat.path_for(tmp_path, 3).read_bytes()) == heartbeat.SIZE


def test_not_armed_before_every_worker_completed_a_step(tmp_path):
    """The stall rule waits for every worker's first step: 90 s without progress at a 10 s
    timeout is no stall while rank 1's first step runs (the start limit is 100 s)."""
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 4, here=0)  # rank 1's first step (slow) is still running
    for _ in range(9):
        assert advance(clock, dog, 10) is None
    assert len(lines) == 1 and lines[0].startswith("warning: not every worker completed its "
                                                   "first step after 50 s")
    put(tmp_path, 1, 5, here=1)
    assert advance(clock, dog, 1) is None
    assert dog.armed


def test_a_start_that_never_completes_a_step_is_stopped_at_the_start_limit(tmp_path):
    """No hang before the first step: 10 x the timeout from the launch for every worker's first
    step, warned about at half; named: the rank past no step and the worker that never
    reported. Nothing reported at all (no mxlarge.Trainer): nothing judged."""
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path / "none", 3, 10, lines.append, clock)
    (tmp_path / "none").mkdir()
    for _ in range(30):
        assert advance(clock, dog, 10) is None
    assert lines == []

    dog = Watchdog(tmp_path, 3, 10, lines.append, clock)
    put(tmp_path, 0, 0, issued=0, here=0)  # rank 0 waits in its first push
    put(tmp_path, 1, 0, issued=-1, here=0, pid=4242)  # rank 1 never gets to its first step
    assert advance(clock, dog, 49) is None and lines == []
    assert advance(clock, dog, 1) is None and len(lines) == 1
    assert advance(clock, dog, 49) is None and len(lines) == 1
    stall = advance(clock, dog, 1)
    assert stall is not None and stall.behind == (0, 1)
    assert stall.message.startswith("stalled: not every worker completed its first step within "
                                    "100 s of the start (start limit 100 s = 10 x the stall "
                                    "timeout); behind: rank 0 on hostA (pid 100) has not "
                                    "completed a step; rank 1 on hostA (pid 4242)"), stall.message
    assert stall.message.endswith("1 worker(s) never reported (imports, data loading or "
                                  "creating the store)")


def test_stall_names_the_frozen_rank_after_a_warning_at_half(tmp_path):
    clock, lines = Clock(), []
    dog = Watchdog(tmp_path, 2, 10, lines.append, clock)
    put(tmp_path, 0, 5, issued=6, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 7):  # rank 0 waits in pull (its thread ticks), rank 1 is stopped
        put(tmp_path, 0, 5, issued=6, here=1, tick=tick)
        assert advance(clock, dog, 1.0) is None
    assert lines and "warning: no worker advanced for 5 s" in lines[0]
    assert "rank 1 at step 5 on hostA (pid 101)" in lines[0]
    for tick in range(7, 11):
        put(tmp_path, 0, 5, issued=6, here=1, tick=tick)
        assert advance(clock, dog, 1.0) is None
    stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == (1,) and stall.step == 5
    assert stall.message.startswith("stalled: no worker advanced for 10 s (stall timeout 10 s)")
    assert "rank 0" not in stall.message and len(lines) == 1


def test_lowest_issued_step_is_behind_when_all_tick(tmp_path):
    clock = Clock()
    dog = Watchdog(tmp_path, 3, 10, lambda line: None, clock)
    for r in range(3):
        put(tmp_path, r, 5, here=1)
    dog.check()
    for tick in range(2, 14):  # everyone alive; rank 2 has not pushed step 6
        for r in range(3):
            put(tmp_path, r, 5, issued=6 if r < 2 else 5, here=1, tick=tick)
        stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == (2,)
    for tick in range(14, 26):  # nobody behind: a server or the network
        for r in range(3):
            put(tmp_path, r, 5, issued=6, here=1, tick=tick)
        stall = advance(clock, dog, 1.0)
    assert stall is not None and stall.behind == ()
    assert "every worker waits at step 5: suspect a server" in stall.message


def test_busy_phase_gets_ten_timeouts(tmp_path):
    """A live busy worker (its heartbeat thread ticks): what the allowance is for."""
    clock = Clock()
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 93):  # 91 s busy: fine
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        assert advance(clock, dog, 1) is None
    for tick in range(93, 103):
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
    assert stall is not None and "busy: evaluating/checkpointing" in stall.message


def test_a_not_responding_worker_gets_no_busy_allowance(tmp_path):
    """Its last record says evaluating, but its heartbeat thread stopped: the plain timeout."""
    clock = Clock()
    dog = Watchdog(tmp_path, 2, 10, lambda line: None, clock)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    put(tmp_path, 1, 5, here=1, phase="evaluating/checkpointing", tick=2)
    for tick in range(2, 13):  # rank 0 alive and busy too; rank 1 never ticks again
        put(tmp_path, 0, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
    assert stall is not None and stall.behind == (1,), stall
    assert stall.message.startswith("stalled: no worker advanced for 10 s (stall timeout 10 s)")
    assert "worker rank 1 at step 5 on hostA (pid 101), not responding" in stall.message


def test_an_unreachable_host_is_named_and_ends_the_busy_allowance(tmp_path):
    """Every worker ticks and waits (the shared file system still carries a cut-off host's
    heartbeats): the probe names the host, in the warning at half and in the stall at the
    plain timeout although the workers say they are busy."""
    clock, lines, probes = Clock(), [], []

    def probe():
        probes.append(clock.t)
        return {"198.18.0.12": "no answer on port 22 within 2 s"}

    dog = Watchdog(tmp_path, 2, 10, lines.append, clock, probe=probe)
    put(tmp_path, 0, 5, here=1)
    put(tmp_path, 1, 5, here=1)
    dog.check()
    for tick in range(2, 13):  # the phase changed at 1001: nobody advanced since
        for r in (0, 1):
            put(tmp_path, r, 5, here=1, phase="evaluating/checkpointing", tick=tick)
        stall = advance(clock, dog, 1)
        if tick < 12:
            assert stall is None
    assert probes and probes[0] == 1006.0  # first probe at half the timeout
    assert "every worker waits at step 5: host 198.18.0.12 unreachable (no answer on port 22 " \
        "within 2 s)" in lines[0], lines
    assert stall is not None and "(stall timeout 10 s)" in stall.message
    assert "host 198.18.0.12 unreachable" in stall.message
    assert "suspect a server" not in stall.message


def test_default_timeout_is_20_median_steps_at_least_120_s(tmp_path):
    clock = Clock()
    dog = Watchdog(tmp_path, 1, None, lambda line: None, clock)
    put(tmp_path, 0, 0, here=0)
    dog.check()
    assert dog.timeout == watchdog.MIN_TIMEOUT
    for step in range(1, 6):  # 2 s per step
        put(tmp_path, 0, step, here=step, tick=step + 1)
        advance(clock, dog, 2.0)
    assert dog.timeout == 120.0
    for step in range(6, 20):  # 10 s per step: the median moves to 10 s
        put(tmp_path, 0, step, here=step, tick=step + 1)
        advance(clock, dog, 10.0)
    assert dog.timeout == 200.0


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
    assert re.search(r"warning: no worker advanced for \d+ s .*behind: rank \d at step \d+ on "
                     rf"\S+ \(pid {victim}\)", out), out[-3000:]
    assert re.search(r"stalled: no worker advanced for \d+ s \(stall timeout 20 s\); behind: "
                     rf"rank \d at step \d+ on \S+ \(pid {victim}\), not responding", out), \
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
    assert re.search(rf"stalled: .*behind: rank \d at step \d+ on \S+ \(pid {victim}\)", out), \
        out[-3000:]
    time.sleep(0.5)
    assert dmlc_processes(marker) == []


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.usefixtures("fakes")
def test_cluster_ssh_job_stall_is_caught_through_shared_heartbeat_files(tmp_path):
    """dmlc_tracker's ssh backend (fake ssh running the remote command locally in a clean
    environment): heartbeats travel through files in a directory shared with the launcher."""
    from mxlarge.launcher import cluster_submit

    marker = f"own-{os.getpid()}-{time.time_ns()}"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\n127.0.0.1\n")
    beats = tmp_path / "shared/hb"
    out = Collector()
    stopped: list[int] = []

    def stop_one() -> None:
        deadline = time.time() + 90
        while time.time() < deadline:
            rec = heartbeat.read_all(beats).get(0)
            if rec is not None and rec.done >= 20:
                os.kill(rec.pid, signal.SIGSTOP)
                stopped.append(rec.pid)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=stop_one, daemon=True)
    thread.start()
    try:
        rc = cluster_submit(
            "ssh", [sys.executable, str(OWN_LOOP), "--steps",
                    "100000", "--sleep-from", "0", "--sleep", "0.02"],
            workers=2, servers=1, hostfile=str(hosts),
            env={"MXLARGE_TEST_MARKER": marker, "PYTHONPATH": os.pathsep.join(sys.path)},
            extra={"host_ip": "127.0.0.1"}, output=out, grace=5.0, stall_timeout=10,
            heartbeat_dir=str(beats))
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
    assert not beats.exists()
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
