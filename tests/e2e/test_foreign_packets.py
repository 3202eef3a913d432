"""Bytes from outside the job on every port of a running local job (127.0.0.1 only).

Random and truncated frames, a short HTTP request and a TLS ClientHello go to every listening
socket of every process (scheduler, server, workers); what each did to each port is recorded
and pinned. A malformed message aborts ps-lite (protobuf parse check, SIGABRT): the launcher
must name that cause with the port, and with ``--max-restarts 1`` the job still finishes. The
cluster version (a fourth host, with and without the packet filter) is
``tests/cluster/test_foreign_host.py``.
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.test_launcher import (
    MARKER_VAR,
    PY,
    WORKER,
    assert_no_leftovers,
    listening_sockets,
    marked_processes,
    wait_until,
)
from tests.helpers import EQ_CONFIG
from tests.scripts.foreign import HARMLESS, RANDOM, client_hello

# a TLS ClientHello fails either check, by its random bytes (mxlarge.launcher.pslog)
CAUSE = (r"exited with signal 6 \(SIGABRT\): ps-lite aborted on a malformed message that "
         r"arrived on its port 127\.0\.0\.1:{port} \((?:van\.cc:520: failed to parse string into "
         r"protobuf|van\.cc:225: msg->meta\.sender != Meta::kEmpty)\): something outside the job")
ABORT_LINE = r"(?:failed to parse string into protobuf|msg->meta\.sender != Meta::kEmpty)"


class Output:
    """The launcher's merged output, read by a thread."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def close(self, proc: subprocess.Popen[str]) -> None:
        """Stop ``proc`` if it still runs; read its last lines."""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._thread.join(10)
        assert proc.stdout is not None
        proc.stdout.close()


class Ports:
    """Every listening socket of a job's processes: port -> (label, pid), labelled as the
    launcher names them (a worker by its kvstore rank, ``worker 1 (launch 0)`` where its launch
    index differs: child.process_label)."""

    def __init__(self, marker: str, text: str) -> None:
        procs = {pid: env for pid, env in marked_processes(marker).items() if "DMLC_ROLE" in env}
        self.sockets = listening_sockets(list(procs))
        workers = {int(m.group(2) or m.group(1)): m.group(0)[1:-1] for m in re.finditer(
            r"^\[worker (\d+)(?: \(launch (\d+)\))?\](?= kv_worker rank=\1 num_workers)",
            text, re.M)}  # launch index -> label
        self.label = {}
        for pid, _addr, port in self.sockets:
            env = procs[pid]
            role = env["MXLARGE_ROLE"]
            self.label[port] = ("scheduler" if role == "scheduler" else
                                workers[int(env["MXLARGE_LOCAL_RANK"])] if role == "worker" else
                                f"{role} {env['MXLARGE_LOCAL_RANK']}", pid)

    @staticmethod
    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    def send(self, payloads: dict[int, bytes], settle: float) -> dict[int, str]:
        """Send ``payloads[port]`` to each port at once (one fresh connection each), wait
        ``settle`` seconds; returns port -> "survives" / "aborts"."""
        conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for port in payloads]
        for conn, data in zip(conns, payloads.values()):
            conn.sendall(data)
        time.sleep(settle)
        for conn in conns:
            conn.close()
        return {port: "survives" if self.alive(self.label[port][1]) else "aborts"
                for port in payloads}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_garbage_on_every_port_is_named_and_one_restart_finishes_the_job() -> None:
    marker = f"foreign-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, MARKER_VAR: marker}
    proc = subprocess.Popen([PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                             "--max-restarts", "1", "--", PY, WORKER, "--sleep", "10"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Output(proc)
    record: dict[str, dict[str, str]] = {}  # label -> payload -> outcome
    try:
        wait_until(lambda: out.text().count("kv_worker ready") == 2, 90, "both workers ready")
        ports = Ports(marker, out.text())
        # every role listens, once each, on loopback only (the scheduler included)
        assert sorted(label.split(" (")[0] for label, _ in ports.label.values()) == \
            ["scheduler", "server 0", "worker 0", "worker 1"], ports.sockets
        assert len(ports.sockets) == 4, ports.sockets
        assert all(ipaddress.ip_address(a).is_loopback for _, a, _ in ports.sockets), ports.sockets
        every = list(ports.label)

        def note(kind: str, outcome: dict[int, str]) -> None:
            for port, result in outcome.items():
                record.setdefault(ports.label[port][0], {})[kind] = result

        for kind, data in HARMLESS.items():
            note(kind, ports.send(dict.fromkeys(every, data), 0.5))
        # A ClientHello's random bytes decide how ZeroMQ frames it (either outcome is fine).
        hello = client_hello()
        note("TLS ClientHello", ports.send(dict.fromkeys(every, hello), 1.0))
        left = [p for p in every if ports.alive(ports.label[p][1])]
        if len(left) == len(every):  # the job is still whole: random frames to every port
            note("4 KiB random", ports.send(dict.fromkeys(every, RANDOM), 1.0))
        assert proc.wait(120) == 0, out.text()[-4000:]
    finally:
        out.close(proc)
    print("\n".join(f"{label}: {kinds}" for label, kinds in sorted(record.items())))
    text = out.text()
    for label, kinds in record.items():
        for kind in HARMLESS:
            assert kinds[kind] == "survives", (label, kind, record)
        # every process that aborted said why, in its own output
        if "aborts" in kinds.values():
            assert re.search(rf"^\[{re.escape(label)}\] .*{ABORT_LINE}", text, re.M), \
                (label, text[-4000:])
    assert any("aborts" in kinds.values() for kinds in record.values()), record
    # the first abort the launcher saw is named with that process's port, and restarted
    m = re.search(r"^\[launcher\] restart 1/1 after: "
                  r"(scheduler|server 0|worker [01](?: \(launch [01]\))?) exited with .*? "
                  r"its port 127\.0\.0\.1:(\d+) ", text, re.M)
    assert m, text[-4000:]
    assert ports.label[int(m.group(2))][0] == m.group(1)
    assert re.search(CAUSE.format(port=m.group(2)), text), text[-4000:]
    assert record[m.group(1)].get("4 KiB random", record[m.group(1)]["TLS ClientHello"]) \
        == "aborts"
    assert "job finished" in text.splitlines()[-2], text[-2000:]  # then the run's line
    assert "MLflow run" in text.splitlines()[-1] and "FINISHED" in text.splitlines()[-1]
    assert_no_leftovers(marker)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mxlarge_launch_names_the_cause_in_the_restart_reason(tmp_path: Path) -> None:
    """`mxlarge launch` with MLflow: 4 KiB of random bytes on the scheduler's port as soon as
    it listens; the restart reason (tag) names the cause and the port; the job finishes."""
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG.replace("tracking: {enabled: false}",
                                     f"tracking: {{enabled: true, uri: 'sqlite:///{tmp_path}/"
                                     "mlruns.db'}"))
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.Popen([PY, "-m", "mxlarge.cli", "launch", str(cfg), "-n", "2", "-s", "1",
                             "--max-restarts", "1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = Output(proc)
    try:
        wait_until(lambda: re.search(r"scheduler on 127\.0\.0\.1:(\d+)", out.text()), 120,
                   "the scheduler's port")
        port = int(re.search(r"scheduler on 127\.0\.0\.1:(\d+)", out.text()).group(1))  # type: ignore[union-attr]
        deadline = time.monotonic() + 60
        while True:  # as soon as it listens
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                    conn.sendall(RANDOM)
                    time.sleep(0.5)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, out.text()
                time.sleep(0.05)
        assert proc.wait(240) == 0, out.text()[-4000:]
    finally:
        out.close(proc)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    reason = runs[0].data.tags["restart_1_reason"]
    assert re.match("scheduler " + CAUSE.format(port=port), reason), reason
