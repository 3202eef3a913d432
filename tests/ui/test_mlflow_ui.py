"""The MLflow UI as a user sees it (`make test-ui`, not part of `make test`): a store made by a
short launch, a 2-cell sweep with its report and a launch whose worker is killed, served by
`mlflow server` on 127.0.0.1, rendered by headless Chromium (`--dump-dom`, JavaScript run for a
virtual 30 s), and read as text: the run names, the description, the metric sections, the
logged model and the failure's evidence must be on the pages."""
from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.helpers import cli, dmlc_processes, mlflow_server

ROOT = Path(__file__).resolve().parents[2]
LARGEBATCH = str(ROOT / "experiments/proxy/digits-largebatch.yaml")
BASELINE = str(ROOT / "experiments/proxy/digits-baseline.yaml")
SHORT = ["train.epochs=2", "train.progress=false", "optim.decay_epochs=[1]",
         "optim.warmup_epochs=1"]
VIEW = "workflowType=machine_learning"


def _page(port: int, route: str, out: Path) -> str:
    """The text of ``#/ROUTE`` once its JavaScript ran (tags, scripts and styles removed)."""
    chromium = os.environ.get("CHROMIUM", "chromium")
    r = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=30000", "--window-size=1600,2400", "--dump-dom",
         f"http://127.0.0.1:{port}/#/{route}"],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", r.stdout, flags=re.S)
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))
    out.write_text(text)  # kept in the test's directory, for a failing assertion
    return text


def _kill_a_worker(cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Launches 2 workers and SIGKILLs the one that printed the first progress line (kvstore
    rank 0, so that its output has lines to show). Returns its launch index and the output."""
    env = {**env, "MXLARGE_UI_TEST_JOB": str(cwd)}  # marks the job's processes
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", LARGEBATCH,
                             "-n", "2", "-s", "1", "train.epochs=100", "train.log_every=2",
                             "train.progress=false"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if m := re.match(r"\[worker (\d+)\] step \d+/", line):
                index = int(m.group(1))
                break
        (victim,) = [p for p in dmlc_processes(str(cwd), "worker") if
                     f"MXLARGE_LOCAL_RANK={index}\0".encode()
                     in Path(f"/proc/{p}/environ").read_bytes()]
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, "".join(seen)
    return index, "".join(seen) + out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(port, client, run ids) of a served store holding the four kinds of run."""
    tmp = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp}/ui.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for d in ("launch", "sweep", "failed"):
        (tmp / d).mkdir()
    r = cli(["launch", LARGEBATCH, "-n", "2", "-s", "1", *SHORT], tmp / "launch", env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sweep = tmp / "sweep" / "ui.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "ui", "mode": "train", "seeds": [0, 1],
        "runs": [{"label": "base", "config": BASELINE}],
        "overrides": ["data.batch_size=64", *SHORT]}))
    for args in (["sweep", str(sweep)], ["report", "ui", "--out", str(tmp / "sweep" / "rep")]):
        r = cli(args, tmp / "sweep", env=env, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    victim, printed = _kill_a_worker(tmp / "failed", env)

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("mxlarge").experiment_id
    runs = c.search_runs([exp])
    ids = {"exp": exp,
           "launch": next(x.info.run_id for x in runs if x.info.status == "FINISHED"
                          and x.data.tags.get("launcher") and "sweep" not in x.data.tags),
           "failed": next(x.info.run_id for x in runs if x.info.status == "FAILED"),
           "parent": next(x.info.run_id for x in runs if x.data.tags.get("sweep_parent")),
           "victim": victim,
           "victim_lines": [x.split("] ", 1)[1] for x in printed.splitlines()
                            if x.startswith(f"[worker {victim}] ")],
           "cells": sorted((x.info.run_id for x in runs if x.data.tags.get("sweep") == "ui"),
                           key=lambda i: c.get_run(i).data.tags["seed"])}
    with mlflow_server(uri, tmp) as port:
        yield port, c, ids, tmp


@pytest.mark.timeout(900)
def test_a_launched_run_shows_its_name_description_sections_and_model(served):
    port, c, ids, tmp = served
    run = c.get_run(ids["launch"])
    assert run.data.tags["mlflow.runName"] == "digits-largebatch · 2×128 · seed 0"
    route = f"experiments/{ids['exp']}/runs/{ids['launch']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "launch.txt")
    assert "digits-largebatch · 2×128 · seed 0" in page
    # the description, rendered: what it trains and the plan's table
    assert ("Description digits-largebatch ( experiments/proxy/digits-largebatch.yaml ): "
            "small_resnet on digits, 2 worker(s) x 128 images = global batch 256") in page
    assert "global_batch 256" in page and "plan.peak_lr" in page
    assert re.search(r"Logged models \(1\).* model Ready", page), page[-3000:]
    charts = _page(port, f"{route}/model-metrics?{VIEW}", tmp / "launch-metrics.txt")
    # MLflow's sections, by the metric's prefix, with their chart counts: perf = the total and
    # the two workers' own images/s and train_seconds; train = epoch, loss, lr, samples (no
    # second loss); val = the four evaluations and best_accuracy, final_error
    for section in ("perf (4) Add chart", "train (4) Add chart", "val (6) Add chart"):
        assert section in charts, section


@pytest.mark.timeout(900)
def test_sweep_cells_are_told_apart_and_the_parent_holds_the_report(served):
    port, c, ids, tmp = served
    for seed, cell in enumerate(ids["cells"]):
        page = _page(port, f"experiments/{ids['exp']}/runs/{cell}?{VIEW}", tmp / f"c{seed}.txt")
        assert f"base · 1×64 · seed {seed}" in page
    page = _page(port, f"experiments/{ids['exp']}/runs/{ids['parent']}?{VIEW}",
                 tmp / "parent.txt")
    assert "sweep ui" in page and "Description sweep ui : target accuracy" in page
    assert "final error % (mean ± std)" in page  # the report's table as the description
    assert "base/final_error" in page and "sweep.seeds 0,1" in page
    runs = _page(port, f"experiments/{ids['exp']}/runs?{VIEW}", tmp / "runs.txt")
    assert "sweep ui" in runs and "digits-largebatch · 2×128 · seed 0" in runs


@pytest.mark.timeout(900)
def test_a_failed_run_shows_where_it_failed_and_the_evidence(served):
    port, c, ids, tmp = served
    tags = c.get_run(ids["failed"]).data.tags
    victim = ids["victim"]
    assert tags["failed_role"] == "worker" and tags["failed_launch_index"] == str(victim)
    assert tags["failed_kvstore_rank"] == "0"  # it printed rank 0's progress lines
    route = f"experiments/{ids['exp']}/runs/{ids['failed']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "failed.txt")
    for key in ("failed_step", "failed_kvstore_rank", "failed_host"):
        assert f"{key} : {tags[key]}" in page, key
    log = _page(port, f"{route}/artifacts/failure/worker-0.log?{VIEW}",
                tmp / "failed-log.txt")
    assert "failure/worker-0.log" in log  # by its kvstore rank
    # the viewer highlights the text: compare without blanks
    shown = re.sub(r"\s", "", log)
    assert f"#worker{victim}exitedwithsignal9(SIGKILL);itslast" in shown
    assert ids["victim_lines"] and all(re.sub(r"\s", "", x) in shown
                                       for x in ids["victim_lines"][-3:])
