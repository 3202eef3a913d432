"""A launched job's timeline (mxlarge.timeline): a real scheduler, server and 2 workers on
127.0.0.1 record steps 5-7 of the digits config; the launcher merges them into the run's
``timeline/trace.json``. A script of one's own records through ``$MXLARGE_TIMELINE``."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "proxy" / "digits-largebatch.yaml"
OWN_LOOP = REPO / "tests" / "scripts" / "own_loop.py"
STEPS = (5, 6, 7)


def _spans(trace: dict) -> dict[int, list[dict]]:
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_rank[e["pid"]].append(e)
    return by_rank


def _check_order(spans: list[dict], compute: tuple[str, ...]) -> set[int]:
    """Per recorded step: the compute spans, a push then a pull on every bucket, the update
    after every pull, the next step's compute after the update; returns the buckets' keys."""
    keys = {e["args"]["key"] for e in spans if e["cat"] == "bucket"}
    assert keys
    end = lambda e: e["ts"] + e["dur"]  # noqa: E731
    previous_update = None
    for t in STEPS:
        at = [e for e in spans if e["args"]["step"] == t]
        names = [e["name"] for e in at if e["cat"] == "compute"]
        assert names == list(compute), (t, names)
        first = next(e for e in at if e["cat"] == "compute")
        if previous_update is not None:
            assert first["ts"] >= end(previous_update) - 0.2, (t, first, previous_update)
        pulls = []
        for k in keys:
            (push,) = [e for e in at if e["name"] == "push" and e["args"]["key"] == k]
            (pull,) = [e for e in at if e["name"] == "pull" and e["args"]["key"] == k]
            assert push["args"]["bytes"] > 0 and push["tid"] == pull["tid"]
            assert abs(pull["ts"] - end(push)) <= 0.2 and pull["dur"] >= 0, (push, pull)
            pulls.append(pull)
        (update,) = [e for e in at if e["cat"] == "update"]
        assert update["name"] == "update"
        assert update["ts"] >= max(end(p) for p in pulls) - 0.2, (update, pulls)
        previous_update = update
    return keys


@pytest.mark.timeout(240)
@pytest.mark.parametrize("simulated", [1, 2])
def test_a_launched_run_logs_every_ranks_timeline_of_the_steps_asked(tmp_path, simulated):
    """With 2 simulated workers per process, each micro-batch's forward and backward."""
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n", "2",
                        "-s", "1", "train.epochs=24", "train.max_steps=12",
                        f"dist.simulate_workers={simulated}",
                        "train.timeline_start=5", "train.timeline_steps=3"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=220,
                       env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "[launcher] timeline of steps 5-7: 2 worker rank(s), " in r.stdout, r.stdout[-3000:]
    c = MlflowClient(uri)
    run = c.search_runs([e.experiment_id for e in c.search_experiments()])[0]
    assert [a.path for a in c.list_artifacts(run.info.run_id, "timeline")] == \
        ["timeline/trace.json", "timeline/trace.png"]
    path = c.download_artifacts(run.info.run_id, "timeline/trace.json", str(tmp_path))
    trace = json.loads(Path(path).read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    host = socket.gethostname()
    assert sorted(names) == [0, 1]
    assert all(names[r].startswith(f"worker rank {r} on {host} (pid ") for r in (0, 1)), names
    assert trace["otherData"]["clock_shift_s"] == {host: 0.0}
    spans = _spans(trace)
    keys = [_check_order(spans[r], ("forward", "backward") * simulated) for r in (0, 1)]
    assert keys[0] == keys[1]
    data = [e for e in spans[0] if e["cat"] == "data"]
    assert [e["args"]["step"] for e in data] == list(STEPS)


def test_a_window_past_the_run_or_outside_a_launched_job_is_refused(tmp_path):
    for extra, expected in (
            (["train.timeline_start=10", "train.max_steps=11"],
             "train.timeline_start = 10, train.timeline_steps = 3: expected steps within the "
             "run's 11 (0 to 10)"),
            (["train.timeline_start=1", "train.max_steps=11"],
             "train.timeline_start = 1: a timeline is recorded in a launched job")):
        r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "train", str(CONFIG),
                            "train.epochs=24", "tracking.enabled=false", "dist.kvstore=local",
                            "dist.workers=1", *extra],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and expected in r.stderr, r.stderr[-2000:]


def test_a_launch_whose_window_is_past_the_run_is_refused_before_anything_starts(tmp_path):
    """Exit 2 with the one-line reason, no process started and no MLflow run made."""
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "launch", str(CONFIG), "-n", "2",
                        "-s", "1", "train.epochs=24", "train.max_steps=11",
                        "train.timeline_start=10", "train.timeline_steps=3"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert ("train.timeline_start = 10, train.timeline_steps = 3: expected steps within the "
            "run's 11 (0 to 10)") in r.stderr, r.stderr[-2000:]
    assert "[launcher]" not in r.stdout and "MLflow run" not in r.stdout, r.stdout
    assert not (tmp_path / "mlruns.db").exists() or not MlflowClient(uri).search_runs(
        [e.experiment_id for e in MlflowClient(uri).search_experiments()])
    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                        "--env", "MXLARGE_TIMELINE=seven", "--", sys.executable, "-c", "pass"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "[launcher]" not in r.stdout, r.stdout + r.stderr
    assert "MXLARGE_TIMELINE='seven': expected START:STEPS, e.g. 5:3" in r.stderr, r.stderr


@pytest.mark.timeout(240)
def test_a_scripts_own_trainer_records_its_exchange_and_update(tmp_path, mlflow_uri):
    """tests/scripts/own_loop.py under ``python -m mxlarge.launcher --env MXLARGE_TIMELINE=5:3``:
    the trace and its picture in the job's run, with the script's forward+backward as one span;
    with ``--no-mlflow``, ``mxlarge-timeline.json`` here."""
    def launch(*extra: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                            *extra, "--env", "MXLARGE_TIMELINE=5:3", "--", sys.executable,
                            str(OWN_LOOP), "--steps", "10"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=110)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r

    launch()
    c = MlflowClient(mlflow_uri)
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert {a.path for a in c.list_artifacts(run.info.run_id, "timeline")} == \
        {"timeline/trace.json", "timeline/trace.png"}
    trace = json.loads(Path(c.download_artifacts(run.info.run_id, "timeline/trace.json",
                                                 str(tmp_path))).read_text())
    spans = _spans(trace)
    keys = [_check_order(spans[r], ("forward+backward",)) for r in (0, 1)]
    assert keys[0] == keys[1]
    r = launch("--no-mlflow")
    path = tmp_path / "mxlarge-timeline.json"
    assert f"[launcher] timeline: {path} (open it in https://ui.perfetto.dev)" in r.stdout
    spans = _spans(json.loads(path.read_text()))
    assert [_check_order(spans[r], ("forward+backward",)) for r in (0, 1)] == keys
