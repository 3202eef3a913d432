"""A server stopped (``SIGSTOP``, state ``T``) under an mpirun job and under an srun job at
once, 2 workers + 2 servers over h1 and h2 each (``--stall-timeout 10``): no worker is behind
(every worker ticks and waits at the same step), so a stall rule alone could say only
"suspect a server, the scheduler or the network". The guard of the stopped server says it is
stopped (mxlarge/launcher/guard.py), and the stall names it, its pid and its host; the MLflow
run blames it (``failed_role=server``, ``failed_host``, ``failed_pid``). Nothing of either job
is left on any host afterwards. A server stopped while the workers say they are evaluating is
named within the stall timeout too: the busy allowance is for work, not for a stopped server.

A worker stopped under an ssh, an mpirun and an srun job at once: each run names it as a death
would (``failed_role=worker``, its kvstore rank, host and pid), and at the teardown
the guards say so, none that the launcher's connection was lost. In the slower cluster tier
(``make test-cluster-slow``).
"""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from mxlarge.protocol.heartbeat import read_all
from mxlarge.testbed import Testbed
from tests.cluster.observe import Observer, start, wait_until
from tests.cluster.test_failures import (
    PY,
    REPO,
    SSH_HOSTS,
    _h2_worker,
    anything_of,
    finish,
    launch,
    the_run,
    training,
)

pytestmark = pytest.mark.slow
STALL = 10
BACKENDS = {"mpi": "h1 slots=1\nh2 slots=1\n", "slurm": None}


@pytest.mark.timeout(300)
def test_a_stopped_server_is_named_with_its_host_on_mpi_and_slurm(testbed: Testbed,
                                                                   work: Path) -> None:
    jobs = {}
    stopped: dict[str, int] = {}
    ended: dict[str, float] = {}
    try:
        for b, hostfile in BACKENDS.items():
            (work / b).mkdir()
            jobs[b] = launch(testbed, work / b, b, "--stall-timeout", str(STALL),
                             hostfile=hostfile)
        procs = {b: training(obs) for b, (_, obs) in jobs.items()}
        t0 = time.monotonic()
        for b in jobs:
            victim = next(p for p in procs[b] if p.role == "server" and p.host == "h2")
            os.kill(victim.pid, signal.SIGSTOP)
            stopped[b] = victim.pid
        while len(ended) < len(jobs):
            for b, (job, _) in jobs.items():
                if b not in ended and job.proc.poll() is not None:
                    ended[b] = time.monotonic() - t0
            if time.monotonic() - t0 >= 60:  # each job's whole output, not a truncated repr
                for b, (j, _) in jobs.items():
                    print(f"===== {b} (ended: {ended.get(b)}) =====\n{j.text()[-6000:]}")
            assert time.monotonic() - t0 < 60, (ended, {b: j.text()[-3000:]
                                                        for b, (j, _) in jobs.items()})
            time.sleep(0.2)
        gone = {}
        for b in jobs:
            deadline = time.monotonic() + 30
            while anything_of(str(work / b)) and time.monotonic() < deadline:
                time.sleep(0.2)
            gone[b] = anything_of(str(work / b))
    finally:
        for pid in stopped.values():
            with_cont(pid)
        for b, (job, obs) in jobs.items():
            finish(job, obs, work / b)
    for b, (job, _) in jobs.items():
        text = job.text()
        pid = stopped[b]
        print(f"stopped server, {b}: the launcher exited {ended[b]:.1f} s after the SIGSTOP")
        assert job.proc.returncode == 124, (b, text[-3000:])
        assert re.search(rf"stalled: no worker advanced for \d+ s \(stall timeout {STALL} s\); "
                         rf"every worker waits at step \d+: server pid {pid} on h2 stopped "
                         r"\(SIGSTOP or a debugger\)", text), (b, text[-3000:])
        assert "suspect a server" not in text, (b, text[-3000:])
        assert ended[b] < STALL + 15, (b, ended, text[-3000:])
        assert gone[b] == [], (b, gone)
        tags = the_run(work / b).data.tags
        assert (tags["failure"], tags["failed_role"], tags["failed_host"], tags["failed_pid"],
                tags["failed_status"]) == ("stalled", "server", "h2", str(pid), "-19"), tags
        assert "None" not in tags.values(), tags


@pytest.mark.timeout(300)
def test_a_server_stopped_while_the_workers_evaluate_is_named_within_the_stall_timeout(
        testbed: Testbed, work: Path) -> None:
    """Slurm, a user's own loop (tests/scripts/own_loop.py) whose workers spend 10 minutes in
    ``trainer.busy("evaluating")`` from step 10; its server on h2 is stopped then. A busy phase
    gets ten stall timeouts, a server its guard saw stopped none: the job stops within the stall
    timeout, naming the server and its host."""
    obs = Observer(testbed, str(work))
    job = start(testbed, "h0", [
        "salloc", "-N", "2", "-w", "h1,h2", PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "2",
        "--launcher", "slurm", "--stall-timeout", str(STALL), "--", PY,
        str(REPO / "tests" / "scripts" / "own_loop.py"), "--steps", "100000", "--busy-at", "10",
        "--busy", "600"], work)
    pid = None
    try:
        procs = training(obs)
        wait_until(lambda: (r := _h2_worker(work)) is not None and r.phase == "evaluating", 120,
                   "the worker on h2 evaluating")
        pid = next(p.pid for p in procs if p.role == "server" and p.host == "h2")
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        code = job.wait(STALL + 60)
        ended = time.monotonic() - t0
        wait_until(lambda: not anything_of(str(work)), 30,
                   f"the job to be gone (left: {anything_of(str(work))})")
    finally:
        if pid is not None:
            with_cont(pid)
        finish(job, obs, work)
    text = job.text()
    print(f"server stopped while evaluating: the launcher exited {ended:.1f} s after the SIGSTOP")
    assert code == 124, text[-3000:]
    assert re.search(rf"stalled: no worker advanced for \d+ s \(stall timeout {STALL} s\); "
                     rf"every worker waits at step \d+: server pid {pid} on h2 stopped "
                     r"\(SIGSTOP or a debugger\)", text), text[-3000:]
    assert ended < STALL + 15, (ended, text[-3000:])


def with_cont(pid: int) -> None:
    """SIGCONT to ``pid`` if it is still there (teardown continues it too)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


WORKER_BACKENDS = {"ssh": SSH_HOSTS, **BACKENDS}


@pytest.mark.timeout(400)
def test_a_stopped_worker_is_named_as_a_killed_one_on_every_backend(testbed: Testbed,
                                                                    work: Path) -> None:
    jobs = {}
    stopped: dict[str, tuple[int, int]] = {}  # backend -> (pid, kvstore rank)
    try:
        for b, hostfile in WORKER_BACKENDS.items():
            (work / b).mkdir()
            jobs[b] = launch(testbed, work / b, b, "--stall-timeout", str(STALL),
                             hostfile=hostfile)
        for b, (job, obs) in jobs.items():
            try:
                training(obs)
            except AssertionError as e:
                raise AssertionError(f"{b}: {e}\n{job.text()[-3000:]}") from None
        for b in jobs:
            (beats,) = (work / b).glob(".mxlarge-heartbeat/*")
            record = next(r for r in read_all(beats).values() if r.host == "h2")
            os.kill(record.pid, signal.SIGSTOP)
            stopped[b] = (record.pid, record.rank)
        for job, _ in jobs.values():
            job.wait(STALL + 60)
        gone = {}
        for b in jobs:
            deadline = time.monotonic() + 30
            while anything_of(str(work / b)) and time.monotonic() < deadline:
                time.sleep(0.2)
            gone[b] = anything_of(str(work / b))
    finally:
        for pid, _ in stopped.values():
            with_cont(pid)
        for b, (job, obs) in jobs.items():
            finish(job, obs, work / b)
    for b, (job, _) in jobs.items():
        text = job.text()
        pid, rank = stopped[b]
        assert job.proc.returncode == 124, (b, text[-3000:])
        assert re.search(rf"behind: worker rank {rank} at step \d+ on h2 \(pid {pid}\), not "
                         "responding", text), (b, text[-3000:])
        tags = the_run(work / b).data.tags
        assert (tags["failure"], tags["failed_role"], tags["failed_kvstore_rank"],
                tags["failed_host"], tags["failed_pid"]) == \
            ("stalled", "worker", str(rank), "h2", str(pid)), (b, tags)
        # one ssh client per process: its launch index too; mpirun, srun carry every worker
        assert ("failed_launch_index" in tags) == (b == "ssh"), (b, tags)
        assert "None" not in tags.values(), tags
        # the teardown is said as such by the guards, none claims a lost connection
        assert "connection lost" not in text, (b, text[-3000:])
        assert "mxlarge-guard: the launcher tears the job down; ending pid" in text, \
            (b, text[-3000:])
        assert gone[b] == [], (b, gone)
