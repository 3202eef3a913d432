"""Failures across hosts, 2 workers + 2 servers over h1, h2 (scheduler on h0): kill -9 of a
remote worker and of a remote server through each of ssh, mpirun and srun (two jobs at once on
the same hosts, one losing its worker, one its server), ``scancel`` of a batch job beside the
mpirun ones, SIGTERM to ``salloc`` beside the srun ones (h2's link going down:
``test_partition.py``). Each time the launcher names role, kvstore rank, host and cause (the
signal, the termination) within seconds, the job is gone from every host within 30 s (no
process of it left in any namespace, the cut-off host included), and its MLflow run is FAILED
with those tags.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.protocol.heartbeat import Record, read_all
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


def has_evidence(work: Path, run) -> None:  # type: ignore[no-untyped-def]
    """``failed_step`` is the last completed step, no metric beyond it, and ``failure/job.log``
    holds the launcher's view of every worker's heartbeat and every process's last lines."""
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns.db")
    last = max((m.step for k in ("train/loss", "train/samples")
                for m in client.get_metric_history(run.info.run_id, k)), default=0)
    assert int(run.data.tags["failed_step"]) >= last, (last, run.data.tags)
    job = Path(client.download_artifacts(run.info.run_id, "failure/job.log", str(work)))
    text = job.read_text()
    assert "# the launcher's view of every worker's last heartbeat:\n#   worker rank 0 on " \
        in text and "\n## [" in text, text[:3000]


def beat_rank(work: Path, pid: int) -> int:
    """The kvstore rank the heartbeat of worker ``pid`` states (the job's heartbeat files)."""
    for f in work.glob(".mxlarge-heartbeat/*/worker-*.json"):
        record = json.loads(f.read_bytes())
        if record["pid"] == pid:
            return int(record["rank"])
    raise AssertionError(f"no heartbeat of pid {pid}")


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
    job.proc.wait(30)  # reaped: a Popen collected while running warns in a later test


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


@dataclass
class Beside:
    """A third job of :func:`kill_a_worker_and_a_server`: how it starts (in its directory),
    what is done to it at the moment of the kills; after the kills, ``took``: seconds until
    nothing of it is left on any host."""

    start: Callable[[Path], tuple[Job, Observer]]
    act: Callable[[Job], None]
    ready: Callable[[Path], bool] = lambda work: True  # waited for (60 s) once it trains
    work: Path | None = None
    job: Job | None = None
    took: float | None = None


def kill_a_worker_and_a_server(testbed: Testbed, work: Path, launcher: str, line: str,
                               hostfile: str | None = None,
                               beside: Beside | None = None) -> dict[str, Killed]:
    """Two jobs of ``launcher`` at once on the same hosts (and ``beside``, if given), each in
    its own directory (so its Observer, heartbeats, MLflow store and :func:`anything_of` are
    its own; ps-lite picks the ports): once all train, the worker on h2 of the one and the
    server on h2 of the other get ``kill -9`` at the same moment (and ``beside.act`` is done).
    ``line`` is the pattern of the launcher's line naming the kill, with ``{role}`` (and, for a
    worker, ``{rank}``: its heartbeat's kvstore rank, ``\\d`` for a server) in it. Returns each
    job by the role killed in it; fills in ``beside``."""
    jobs: dict[str, tuple[Job, Observer]] = {}
    try:
        for role in ("worker", "server"):
            (work / role).mkdir()
            # all at once: the launchers claim their scheduler ports themselves
            # (mxlarge.launcher.scheduler_port.claimed_scheduler_port)
            jobs[role] = launch(testbed, work / role, launcher, hostfile=hostfile)
        if beside is not None:
            beside.work = work / "beside"
            beside.work.mkdir()
            jobs["beside"] = beside.start(beside.work)
        procs = {role: training(obs) for role, (_, obs) in jobs.items()}
        if beside is not None:
            wait_until(lambda: beside.ready(work / "beside"), 60, "the job beside to be ready")
        assert all(_environ_of(p.pid).get("PYTHONDONTWRITEBYTECODE") == "1"
                   for ps in procs.values() for p in ps if p.role != "scheduler"), \
            "the launcher passes PYTHONDONTWRITEBYTECODE=1"
        victims = {role: next(p for p in procs[role] if p.role == role and p.host == "h2")
                   for role in ("worker", "server")}
        ranks = {"worker": str(beat_rank(work / "worker", victims["worker"].pid)),
                 "server": r"\d"}
        patterns = {role: line.format(role=role, rank=ranks[role]) for role in victims}
        killed = time.monotonic()
        for p in victims.values():
            os.kill(p.pid, signal.SIGKILL)
        if beside is not None:
            beside.act(jobs["beside"][0])
        named: dict[str, float] = {}  # seconds from the kill, each job's own
        took: dict[str, float] = {}
        while len(took) < len(jobs) or len(named) < len(patterns):
            now = time.monotonic() - killed
            for role, (job, _) in jobs.items():
                if role in patterns and role not in named \
                        and re.search(patterns[role], job.text(), re.M):
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
    for role in victims:
        job = jobs[role][0]
        print(f"{launcher} {role}: named after {named[role]:.1f} s, gone after "
              f"{took[role]:.1f} s")
        assert named[role] < 5 and took[role] < 30, (role, named, took, job.text()[-3000:])
        m = re.search(patterns[role], job.text(), re.M)
        assert m is not None
        out[role] = Killed(work / role, job, victims[role], m, named[role], took[role])
    if beside is not None:
        beside.job, beside.took = jobs["beside"][0], took["beside"]
        print(f"{launcher} beside: gone after {beside.took:.1f} s")
    return out


BUSY_STALL = 8  # the busy job's --stall-timeout: its busy allowance would be 10 x that


def _h2_worker(work: Path) -> Record | None:
    """The heartbeat record of the job's worker on h2 (its own hostname), if there is one."""
    for d in work.glob(".mxlarge-heartbeat/*"):
        return next((r for r in read_all(d).values() if r.host == "h2"), None)
    return None


def busy_job(testbed: Testbed, stopped: list[tuple[int, float]]) -> Beside:
    """A user's own loop (tests/scripts/own_loop.py under ``python -m mxlarge.launcher``, ssh, 2 + 2
    on h1, h2) whose workers spend 10 minutes in ``trainer.busy("evaluating")`` from step 10;
    at the moment of the kills its worker on h2 gets SIGSTOP (``(pid, when)`` into
    ``stopped``)."""
    def start_it(work: Path) -> tuple[Job, Observer]:
        (work / "hosts").write_text(SSH_HOSTS)
        obs = Observer(testbed, str(work))
        return start(testbed, "h0", [
            PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "2", "--launcher", "ssh", "-H",
            str(work / "hosts"), "--stall-timeout", str(BUSY_STALL), "--", PY,
            str(REPO / "tests" / "scripts" / "own_loop.py"), "--steps", "100000", "--busy-at", "10",
            "--busy", "600"], work), obs

    def stop_it(job: Job) -> None:
        record = _h2_worker(job.log.parent)
        assert record is not None
        os.kill(record.pid, signal.SIGSTOP)
        stopped.append((record.pid, time.monotonic()))

    def busy(work: Path) -> bool:
        record = _h2_worker(work)
        return record is not None and record.phase == "evaluating"

    return Beside(start_it, stop_it, busy)


@pytest.mark.timeout(300)
def test_kill_9_of_a_remote_ssh_worker_and_server_is_named_with_the_signal(
        testbed: Testbed, work: Path) -> None:
    """ssh's status 255 hides the signal; the remote guard (mxlarge/launcher/guard.py) tells
    it. The kvstore rank is the heartbeat's (worker) or the scheduler's assignment (server).

    Beside them, a worker stopped (SIGSTOP) while its heartbeat says it is evaluating: a
    stopped worker's heartbeat thread stops ticking, the watchdog calls it "not responding",
    and it gets no busy allowance (10 stall timeouts): the job stops within the stall
    timeout, naming it."""
    stopped: list[tuple[int, float]] = []
    frozen = busy_job(testbed, stopped)
    jobs = kill_a_worker_and_a_server(
        testbed, work, "ssh", r"^\[launcher\] {role} rank ({rank}) on 198\.18\.0\.12 killed by "
                              r"SIGKILL; stopping the job$", hostfile=SSH_HOSTS, beside=frozen)
    for role, k in jobs.items():
        assert k.job.proc.returncode == 128 + 9
        assert "ssh could not connect" not in k.job.text()
        said = int(k.line.group(1))  # a worker's: its heartbeat's (the pattern)
        run = the_run(k.work)
        assert run.info.status == "FAILED"
        tags = run.data.tags
        assert (tags["failed_role"], tags["failed_kvstore_rank"], tags["failed_host"],
                tags["failed_status"]) == (role, str(said), testbed.addr("h2"), "-9"), tags
        assert tags["failed_launch_index"] in ("0", "1"), tags
        assert tags["failure"] == f"{role} rank {said} on 198.18.0.12 killed by SIGKILL", tags
        has_evidence(k.work, run)

    assert frozen.job is not None and frozen.took is not None
    out = frozen.job.text()
    (pid, when), = stopped
    assert frozen.job.proc.returncode == 124, out[-3000:]
    assert re.search(rf"stalled: no worker advanced for \d+ s \(stall timeout {BUSY_STALL} s\); "
                     rf"behind: worker rank \d at step \d+ on h2 \(pid {pid}\), not responding",
                     out), out[-3000:]
    print(f"ssh busy worker stopped: the job gone after {frozen.took:.1f} s")
    assert frozen.took < BUSY_STALL + 7, (frozen.took, out[-3000:])  # not 10 x BUSY_STALL


def sbatch_job(testbed: Testbed) -> Callable[[Path], tuple[Job, Observer]]:
    """Starts ``sbatch launch/slurm.sbatch`` (2 + 2 on h1, h2) in a directory; its Job is the
    ``sbatch --parsable`` that printed the job id (it has exited once the job is queued)."""
    def start_it(work: Path) -> tuple[Job, Observer]:
        obs = Observer(testbed, str(work))
        # --exclusive=user (over the script's --exclusive): it shares h1, h2 with the jobs
        # beside it
        sub = start(testbed, "h0", ["sbatch", "--parsable", "-N", "2", "-w", "h1,h2",
                                    "--exclusive=user", f"--output={work}/slurm-%j.out",
                                    str(REPO / "launch" / "slurm.sbatch"),
                                    str(write_config(work))],
                    work, log_name="sbatch.log",
                    env={"MXLARGE_PYTHON": PY, "MXLARGE_WORKERS": "2", "MXLARGE_SERVERS": "2"})
        assert sub.wait(60) == 0, sub.text()
        return sub, obs
    return start_it


@pytest.mark.timeout(300)
def test_kill_9_of_a_remote_mpi_server_and_worker_and_scancel_of_a_batch_job(
        testbed: Testbed, work: Path) -> None:
    """Beside the two mpirun jobs, ``scancel`` of an ``sbatch`` of launch/slurm.sbatch: Slurm's
    SIGTERM reaches the batch step (``mxlarge launch``, exec'd by the script) first, and the
    job's run names the termination on the first node."""
    cancel: list[Job] = []
    batch = Beside(sbatch_job(testbed), lambda sub: cancel.append(start(
        testbed, "h0", ["scancel", sub.text().split()[-1]], sub.log.parent,
        log_name="scancel.log")))
    jobs = kill_a_worker_and_a_server(
        testbed, work, "mpi", r"^\[launcher\] {role} rank ({rank}) on h2 \({role}s via mpirun, "
                              r"mpi rank 1\) killed by SIGKILL",
        hostfile="h1 slots=1\nh2 slots=1\n", beside=batch)
    for role, k in jobs.items():
        assert k.job.proc.returncode != 0
        run = the_run(k.work)
        assert run.info.status == "FAILED"
        tags = run.data.tags
        # mpirun's report "process rank 1 with PID ... on node h2 exited on signal 9" + the
        # rank the scheduler assigned to the process on h2 (a worker's: its heartbeat's)
        assert (tags["failed_role"], tags["failed_host"], tags["failed_status"]) == \
            (role, "h2", "-9"), (tags, k.job.text()[-3000:])
        assert tags["failed_kvstore_rank"] == k.line.group(1) in ("0", "1"), tags
        assert "killed by SIGKILL" in tags["failure"], tags
        has_evidence(k.work, run)

    assert cancel[0].wait(30) == 0, cancel[0].text()
    assert batch.work is not None and batch.took is not None
    out = "".join(p.read_text() for p in batch.work.glob("slurm-*.out"))
    assert batch.took < 30, (batch.took, out[-3000:])
    run = the_run(batch.work)
    assert run.info.status == "FAILED", out[-3000:]
    tags = run.data.tags
    assert (tags["failed_role"], tags["failed_host"]) == \
        ("launcher", testbed.addr("h1")), (tags, out[-3000:])
    assert "failed_kvstore_rank" not in tags, tags
    assert tags["failure"] == "launcher received SIGTERM; job torn down"


@pytest.mark.timeout(300)
def test_kill_9_of_a_slurm_worker_and_server_and_sigterm_to_salloc(testbed: Testbed,
                                                                   work: Path) -> None:
    """srun keeps a step alive when one task dies unless --kill-on-bad-exit; then its
    ``srun: error: h2: task 1: Killed`` names the signal. Beside them, a SIGTERM to ``salloc``
    makes Slurm cancel the steps, and the cause is the termination, not a server it
    cancelled."""
    term = Beside(lambda w: launch(testbed, w, "slurm"),
                  # the `on` wrapper execs salloc: this is salloc
                  lambda job: job.proc.send_signal(signal.SIGTERM))
    jobs = kill_a_worker_and_a_server(
        testbed, work, "slurm", r"^\[launcher\] {role} rank ({rank}) on h2 \({role}s via srun, "
                                r"task \d\) killed by SIGKILL", beside=term)
    for role, k in jobs.items():
        run = the_run(k.work)
        tags = run.data.tags
        assert (tags["failed_role"], tags["failed_kvstore_rank"], tags["failed_host"],
                tags["failed_status"]) == (role, k.line.group(1), "h2", "-9"), tags
        has_evidence(k.work, run)

    assert term.work is not None and term.job is not None and term.took is not None
    assert term.took < 30, (term.took, term.job.text()[-3000:])
    tags = the_run(term.work).data.tags
    assert tags["failed_role"] == "launcher", (term.job.text()[-3000:], tags)
    assert re.fullmatch(r"launcher received SIG(TERM|HUP); job torn down|Slurm ended the "
                        r"allocation \(job \d+ \w+\): the job was cancelled or its allocation "
                        r"revoked; job torn down", tags["failure"]), tags


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def host_of(tb: Testbed, pid: int) -> str | None:
    """The testbed host whose network namespace ``pid`` is in (test_foreign_host.py)."""
    ino = os.stat(f"/proc/{pid}/ns/net").st_ino
    return next((h for h in tb.hosts if os.stat(f"/run/netns/{tb.netns(h)}").st_ino == ino),
                None)
