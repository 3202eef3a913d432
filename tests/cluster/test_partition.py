"""h2's link goes down under three jobs at once, one per backend (ssh, mpirun, srun inside
salloc), 2 workers + 2 servers over h1 and h2 each, each job in its own directory (its own
Observer, heartbeats, MLflow store and :func:`anything_of`): one cut for all three.

For each backend the launcher names h2 unreachable within the stall timeout (ssh's keepalive
or the watchdog, then the probe: ``mxlarge.launcher.reach.unreachable``) and exits non-zero;
h2's worker and server, cut off from the launcher, end themselves (the guard's lease, carried
by the ssh client's, mpirun's ``--stdin all`` or srun's ``--input=all`` stdin) while the link
is still down: within 30 s of the job's end nothing of it is left on any host, and nothing
comes back with the link.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from mxlarge.testbed import Testbed
from tests.cluster.test_failures import (
    SSH_HOSTS,
    anything_of,
    finish,
    launch,
    the_run,
    training,
)

STALL = 15
# backend -> (hostfile, how the launcher's lines name h2: ssh's hostfile has addresses)
BACKENDS = {"ssh": (SSH_HOSTS, "198.18.0.12"),
            "mpi": ("h1 slots=1\nh2 slots=1\n", "h2"),
            "slurm": (None, "h2")}


@pytest.mark.timeout(400)
def test_a_partitioned_host_is_named_and_its_processes_end_themselves(testbed: Testbed,
                                                                      work: Path) -> None:
    named: dict[str, float] = {}  # seconds from the cut to the line naming h2 unreachable
    ended: dict[str, float] = {}  # ... to the launcher's exit
    gone: dict[str, float] = {}  # ... until nothing of the job is left on any host
    patterns = {b: rf"^\[launcher\] .*host {re.escape(h2)} unreachable \((?P<why>[^)]*)\)"
                for b, (_, h2) in BACKENDS.items()}
    jobs = {}
    down = False
    try:
        for b, (hostfile, _) in BACKENDS.items():
            (work / b).mkdir()
            jobs[b] = launch(testbed, work / b, b, "--stall-timeout", str(STALL),
                             hostfile=hostfile)
        for b, (job, obs) in jobs.items():
            try:
                training(obs)
            except AssertionError as e:
                raise AssertionError(f"{b}: {e}\n{job.text()[-3000:]}") from None
        trained = time.monotonic()
        print(f"partition: all three train {trained - jobs['ssh'][0].started:.1f} s after "
              f"the first launch")
        testbed.link("h2", up=False)
        down = True
        cut = time.monotonic()
        while len(gone) < len(jobs):
            now = time.monotonic() - cut
            for b, (job, _) in jobs.items():
                if b not in named and re.search(patterns[b], job.text(), re.M):
                    named[b] = now
                if b not in ended and job.proc.poll() is not None:
                    ended[b] = now
                if b in ended and b not in gone and not anything_of(str(work / b)):
                    gone[b] = now
            if now > 75:
                left = {b: [_cmdline(pid) for pid in anything_of(str(work / b))] for b in jobs}
                raise AssertionError(f"not gone 75 s after the cut: named {named}, ended "
                                     f"{ended}, gone {gone}, left {left}\n" + "\n".join(
                                         f"--- {b}\n{j.text()[-2500:]}"
                                         for b, (j, _) in jobs.items()))
            time.sleep(0.2)
        testbed.link("h2", up=True)  # returns once Slurm sees h2 again
        down = False
        time.sleep(3)
        back = {b: anything_of(str(work / b)) for b in jobs}
    finally:
        if down or not jobs:
            testbed.link("h2", up=True)
        for b, (job, obs) in jobs.items():
            finish(job, obs, work / b)
    for b, (job, _) in jobs.items():
        print(f"partition, {b}: h2 named after {named.get(b, float('nan')):.1f} s, launcher "
              f"exited after {ended[b]:.1f} s, nothing left {gone[b]:.1f} s after the cut "
              f"({gone[b] - ended[b]:.1f} s after the end); "
              f"{[line for line in job.text().splitlines() if 'mxlarge: job failed' in line]}")
    print(f"partition: the test took {time.monotonic() - jobs['ssh'][0].started:.1f} s from "
          f"the first launch")
    for b, (job, _) in jobs.items():
        text = job.text()
        assert b in named and named[b] < STALL + 3, (b, named, text[-3000:])
        assert job.proc.returncode != 0, (b, text[-3000:])
        assert gone[b] - ended[b] < 30, (b, ended, gone)
        assert back[b] == [], (b, back)
        assert "suspect a server" not in text, (b, text[-3000:])
        h2 = BACKENDS[b][1]
        tags = the_run(work / b).data.tags
        # a stall's failure is "stalled", its message the detail (mxlarge/launch_cli.py)
        said = tags["failure_detail"] if tags["failure"] == "stalled" else tags["failure"]
        assert f"host {h2} unreachable" in said, (b, tags)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"
