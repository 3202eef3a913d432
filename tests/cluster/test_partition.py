"""h2's link goes down under three jobs at once, one per backend (ssh, mpirun, srun inside
salloc), 2 workers + 2 servers over h1 and h2 each, each job in its own directory (its own
Observer, heartbeats, MLflow store and :func:`anything_of`): one cut for all three.

For each backend the launcher names h2 unreachable within the stall timeout (ssh's keepalive
or the watchdog, then the probe: ``mxlarge.launcher.reach.unreachable``), never blames h1's
healthy workers, does not wait for h2's packet filter to confirm its removal, and exits
non-zero within the stall timeout + 10 s of the cut (the test prints each launcher
line's time after the cut); h2's worker and server, cut off from the launcher, end themselves
(the guard's lease, carried by the ssh client's, mpirun's ``--stdin all`` or srun's
``--input=all`` stdin) while the link is still down: within 30 s of the job's end nothing of it
is left on any host, and nothing comes back with the link. 10 s after the link is back h2 holds
nothing of any job but Slurm's step daemons (the packet filter's sshd session ended with its
lease), and nothing at all within 60 s. The MLflow runs hold no ``'None'`` tag.

A host that does not answer (198.18.0.99) in an ssh and an mpi hostfile is refused before
anything starts (the pre-flight check, ``mxlarge/launcher/preflight.py``).
"""
from __future__ import annotations

import os
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
        timeline: dict[str, dict[str, float]] = {b: {} for b in jobs}  # line -> first seen
        while len(gone) < len(jobs):
            now = time.monotonic() - cut
            for b, (job, _) in jobs.items():
                text = job.text()
                for line in re.findall(r"^(?:\[launcher\]|mxlarge:) .*$", text, re.M):
                    timeline[b].setdefault(line[:160], now)
                if b not in named and re.search(patterns[b], text, re.M):
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
        returned = time.monotonic()
        strays: list[str] | None = None  # what of the jobs is on h2 10 s after the return
        while True:
            left, since = testbed.strays("h2"), time.monotonic() - returned
            if strays is None and (since >= 10 or not left):
                strays = left
            if not left or since >= 60:
                break
            time.sleep(0.2)
        empty = since  # h2 has nothing of any job (the packet filter's sshd included)
        back = {b: anything_of(str(work / b)) for b in jobs}
    finally:
        if down or not jobs:
            testbed.link("h2", up=True)
        for b, (job, obs) in jobs.items():
            finish(job, obs, work / b)
    for b, seen in timeline.items():
        print(f"partition, {b}: timeline " + "; ".join(f"{t:.1f} s {line}" for line, t in
                                                        seen.items() if t > 0))
    for b, (job, _) in jobs.items():
        print(f"partition, {b}: h2 named after {named.get(b, float('nan')):.1f} s, launcher "
              f"exited after {ended[b]:.1f} s, nothing left {gone[b]:.1f} s after the cut "
              f"({gone[b] - ended[b]:.1f} s after the end); "
              f"{[line for line in job.text().splitlines() if 'mxlarge: job failed' in line]}")
    print(f"partition: the test took {time.monotonic() - jobs['ssh'][0].started:.1f} s from "
          f"the first launch; h2 empty {empty:.1f} s after its link came back "
          f"(load average {os.getloadavg()[0]:.1f})")
    # Slurm's step daemons wait for slurmctld to end the steps of the gone allocation (the
    # one leftover the launcher cannot end: they belong to root, not to the job)
    assert strays is not None and all(" slurmstepd: " in f" {p}" for p in strays), strays
    assert empty < 60, (empty, left)
    for b, (job, _) in jobs.items():
        text = job.text()
        assert b in named and named[b] < STALL + 3, (b, named, text[-3000:])
        assert job.proc.returncode != 0, (b, text[-3000:])
        assert ended[b] < STALL + 10, (b, ended, text[-3000:])
        assert gone[b] - ended[b] < 30, (b, ended, gone)
        assert back[b] == [], (b, back)
        assert "suspect a server" not in text, (b, text[-3000:])
        # the launcher does not wait for the cut-off host's filter to confirm its removal
        assert "did not confirm the removal" not in text, (b, text[-3000:])
        if b != "slurm":  # (no filter with Slurm)
            assert f"packet filter: {BACKENDS[b][1]} is cut off" in text, (b, text[-3000:])
        # a stall names h2's workers or none, never the healthy h1's
        assert not re.search(r"behind: worker rank \d at step \d+ on h1 ", text), text[-3000:]
        h2 = BACKENDS[b][1]
        tags = the_run(work / b).data.tags
        assert "None" not in tags.values(), tags
        # a stall's failure is "stalled", its message the detail (mxlarge/launch_cli.py)
        said = tags["failure_detail"] if tags["failure"] == "stalled" else tags["failure"]
        assert f"host {h2} unreachable" in said, (b, tags)
        if tags["failure"] == "stalled":  # named as a death is: h2's worker
            assert tags["failed_role"] == "worker" and tags["failed_host"] == "h2", (b, tags)
            assert {"failed_kvstore_rank", "failed_pid"} <= set(tags), (b, tags)


@pytest.mark.timeout(120)
def test_a_host_that_does_not_answer_is_refused_before_anything_starts(testbed: Testbed,
                                                                     work: Path) -> None:
    """198.18.0.99 (no such host) in an ssh and an mpi hostfile: the pre-flight probe
    (mxlarge/launcher/preflight.py) refuses the job before any MLflow run, packet filter or
    process: exit 2, one line naming the host and why."""
    jobs = {}
    try:
        for b, hostfile in (("ssh", "198.18.0.11\n198.18.0.99\n"),
                            ("mpi", "h1 slots=1\n198.18.0.99 slots=1\n")):
            (work / b).mkdir()
            jobs[b] = launch(testbed, work / b, b, hostfile=hostfile)  # both at once
        codes = {b: job.wait(90) for b, (job, _) in jobs.items()}
    finally:
        for b, (job, obs) in jobs.items():
            finish(job, obs, work / b)
    for b, (job, obs) in jobs.items():
        rc, took, text = codes[b], time.monotonic() - job.started, job.text()
        print(f"pre-flight, {b}: refused after {took:.1f} s")
        assert rc == 2, text[-3000:]
        errors = [line for line in text.splitlines() if "error" in line]
        assert len(errors) == 1 and re.fullmatch(
            rf"mxlarge: error: host 198\.18\.0\.99 \(hostfile {work / b}/hosts\): (no answer on "
            r"port 22 within 2 s|port 22: No route to host); nothing started", errors[0]), text
        assert "packet filter" not in text and "MLflow run" not in text, text
        assert obs.procs == {}, obs.procs
        db = work / b / "mlruns.db"
        assert not db.exists() or the_runs(work / b) == [], text


def the_runs(work: Path) -> list:  # type: ignore[type-arg]
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns.db")
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"
