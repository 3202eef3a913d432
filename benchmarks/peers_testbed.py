"""The peers benchmark on the namespace testbed: 3 hosts, each link shaped to a rate.

``python -m benchmarks.peers --part testbed`` (``make bench-peers-cluster``; root only). Hosts
h0, h1, h2 of :mod:`mxlarge.testbed` (network namespaces 198.18.0.10-12 on one bridge);
every host's link is limited to :data:`RATE` in both directions with ``tc tbf`` (egress of the
host's ``eth0`` and of its bridge port), each of :data:`RATES` in turn (``--rate``): at 1
Gbit/s the two shared cores are the limit, at 200 Mbit/s the link is (every row records how
busy the machine's cores and each host's worker were). Jobs are started on h0 through the
testbed's ``on``
wrapper:

* dist_sync peers: ``python -m mxlarge.launcher -n 3 -s 3 --launcher ssh -H hosts
  --no-mlflow`` with the hosts' addresses: the scheduler on h0, one server and one worker
  per host; with ``--server-hosts N`` the 3 servers on N more hosts h3... (``role=server``
  lines, every link shaped alike), the workers and Horovod's ranks on h0..h2 as before;
* Horovod (both peers): ``horovodrun -H h0:1,h1:1,h2:1 --gloo --network-interface eth0``
  over the testbed's ssh, its own sockets bound to h0's address
  (:mod:`benchmarks.horovodrun_bound`).

The testbed is shared with other work: everything here (up, the link measurement, the jobs,
teardown) runs under :func:`mxlarge.testbed.exclusive` (the lock the cluster tests share),
refuses to touch a testbed it did not bring up, and removes its qdiscs and the testbed
afterwards, also on failure.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO, Any

from benchmarks.common import BenchmarkError

RATES = ("1gbit", "200mbit")
TBF = ("burst", "256kb", "latency", "10ms")
WORKERS = 3


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True, capture_output=True, text=True)


def shape(tb: Any, rate: str) -> None:
    """tbf ``rate`` on every host's eth0 (its egress) and bridge port (its ingress)."""
    from mxlarge.testbed import BRIDGE_NS

    for i, h in enumerate(tb.hosts):
        _tc("-n", tb.netns(h), "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
            *TBF)
        _tc("-n", BRIDGE_NS, "qdisc", "replace", "dev", f"v{i}", "root", "tbf", "rate", rate,
            *TBF)


def unshape(tb: Any) -> None:
    from mxlarge.testbed import BRIDGE_NS

    for i, h in enumerate(tb.hosts):
        for ns, dev in ((tb.netns(h), "eth0"), (BRIDGE_NS, f"v{i}")):
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)


def link_rate(tb: Any, mbytes: int = 100) -> float:
    """Gbit/s of one bounded TCP transfer h0 → h1 (:mod:`benchmarks.link_rate`)."""
    port = "5201"
    server = subprocess.Popen(tb.on("h1", sys.executable, "-m", "benchmarks.link_rate",
                                    "server", tb.addr("h1"), port),
                              stdout=subprocess.PIPE, text=True, cwd=_root())
    try:
        time.sleep(1.0)
        subprocess.run(tb.on("h0", sys.executable, "-m", "benchmarks.link_rate", "client",
                             tb.addr("h1"), port, str(mbytes)), check=True, cwd=_root(),
                       capture_output=True, timeout=120)
        out, _ = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return float(out.split()[0])


def _root() -> str:
    return str(Path(__file__).resolve().parents[1])


def testbed_launcher(tb: Any, work: Path, server_hosts: list[str]) -> Any:
    """Runs a peer's job from h0 across h0..h2 (module docstring), the dist_sync peers'
    servers on ``server_hosts`` (``role=server`` lines) if any."""
    from benchmarks.peers_jobs import HOROVOD_PEERS, WORKER, PeerOutput, check_job, job_env, stream

    workers = [h for h in tb.hosts if h not in server_hosts]
    hostfile = work / "hosts"
    hostfile.write_text("".join(f"{tb.addr(h)}\n" for h in workers) +
                        "".join(f"{tb.addr(h)} role=server\n" for h in server_hosts))

    def run(peer: str, args: list[str], out: PeerOutput) -> None:
        argv = [sys.executable, "-m", WORKER, "--peer", peer, *args]
        if peer in HOROVOD_PEERS:
            cmd = [sys.executable, "-m", "benchmarks.horovodrun_bound", "--bind", tb.addr("h0"),
                   "-np", str(WORKERS), "-H", ",".join(f"{h}:1" for h in workers), "--gloo",
                   "--network-interface", "eth0", "--", *argv]
        else:
            cmd = [sys.executable, "-m", "mxlarge.launcher", "-n", str(WORKERS), "-s",
                   str(WORKERS), "--launcher", "ssh", "-H", str(hostfile), "--host-ip",
                   tb.addr("h0"), "--no-mlflow", "--", *argv]
        code = stream(tb.on("h0", *cmd), {**os.environ, **job_env()}, out, cwd=_root())
        out.flush()
        check_job(peer, WORKERS, code, f"{cmd[2]} exited {code}", out)

    return run


def run_testbed(a: argparse.Namespace, log: IO[str]) -> dict[str, dict[str, Any]]:
    """Brings the testbed up (under the lock), and per rate of ``a.rate`` shapes it and runs
    the timing rounds; tears down. rate → part of peers.json."""
    from benchmarks.peers_jobs import TARGETS, run_timing
    from mxlarge.testbed import Testbed, TestbedError, exclusive, our_namespaces

    parts: dict[str, dict[str, Any]] = {}
    with exclusive():
        if our_namespaces():
            raise BenchmarkError(f"testbed namespaces {', '.join(our_namespaces())} exist "
                                 "without the lock's holder: someone else's testbed is up; "
                                 "not touching it")
        tb = Testbed(n=WORKERS + a.server_hosts)
        homes = tb.hosts[WORKERS:]
        try:
            tb.up()
        except TestbedError as e:
            raise BenchmarkError(f"testbed: {e}") from None
        work = tb.root / "work" / f"peers-{uuid.uuid4().hex[:8]}"
        try:
            work.mkdir(parents=True)
            for rate in a.rate:
                print(f"peers: testbed, {WORKERS} hosts at {rate} per link", flush=True)
                shape(tb, rate)
                gbit = link_rate(tb, mbytes=100 if rate.endswith("gbit") else 25)
                print(f"  link h0 → h1 with tbf {rate}: {gbit:.3f} Gbit/s", flush=True)
                placed = (f"dist_sync peers: {WORKERS} servers on the server hosts "
                          f"{', '.join(homes)} (role=server lines), scheduler on h0" if homes
                          else "dist_sync peers: one server per host, scheduler on h0")
                part = run_timing(
                    a, testbed_launcher(tb, work, homes), WORKERS, log,
                    f"{WORKERS} hosts (network namespaces on one 2-core machine), one worker "
                    f"per host; {placed}; "
                    f"horovod: 3 ranks over gloo on eth0. Every host link shaped with tc tbf "
                    f"{rate} each way (measured h0 → h1: {gbit:.3f} Gbit/s, one TCP transfer). "
                    f"OMP_NUM_THREADS=1; SGD η 0.1, m 0.9, λ 1e-4 on every tensor, constant η.",
                    TARGETS["testbed"], tmpdir=work)
                part["link_gbit_s"] = gbit
                part["rate"] = rate
                part["server_hosts"] = homes
                parts[rate] = part
            return parts
        finally:
            unshape(tb)
            shutil.rmtree(work, ignore_errors=True)
            tb.down()
