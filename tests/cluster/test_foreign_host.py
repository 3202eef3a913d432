"""A fourth host that is not part of the job sends garbage to every port of a 2-worker +
2-server ssh job spread over three hosts (scheduler on h0, servers and workers on h1 and h2).

With the packet filter (``--firewall on``) every connection from h3 to a port of the job is
refused, the job finishes, bitwise equal to an undisturbed run, and the filter's rules are gone
from every host afterwards (``nft list ruleset`` as before); placement, weights and the run's
hosts are checked as in tests/cluster/test_jobs.py. Without it (``--firewall off``) the first
malformed message aborts the process that gets it: the job fails and the launcher, the MLflow
run's ``failure`` tag included, names the cause and the port. In the slower cluster tier
(``make test-cluster-slow``).
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from mxlarge.testbed import Testbed
from tests.cluster.observe import Job, Observer, start
from tests.cluster.test_failures import anything_of, the_run
from tests.cluster.test_jobs import (
    PY,
    check_placement,
    check_run,
    check_weights,
    launch_argv,
    write_config,
)

pytestmark = pytest.mark.slow
FOREIGN = str(Path(__file__).resolve().parents[1] / "scripts" / "foreign.py")
OUTSIDER = "h3"
JOB_HOSTS = ("h0", "h1", "h2")


def rulesets(tb: Testbed) -> dict[str, str]:
    return {h: subprocess.run(["ip", "netns", "exec", tb.netns(h), "nft", "list", "ruleset"],
                              capture_output=True, text=True, check=True).stdout
            for h in tb.hosts}


class Outsider:
    """Sends every payload of tests/scripts/foreign.py from h3 to every port the job listens on, in
    rounds, for as long as the job runs (ports seen by ``obs``)."""

    def __init__(self, tb: Testbed, obs: Observer, job: Job, work: Path) -> None:
        self.tb, self.obs, self.job, self.work = tb, obs, job, work
        self.results: list[dict[str, str]] = []
        self.targets: set[tuple[str, int]] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _ports(self) -> set[tuple[str, int]]:
        return {(a, port) for p in list(self.obs.procs.values()) for a, port in p.ports
                if a != "127.0.0.1"}

    def _run(self) -> None:
        # the scheduler, both servers and both workers listening: the job is up
        while self.job.proc.poll() is None and len({p.pid for p in self.obs.procs.values()
                                                    if p.ports}) < 5:
            time.sleep(0.1)
        while self.job.proc.poll() is None:
            self.targets |= self._ports()
            r = subprocess.run(self.tb.on(OUTSIDER, PY, FOREIGN,
                                          *(f"{a}:{p}" for a, p in sorted(self.targets))),
                               capture_output=True, text=True, cwd=self.work, timeout=120)
            self.results += [json.loads(line) for line in r.stdout.splitlines()]
            time.sleep(0.5)

    def join(self) -> None:
        self._thread.join(150)


def attacked_job(tb: Testbed, work: Path, firewall: str
                 ) -> tuple[Job, Outsider, int, Observer]:
    hosts = work / "hosts"
    hosts.write_text(f"{tb.addr('h1')}\n{tb.addr('h2')}\n")
    obs = Observer(tb, str(work))
    job = start(tb, "h0", [*launch_argv(write_config(work), "ssh", "-H", str(hosts)),
                           "--firewall", firewall], work)
    outsider = Outsider(tb, obs, job, work)
    try:
        rc = job.wait(240)
        outsider.join()
    finally:
        obs.stop()
    return job, outsider, rc, obs


@pytest.mark.timeout(400)
def test_with_the_filter_the_job_finishes_bitwise_and_leaves_no_rule(
        testbed: Testbed, work: Path, reference: dict[str, list[dict]]) -> None:
    before = rulesets(testbed)
    job, outsider, rc, obs = attacked_job(testbed, work, "on")
    text = job.text()
    assert rc == 0, text[-4000:]
    assert "ssh could not connect" not in text
    check_placement(testbed, obs, "h0", set(JOB_HOSTS))
    # h3 reached nothing: every port of every role of the job, every payload, every round
    addrs = {a for a, _ in outsider.targets}
    assert addrs == {testbed.addr(h) for h in JOB_HOSTS}, outsider.targets
    assert len(outsider.targets) == 5, outsider.targets  # scheduler, 2 servers, 2 workers
    assert outsider.results and {r["result"] for r in outsider.results} == {"refused"}, \
        outsider.results[:10]
    assert not any(a in text for a in ABORTS)
    check_weights(work, reference)
    check_run(work, ",".join(testbed.addr(h) for h in JOB_HOSTS))
    # the filter said where it was and what it refused; then it was gone from every host
    assert re.search(r"\[launcher\] packet filter: on 198\.18\.0\.10 \(here\), 198\.18\.0\.11, "
                     r"198\.18\.0\.12, new TCP connections to ports 9091-9998, 10000-\d+ only "
                     r"from the job's hosts \(198\.18\.0\.10, 198\.18\.0\.11, 198\.18\.0\.12\)",
                     text), text[-4000:]
    refused = re.findall(r"packet filter removed from (\S+) .*?; (\d+) connection attempt", text)
    assert {h for h, _ in refused} == {testbed.addr(h) for h in JOB_HOSTS}, text[-3000:]
    # at least the first round, sent while every process listened, was the filter's doing (a
    # round after the job's end is refused by the kernel: nothing listens any more)
    per_host = {a: 5 * sum(1 for t, _ in outsider.targets if t == a) for a in addrs}
    assert all(int(n) >= per_host[h] for h, n in refused), (refused, per_host)
    assert rulesets(testbed) == before
    assert not anything_of(str(work))


# what ps-lite says when a malformed message ends it (mxlarge.launcher.pslog)
ABORTS = ("failed to parse string into protobuf", "msg->meta.sender != Meta::kEmpty")


@pytest.mark.timeout(400)
def test_without_it_the_job_fails_naming_the_cause(testbed: Testbed, work: Path) -> None:
    before = rulesets(testbed)
    job, outsider, rc, _ = attacked_job(testbed, work, "off")
    text = job.text()
    assert rc != 0, text[-4000:]
    assert "sent" in {r["result"] for r in outsider.results}, outsider.results[:10]
    m = re.search(r"^mxlarge: job failed: (.*)$", text, re.M)
    assert m, text[-4000:]
    cause = re.search(r"exited with (?:status 134|signal 6 \(SIGABRT\)): ps-lite aborted on a "
                      r"malformed message that arrived on its port (198\.18\.0\.1[012]):(\d+) "
                      r"\((?:van\.cc:520: failed to parse string into protobuf|van\.cc:225: "
                      r"msg->meta\.sender != Meta::kEmpty)\): something "
                      r"outside the job .*; its sender cannot be told here", m.group(1))
    assert cause, m.group(1)
    assert (cause.group(1), int(cause.group(2))) in outsider.targets
    run = the_run(work)
    assert run.info.status == "FAILED"
    assert run.data.tags["failure"] == m.group(1)
    assert "packet filter" not in text  # off means off: no guard, no line
    assert rulesets(testbed) == before
    assert not anything_of(str(work))



HOLD_FILTER = """
import sys, time
from mxlarge.launcher.firewall import SCHEDULER_PORTS, Host, packet_filter
with packet_filter(sys.argv[1], [Host("here"), Host.ssh(sys.argv[2])], SCHEDULER_PORTS,
                   lambda line: print(line, flush=True)):
    print("up", flush=True)
    time.sleep(120)
"""


def wait_for(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_killed_launcher_leaves_no_rule_and_a_killed_guard_is_cleaned_up_later(
        testbed: Testbed, work: Path) -> None:
    before = rulesets(testbed)
    # 1. kill -9 of the launcher (here: a process on h0 holding the filter on h0 and h1): the
    # remote guard reads end of file through ssh and removes its table. (The local guard does
    # the same when this runs by hand; under pytest here it was SIGKILLed from outside once
    # orphaned, and its table is then the stale one of part 2.)
    job = start(testbed, "h0", [PY, "-c", HOLD_FILTER, "aaaa00000001", testbed.addr("h1")], work)
    try:
        wait_for(lambda: "up" in job.text().split(), 60, f"the filter ({job.text()})")
        now = rulesets(testbed)
        for h in ("h0", "h1"):
            assert "table ip mxlarge_aaaa00000001_" in now[h], now[h]
        assert now["h2"] == before["h2"]
        subprocess.run(["pkill", "-9", "-P", str(job.proc.pid)], check=False)  # python under `on`
        job.proc.kill()
        job.proc.wait()
        wait_for(lambda: rulesets(testbed)["h1"] == before["h1"], 15, "h1's table to go")
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
    # 2. a guard killed -9 leaves its table (stale); the next guard on that host removes it
    job = start(testbed, "h1", [PY, "-c", HOLD_FILTER, "bbbb00000002", testbed.addr("h2")], work,
                log_name="job2.log")
    try:
        wait_for(lambda: "up" in job.text().split(), 60, f"the filter ({job.text()})")
        guard = next(pid for pid in _pids_with(" mxlarge-guard bbbb00000002 ")
                     if host_netns(testbed, pid) == "h1")
        subprocess.run(["kill", "-9", str(guard)], check=True)
        time.sleep(1)
        assert "table ip mxlarge_bbbb00000002_" in rulesets(testbed)["h1"]
    finally:
        job.proc.kill()
        job.proc.wait()
    wait_for(lambda: rulesets(testbed)["h2"] == before["h2"], 15, "h2's table to go")
    assert "table ip mxlarge_bbbb00000002_" in rulesets(testbed)["h1"]  # stale
    clean = subprocess.run(testbed.on("h1", PY, "-m", "mxlarge.launcher.firewall", "clean"),
                           capture_output=True, text=True, timeout=60, cwd=work)
    assert clean.returncode == 0, clean.stderr
    assert re.search(r"this host: removed stale mxlarge_bbbb00000002_\d+", clean.stdout), \
        clean.stdout
    assert rulesets(testbed)["h1"] == before["h1"]
    # anything left on h0 (part 1) goes the same way
    clean = subprocess.run(testbed.on("h0", PY, "-m", "mxlarge.launcher.firewall", "clean"),
                           capture_output=True, text=True, timeout=60, cwd=work)
    assert clean.returncode == 0, clean.stderr
    assert rulesets(testbed) == before


def _pids_with(needle: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode() + " ":
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def host_netns(tb: Testbed, pid: int) -> str | None:
    from tests.cluster.test_failures import host_of

    return host_of(tb, pid)


SHARED_FILTER = """
import os, sys, time
from mxlarge.launcher.firewall import SCHEDULER_PORTS, Host, packet_filter
job, host, own, stop = sys.argv[1:5]
with packet_filter(job, [Host.ssh(host)], SCHEDULER_PORTS, lambda line: print(line, flush=True),
                   own={own}):
    print("up", flush=True)
    while not os.path.exists(stop):
        time.sleep(0.1)
"""
REFUSED = """
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        print("connected", target, flush=True)
    except ConnectionRefusedError:
        print("refused", target, flush=True)
"""


@pytest.mark.timeout(120)
def test_two_jobs_sharing_a_host_each_count_the_attempts_at_their_own_ports(
        testbed: Testbed, work: Path) -> None:
    """Two jobs' filters on h1 at once (job a's process on port 20001, job b's on 20002); h3
    tries a's port 3 times and b's twice. Whichever table refuses an attempt first, each job
    reports its own: a 3, b 2."""
    before = rulesets(testbed)
    h1 = testbed.addr("h1")
    stop = work / "stop"
    jobs = {name: start(testbed, "h0", [PY, "-c", SHARED_FILTER, f"{name * 4}0000000{i}", h1,
                                        f"{h1}:{port}", str(stop)], work,
                        log_name=f"{name}.log")
            for i, (name, port) in enumerate((("a", 20001), ("b", 20002)))}
    try:
        for name, job in jobs.items():
            wait_for(lambda j=job: "up" in j.text().split(), 60, f"filter {name} ({job.text()})")
        r = subprocess.run(testbed.on("h3", PY, "-c", REFUSED, *[f"{h1}:20001"] * 3,
                                      *[f"{h1}:20002"] * 2),
                           capture_output=True, text=True, timeout=60, cwd=work)
        assert r.stdout.split().count("refused") == 5, r.stdout + r.stderr
        stop.write_text("")
        for job in jobs.values():
            job.wait(60)
    finally:
        stop.write_text("")
        for job in jobs.values():
            if job.proc.poll() is None:
                job.proc.kill()
    for name, want in (("a", 3), ("b", 2)):
        text = jobs[name].text()
        m = re.search(rf"packet filter removed from {re.escape(h1)} \(mxlarge_{name * 4}\w+; "
                      r"(\d+) connection attempt\(s\) from outside the job refused\)", text)
        assert m and int(m.group(1)) == want, (name, text)
    assert rulesets(testbed) == before
