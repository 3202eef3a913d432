"""Shared test helpers: run the CLI, read parameter files, find a job's processes."""
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mxnet as mx

# A 12-step run through warmup and a decay, with momentum; digits; no BN (small_plain).
EQ_CONFIG = """
name: eq
data: {dataset: digits, batch_size: 8, augment: true}
model: {name: small_plain, width: 4}
optim: {base_lr: 0.05, reference_batch: 16, warmup: linear, warmup_epochs: 0.08,
        decay: step, decay_epochs: [0.12], momentum: 0.9, weight_decay: 0.0005}
train: {epochs: 1, max_steps: 12, progress: false}
dist: {kvstore: dist_sync, workers: 2, check_every: 1}
tracking: {enabled: false}
"""
# The same with BatchNorm (small_resnet).
BN_CONFIG = EQ_CONFIG.replace("small_plain, width: 4", "small_resnet, width: 4")


def cli(args, cwd, timeout=240, env=None) -> subprocess.CompletedProcess:
    """``python -m mxlarge.cli ARGS`` in ``cwd``: the one CLI runner of the tests (also the
    ``run_cli`` fixture). ``MLFLOW_TRACKING_URI`` is dropped unless ``env`` sets it, so MLflow goes
    to ``cwd/mlruns.db`` by default."""
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "mxlarge.cli", *map(str, args)], cwd=cwd,
                          env=full, capture_output=True, text=True, timeout=timeout)


def load_params(path):
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def dmlc_processes(marker: str, role: str | None = None) -> list[int]:
    """Live processes with ``DMLC_ROLE`` (= ``role`` if given) whose environment or argv
    mentions ``marker``."""
    want = f"DMLC_ROLE={role or ''}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            argv = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().split()[2]
        except OSError:
            continue
        if want in env and marker.encode() in env + argv and state != "Z":
            found.append(int(d.name))
    return found


def write_yaml(path: Path, tree: dict) -> Path:
    """Writes ``tree`` as YAML (keys in order) and returns ``path``."""
    import yaml

    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


@contextlib.contextmanager
def mlflow_server(uri: str, cwd: Path) -> Iterator[int]:
    """``mlflow server`` over the store ``uri`` on 127.0.0.1 (its own session, one worker), up
    and answering ``/health``; yields its port and ends it (the whole group) afterwards."""
    from mxlarge.launcher import free_port

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "MLFLOW_TRACKING_URI": ""})
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                assert time.monotonic() < deadline, "mlflow server did not come up"
                time.sleep(2)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def one_script_run(script: str, optimizer: str, workers: int = 2):  # type: ignore[no-untyped-def]
    """The launch of an own script (``python -m mxlarge.launcher``) in the store
    ``$MLFLOW_TRACKING_URI`` (each launching test has its own): exactly one run, FINISHED,
    named after ``script``, with the world and the Trainer's settings as params, the LR, the
    rate and rank 0's breakdown as metrics, and the ranks' breakdown picture. Returns it."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert (run.info.status, run.info.run_name) == ("FINISHED", script), run.info
    p = run.data.params
    assert (p["workers"], p["servers"], p["launcher"]) == (str(workers), "1", "local"), p
    assert p["optim.optimizer"] == optimizer and "plan.global_batch" in p, p
    assert {"train/lr", "train/samples", "perf/images_per_sec",
            "breakdown/rank0/step_ms"} <= set(run.data.metrics), run.data.metrics
    assert [a.path for a in c.list_artifacts(run.info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"]
    return run


class DutyCycle:
    """SIGSTOP for ``off`` seconds, SIGCONT for ``on`` seconds, repeatedly, until stopped: a
    process that gets ``on / (on + off)`` of the time it would."""

    def __init__(self, pid: int, off: float = 0.01, on: float = 0.01) -> None:
        self.pid, self.off, self.on = pid, off, on
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                os.kill(self.pid, signal.SIGSTOP)
                time.sleep(self.off)
                os.kill(self.pid, signal.SIGCONT)
                time.sleep(self.on)
        except ProcessLookupError:
            pass
        finally:
            try:
                os.kill(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
