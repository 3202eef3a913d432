"""Stragglers across hosts on the ssh backend, 2 workers on h1 and h2 (scheduler on h0): h2's
worker slowed by a CPU quota (cgroup v1 ``cpu``) is named with its rank, pid and host for its
forward+backward; with the servers on h0 and h2's link slowed both ways (``tc tbf`` 20 Mbit/s),
h2's worker is named for its exchange, not its compute. Each within 60 s, in the MLflow run's
``straggler`` tag. Why a link is seen by when a rank's exchange ends and not by how long it
lasts: "Stragglers" in docs/design/launcher.md.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mxlarge.breakdown import WINDOW
from mxlarge.protocol.heartbeat import Record, read_all
from mxlarge.testbed import BRIDGE_NS, Testbed
from tests.cluster.observe import Job, Observer, start
from tests.cluster.test_failures import PY, finish, host_of, the_run
from tests.helpers import dmlc_processes

NAMED_WITHIN = 60.0
CPU = Path("/sys/fs/cgroup/cpu")
# The digits recipe's net (79 kB of gradients) at half its batch: 11 steps an epoch, so that
# most sampled steps (every 10th) are not an epoch's first, which follows the epoch's end
# (evaluation, rank 0's logging) rather than another step. Stopped by the test.
CONFIG = """
name: straggler
data: {{dataset: digits, batch_size: 64}}
model: {{name: small_resnet, width: 16}}
optim: {{base_lr: 0.05, reference_batch: 16, warmup: none, decay: none}}
train: {{epochs: 5000, progress: false}}
dist: {{kvstore: dist_sync, workers: 2}}
tracking: {{enabled: true, uri: 'sqlite:///{work}/mlruns.db'}}
"""


def launch(tb: Testbed, work: Path, hosts: list[str]) -> tuple[Job, Observer]:
    """``mxlarge launch`` of :data:`CONFIG` from h0 on the ssh backend, 2 workers and 2
    servers over the hostfile's ``hosts`` lines."""
    (work / "straggler.yaml").write_text(CONFIG.format(work=work))
    (work / "hosts").write_text("".join(f"{h}\n" for h in hosts))
    obs = Observer(tb, str(work))
    return start(tb, "h0", [PY, "-m", "mxlarge.cli", "launch", str(work / "straggler.yaml"),
                            "-n", "2", "-s", "2", "--launcher", "ssh", "-H",
                            str(work / "hosts")], work), obs


def worker_on(job: Job, work: Path, host: str, timeout: float) -> Record:
    """The heartbeat of the worker on ``host`` once both workers report their step
    breakdown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        for d in work.glob(".mxlarge-heartbeat/*"):
            records = read_all(d)
            if len(records) == 2 and all(r.parts for r in records.values()):
                return next(r for r in records.values() if r.host == host)
        time.sleep(0.2)
    raise AssertionError(f"the workers never reported their step breakdown under {work}:\n"
                         f"{job.text()[-4000:]}")


def named(job: Job, timeout: float = NAMED_WITHIN) -> tuple[str, float]:
    """The launcher's first straggler line in ``job`` and the seconds it took from this call,
    waiting up to ``timeout`` s."""
    pattern = r"^\[launcher\] straggler: .*$"
    since = time.monotonic()
    while time.monotonic() - since < timeout:
        found = re.search(pattern, job.text(), re.M)
        if found:
            return found.group(0), time.monotonic() - since
        time.sleep(0.5)
    raise AssertionError(f"no line {pattern!r} within {timeout:g} s:\n{job.text()[-4000:]}")


@contextmanager
def cpu_quota(pid: int, share: float, period: int = 10000) -> Iterator[None]:
    """``pid`` (every thread of it) limited to ``share`` of one core, in periods of
    ``period`` µs (the kernel's smallest quota is 1000 µs)."""
    group = CPU / f"mxlarge-straggler-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(period * share))))
        (group / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        for left in (group / "cgroup.procs").read_text().split():
            try:
                (CPU / "cgroup.procs").write_text(left)
            except OSError:
                pass  # it exited meanwhile
        group.rmdir()


def cpu_use(pid: int, seconds: float) -> float:
    """The share of one core ``pid`` used over the next ``seconds``."""
    def used() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    before, t0 = used(), time.monotonic()
    time.sleep(seconds)
    return (used() - before) / (time.monotonic() - t0)


@contextmanager
def slow_link(tb: Testbed, host: str, rate: str) -> Iterator[None]:
    """``host``'s link limited to ``rate`` both ways (``tc tbf`` on its eth0 and on its port
    of the bridge), with a small bucket so that every step's exchange meets the limit."""
    i = int(host[1:])
    devices = ((tb.netns(host), "eth0"), (BRIDGE_NS, f"v{i}"))
    try:
        for ns, dev in devices:
            subprocess.run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
                            rate, "burst", "16kb", "latency", "50ms"], check=True)
        yield
    finally:
        for ns, dev in devices:
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)


def stop(job: Job) -> None:
    """SIGINT to the launcher: it tears the job down and records the attempt's stragglers."""
    job.proc.send_signal(signal.SIGINT)
    job.wait(60)


@pytest.mark.timeout(300)
def test_a_slowed_worker_on_h2_is_named_for_its_compute(testbed: Testbed, work: Path) -> None:
    job, obs = launch(testbed, work, [testbed.addr("h1"), testbed.addr("h2")])
    try:
        victim = worker_on(job, work, "h2", 150)
        with cpu_quota(victim.pid, 0.3):
            line, took = named(job)
        stop(job)
    finally:
        finish(job, obs, work)
    print(f"straggler on h2 named {took:.1f} s after its CPU quota: {line}")
    assert re.fullmatch(rf"\[launcher\] straggler: worker rank {victim.rank} \(pid "
                        rf"{victim.pid}\) on h2 from step \d+: forward\+backward [\d.]+× the "
                        r"median \(now [\d.]+×\); the other ranks wait \d+% of each step for it",
                        line), line
    tag = the_run(work).data.tags["straggler"]
    assert tag.startswith(f"worker rank {victim.rank} on h2 (pid {victim.pid}): "
                          "forward+backward"), tag


@pytest.mark.timeout(300)
def test_a_slow_link_to_h2_is_named_for_its_exchange(testbed: Testbed, work: Path) -> None:
    job, obs = launch(testbed, work, [f"{testbed.addr('h0')} role=server", testbed.addr("h1"),
                                      testbed.addr("h2")])
    try:
        victim = worker_on(job, work, "h2", 150)
        with slow_link(testbed, "h2", "20mbit"):
            line, took = named(job)
            exchange = {r.host: r.parts["exchange"] for r in
                        read_all(next(work.glob(".mxlarge-heartbeat/*"))).values()}
        stop(job)
    finally:
        finish(job, obs, work)
    # how long each rank's exchange lasted (docs/design/launcher.md: not what names the link)
    print(f"slow link to h2 named {took:.1f} s after tc: {line}; exchange medians (ms): "
          f"{exchange}")
    assert re.fullmatch(rf"\[launcher\] straggler: worker rank {victim.rank} \(pid "
                        rf"{victim.pid}\) on h2 from step \d+: its exchange ends \d+ ms after the "
                        r"others' \(a slow link\); the other ranks wait \d+% of each step for it",
                        line), line
    assert "forward+backward" not in job.text()
    tag = the_run(work).data.tags["straggler"]
    assert tag.startswith(f"worker rank {victim.rank} on h2 (pid {victim.pid}): its exchange"), \
        tag


def full_windows(job: Job, work: Path, timeout: float) -> None:
    """Until both workers' windows of sampled steps are full: the launcher then holds each
    server's start, what a slow server is compared with (a server slowed before that is its
    own reference and never named)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        for d in work.glob(".mxlarge-heartbeat/*"):
            records = read_all(d)
            if len(records) == 2 and all(r.parts and r.parts["n"] >= WINDOW
                                         for r in records.values()):
                return
        time.sleep(0.5)
    raise AssertionError(f"the workers' windows were never full under {work}:\n"
                         f"{job.text()[-4000:]}")


def server_on(work: Path, tb: Testbed, host: str, timeout: float) -> int:
    """The pid of the job's server on ``host`` (the job's processes are named by ``work``,
    their working directory), once the workers report their step breakdown."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in dmlc_processes(str(work), "server"):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                # the server itself, not its guard nor a shell around it
                if b"mxlarge.cli" in argv and b"mxlarge.launcher.guard" not in argv \
                        and host_of(tb, pid) == host:
                    return pid
            except OSError:
                continue
        time.sleep(0.5)
    raise AssertionError(f"no server of the job on {host}")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["ssh", "slurm"])
def test_a_server_host_under_a_cpu_quota_is_named_with_its_host(
        testbed: Testbed, work: Path, backend: str) -> None:
    """2 workers and 2 servers over h1 and h2, one of each per host (buckets of 16 KiB, so
    both servers sum gradients); h2's server limited to a quarter of the CPU it used (about 4%
    of a core on 2 cores, so a fixed quota of 2% slows it on one machine and not on a faster
    one): named as the server on h2 with its pid, within :data:`NAMED_WITHIN` s, in the line
    and the run's tag."""
    (work / "straggler.yaml").write_text(CONFIG.format(work=work))
    argv = [PY, "-m", "mxlarge.cli", "launch", str(work / "straggler.yaml"), "-n", "2", "-s",
            "2", "--launcher", backend, "dist.fusion_bytes=16384"]
    if backend == "ssh":
        (work / "hosts").write_text(f"{testbed.addr('h1')}\n{testbed.addr('h2')}\n")
        argv += ["-H", str(work / "hosts")]
    else:
        argv = ["salloc", "--no-kill", "-N", "2", "-w", "h1,h2", *argv]
    obs = Observer(testbed, str(work))
    job = start(testbed, "h0", argv, work)
    try:
        full_windows(job, work, 150)
        victim = server_on(work, testbed, "h2", 30)
        use = cpu_use(victim, 5.0)
        # the kernel's smallest quota (1 ms) in a period 4 / use times longer
        with cpu_quota(victim, use / 4, period=min(1_000_000, int(4000 / use))):
            line, took = named(job)
        stop(job)
    finally:
        finish(job, obs, work)
    print(f"{backend}: h2's server named {took:.1f} s after a CPU quota of {use / 4:.2%} of a "
          f"core: {line}")
    assert re.fullmatch(rf"\[launcher\] straggler: server rank [01] \(pid {victim}\) on h2 from "
                        r"step \d+: its sums come \d+ ms after the other servers' \([\d.]+×; now "
                        r"[\d.]+×\); it holds \d+% of the gradient bytes; the workers wait \d+% "
                        r"of each step for it", line), line
    tag = the_run(work).data.tags["straggler"]
    assert re.match(rf"server rank [01] on h2 \(pid {victim}\): its sums come", tag), tag
