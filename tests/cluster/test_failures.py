"""Failures across hosts, 2 workers + 2 servers over h1, h2 (scheduler on h0): kill -9 of a
remote worker and of a remote server through each of ssh, mpirun and srun (two jobs at once on
the same hosts, one losing its worker, one its server); ``scancel`` of a batch job, SIGTERM to
``salloc`` (h2's link going down: ``test_partition.py``). Each time the launcher names role,
kvstore rank, host and cause (the signal, the termination) within seconds, the job is gone from
every host within 30 s (no process of it left in any namespace, the cut-off host included), and
its MLflow run is FAILED with those tags.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.protocol.heartbeat import read_all
from mxlarge.testbed import Testbed
from tests.cluster.observe import Job, Observer, Proc, start, wait_until

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]

# Long enough to be killed mid-training (200 epochs), small enough to start fast.
LONG_CONFIG = """
name: long
data: {{dataset: digits, batch_size: 16}}
model: {{name: small_resnet, width: 8}}
optim: {{base_lr: 0.05, reference_batch: 16, warmup: none, decay: none}}
train: {{epochs: 200, progress: false}}
dist: {{kvstore: dist_sync, workers: 2}}
tracking: {{enabled: true, uri: 'sqlite:///{work}/mlruns.db'}}
"""


def write_config(work: Path) -> Path:
    cfg = work / "long.yaml"
    cfg.write_text(LONG_CONFIG.format(work=work))
    return cfg


def anything_of(marker: str) -> list[int]:
    """Every live process whose argv or environment mentions ``marker`` (the job's directory):
    ps-lite processes, launchers, ssh clients and remote shells, mpirun/orted ranks, srun."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            seen = (d / "environ").read_bytes() + (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in seen and state != "Z":
            found.append(int(d.name))
    return found


def steps_done(work: Path) -> int:
    """The fewest steps a worker of the job in ``work`` has completed, as their heartbeats
    tell (0 until both report)."""
    for d in work.glob(".mxlarge-heartbeat/*"):
        records = read_all(d)
        if len(records) == 2:
            return min(r.done for r in records.values())
    return 0


def training(obs: Observer) -> list[Proc]:
    """Wait until both workers and both servers listen (ps-lite is up) and both workers have
    completed a few steps (their heartbeats)."""
    wait_until(lambda: len([p for p in obs.procs.values() if p.listen and p.role != "scheduler"])
               == 4, 150, "2 workers and 2 servers listening")
    wait_until(lambda: steps_done(Path(obs.marker)) >= 3, 60, "3 steps done by both workers")
    return list(obs.procs.values())


def wait_gone(work: Path, job: Job | None, since: float) -> float:
    wait_until(lambda: not anything_of(str(work)) and (job is None or job.proc.poll() is not None),
               60, f"the job to be gone (left: {anything_of(str(work))})")
    return time.monotonic() - since


def the_run(work: Path):  # type: ignore[no-untyped-def]
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, runs
    return runs[0]


def beat_rank(work: Path, pid: int) -> int:
    """The kvstore rank the heartbeat of worker ``pid`` states (the job's heartbeat files)."""
    for f in work.glob(".mxlarge-heartbeat/*/worker-*.json"):
        record = json.loads(f.read_bytes())
        if record["pid"] == pid:
            return int(record["rank"])
    raise AssertionError(f"no heartbeat of pid {pid}")


def wait_line(job: Job, pattern: str, since: float, timeout: float = 60) -> float:
    """Seconds from ``since`` until the job's output matches ``pattern``."""
    wait_until(lambda: re.search(pattern, job.text(), re.M), timeout,
               f"{pattern!r} in the output:\n{job.text()[-3000:]}")
    return time.monotonic() - since


def launch(testbed: Testbed, work: Path, launcher: str, *more: str,
           hostfile: str | None = None) -> tuple[Job, Observer]:
    obs = Observer(testbed, str(work))
    argv = [PY, "-m", "mxlarge.cli", "launch", str(write_config(work)), "-n", "2", "-s", "2",
            "--launcher", launcher, *more]
    if hostfile is not None:
        (work / "hosts").write_text(hostfile)
        argv += ["-H", str(work / "hosts")]
    if launcher == "slurm":
        argv = ["salloc", "-N", "2", "-w", "h1,h2", *argv]
    return start(testbed, "h0", argv, work), obs


def finish(job: Job, obs: Observer, work: Path) -> None:
    obs.stop()
    for pid in anything_of(str(work)):
        os.kill(pid, signal.SIGKILL)
    if job.proc.poll() is None:
        job.proc.kill()


SSH_HOSTS = "198.18.0.11\n198.18.0.12\n"


@dataclass
class Killed:
    """One of :func:`kill_a_worker_and_a_server`'s jobs after the kill."""

    work: Path
    job: Job
    victim: Proc
    line: re.Match[str]  # the launcher's line naming the killed process
    named: float  # seconds from the kill to that line
    took: float  # seconds from the kill until nothing of the job is left on any host


def kill_a_worker_and_a_server(testbed: Testbed, work: Path, launcher: str, line: str,
                               hostfile: str | None = None) -> dict[str, Killed]:
    """Two jobs of ``launcher`` at once on the same hosts, each in its own directory (so its
    Observer, heartbeats, MLflow store and :func:`anything_of` are its own; ps-lite picks the
    ports): once both train, the worker on h2 of the one and the server on h2 of the other get
    ``kill -9`` at the same moment. ``line`` is the pattern of the launcher's line naming the
    kill, with ``{role}`` (and, for a worker, ``{rank}``: its heartbeat's kvstore rank, ``\\d``
    for a server) in it. Returns each job by the role killed in it."""
    jobs: dict[str, tuple[Job, Observer]] = {}
    try:
        for role in ("worker", "server"):
            (work / role).mkdir()
            # both at once: the launchers claim their scheduler ports themselves
            # (mxlarge.launcher.cluster.claimed_scheduler_port)
            jobs[role] = launch(testbed, work / role, launcher, hostfile=hostfile)
        procs = {role: training(obs) for role, (_, obs) in jobs.items()}
        assert all(_environ_of(p.pid).get("PYTHONDONTWRITEBYTECODE") == "1"
                   for p in procs["worker"] + procs["server"] if p.role != "scheduler"), \
            "the launcher passes PYTHONDONTWRITEBYTECODE=1"
        victims = {role: next(p for p in procs[role] if p.role == role and p.host == "h2")
                   for role in jobs}
        ranks = {"worker": str(beat_rank(work / "worker", victims["worker"].pid)),
                 "server": r"\d"}
        patterns = {role: line.format(role=role, rank=ranks[role]) for role in jobs}
        killed = time.monotonic()
        for p in victims.values():
            os.kill(p.pid, signal.SIGKILL)
        named: dict[str, float] = {}  # seconds from the kill, each job's own
        took: dict[str, float] = {}
        while len(took) < len(jobs) or len(named) < len(jobs):
            now = time.monotonic() - killed
            for role, (job, _) in jobs.items():
                if role not in named and re.search(patterns[role], job.text(), re.M):
                    named[role] = now
                if role not in took and job.proc.poll() is not None \
                        and not anything_of(str(work / role)):
                    took[role] = now
            assert now < 60, (named, took, {r: j.text()[-3000:] for r, (j, _) in jobs.items()})
            time.sleep(0.2)
    finally:
        for role, (job, obs) in jobs.items():
            finish(job, obs, work / role)
    out = {}
    for role, (job, _) in jobs.items():
        print(f"{launcher} {role}: named after {named[role]:.1f} s, gone after "
              f"{took[role]:.1f} s")
        assert named[role] < 5 and took[role] < 30, (role, named, took, job.text()[-3000:])
        m = re.search(patterns[role], job.text(), re.M)
        assert m is not None
        out[role] = Killed(work / role, job, victims[role], m, named[role], took[role])
    return out


@pytest.mark.timeout(300)
def test_kill_9_of_a_remote_ssh_worker_and_server_is_named_with_the_signal(
        testbed: Testbed, work: Path) -> None:
    """ssh's status 255 hides the signal; the remote guard (mxlarge/launcher/probe.py) tells
    it. The kvstore rank is the heartbeat's (worker) or the scheduler's assignment (server)."""
    jobs = kill_a_worker_and_a_server(
        testbed, work, "ssh", r"^\[launcher\] {role} rank ({rank}) on 198\.18\.0\.12 killed by "
                              r"SIGKILL; stopping the job$", hostfile=SSH_HOSTS)
    for role, k in jobs.items():
        assert k.job.proc.returncode == 128 + 9
        assert "ssh could not connect" not in k.job.text()
        said = int(k.line.group(1))  # a worker's: its heartbeat's (the pattern)
        run = the_run(k.work)
        assert run.info.status == "FAILED"
        tags = run.data.tags
        assert (tags["failed_role"], tags["failed_rank"], tags["failed_kvstore_rank"],
                tags["failed_host"], tags["failed_status"]) == \
            (role, str(said), str(said), testbed.addr("h2"), "-9"), tags
        assert tags["failure"] == f"{role} rank {said} on 198.18.0.12 killed by SIGKILL", tags


@pytest.mark.timeout(300)
def test_kill_9_of_a_remote_mpi_server_and_worker(testbed: Testbed, work: Path) -> None:
    jobs = kill_a_worker_and_a_server(
        testbed, work, "mpi", r"^\[launcher\] {role} rank ({rank}) on h2 \({role}s via mpirun, "
                              r"mpi rank 1\) killed by SIGKILL",
        hostfile="h1 slots=1\nh2 slots=1\n")
    for role, k in jobs.items():
        assert k.job.proc.returncode != 0
        run = the_run(k.work)
        assert run.info.status == "FAILED"
        tags = run.data.tags
        # mpirun's report "process rank 1 with PID ... on node h2 exited on signal 9" + the
        # rank the scheduler assigned to the process on h2 (a worker's: its heartbeat's)
        assert (tags["failed_role"], tags["failed_host"], tags["failed_status"]) == \
            (role, "h2", "-9"), (tags, k.job.text()[-3000:])
        assert tags["failed_rank"] == k.line.group(1) in ("0", "1"), tags
        assert "killed by SIGKILL" in tags["failure"], tags


@pytest.mark.timeout(300)
def test_kill_9_of_a_slurm_worker_and_server_then_sigterm_to_salloc(testbed: Testbed,
                                                                    work: Path) -> None:
    """srun keeps a step alive when one task dies unless --kill-on-bad-exit; then its
    ``srun: error: h2: task 1: Killed`` names the signal. A SIGTERM to ``salloc`` makes Slurm
    cancel the steps, and the cause is the termination, not a server it cancelled."""
    jobs = kill_a_worker_and_a_server(
        testbed, work, "slurm", r"^\[launcher\] {role} rank ({rank}) on h2 \({role}s via srun, "
                                r"task \d\) killed by SIGKILL")
    for role, k in jobs.items():
        tags = the_run(k.work).data.tags
        assert (tags["failed_role"], tags["failed_rank"], tags["failed_host"],
                tags["failed_status"]) == (role, k.line.group(1), "h2", "-9"), tags

    work2 = work / "salloc"
    work2.mkdir()
    job, obs = launch(testbed, work2, "slurm")
    try:
        training(obs)
        termed = time.monotonic()
        job.proc.send_signal(signal.SIGTERM)  # the `on` wrapper execs salloc: this is salloc
        took = wait_gone(work2, job, termed)
    finally:
        finish(job, obs, work2)
    assert took < 30, (took, job.text()[-3000:])
    tags = the_run(work2).data.tags
    assert tags["failed_role"] == "launcher", (job.text()[-3000:], tags)
    assert re.fullmatch(r"launcher received SIG(TERM|HUP); job torn down|Slurm ended the "
                        r"allocation \(job \d+ \w+\): the job was cancelled or its allocation "
                        r"revoked; job torn down", tags["failure"]), tags


@pytest.mark.timeout(300)
def test_scancel_of_a_slurm_batch_job(testbed: Testbed, work: Path) -> None:
    obs = Observer(testbed, str(work))
    sub = start(testbed, "h0", ["sbatch", "--parsable", "-N", "2", "-w", "h1,h2",
                                f"--output={work}/slurm-%j.out",
                                str(REPO / "launch" / "slurm.sbatch"), str(write_config(work))],
                work, log_name="sbatch.log",
                env={"MXLARGE_PYTHON": PY, "MXLARGE_WORKERS": "2", "MXLARGE_SERVERS": "2"})
    assert sub.wait(60) == 0, sub.text()
    job_id = sub.text().split()[-1]
    try:
        training(obs)
        cancel = start(testbed, "h0", ["scancel", job_id], work, log_name="scancel.log")
        cancelled = time.monotonic()
        assert cancel.wait(30) == 0, cancel.text()
        took = wait_gone(work, None, cancelled)
    finally:
        obs.stop()
    out = (work / f"slurm-{job_id}.out").read_text()
    assert took < 30, (took, out[-3000:])
    run = the_run(work)
    assert run.info.status == "FAILED", out[-3000:]
    tags = run.data.tags
    # Slurm's SIGTERM reaches the batch step (mxlarge launch, exec'd by slurm.sbatch) first
    assert (tags["failed_role"], tags["failed_rank"], tags["failed_host"]) == \
        ("launcher", "0", testbed.addr("h1")), (tags, out[-3000:])
    assert tags["failure"] == "launcher received SIGTERM; job torn down"


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def host_of(tb: Testbed, pid: int) -> str | None:
    """The testbed host whose network namespace ``pid`` is in (test_foreign_host.py)."""
    ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    return next((h for h in tb.hosts if os.stat(f"/run/netns/{tb.netns(h)}").st_ino == ino),
                None)
