"""The MLflow UI as a user sees it (`make test-ui`, not part of `make test`): a store made by two
short launches (seeds 0 and 1), a 2-label sweep with its report and a launch whose silent worker
(the one that prints nothing) is killed, served by `mlflow server` on 127.0.0.1, rendered by
headless Chromium (`--dump-dom`, JavaScript run for a virtual 30 s), and read as text: names
that differ within the runs list's width, the list's metric columns, the description, params
only where they take effect, one throughput per name, the metric sections, the system metrics
with the job's own, the logged model, the sweep's comparison and plots, and the evidence of a
failure whose process printed nothing."""
from __future__ import annotations

import html
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from mxlarge.tracking import SAMPLE_EVERY
from tests.helpers import cli, dmlc_processes, mlflow_server

ROOT = Path(__file__).resolve().parents[2]
LARGEBATCH = str(ROOT / "experiments/proxy/digits-largebatch.yaml")
BASELINE = str(ROOT / "experiments/proxy/digits-baseline.yaml")
SHORT = ["train.epochs=2", "train.progress=false", "optim.decay_epochs=[1]",
         "optim.warmup_epochs=1"]
VIEW = "workflowType=machine_learning"
# the killed job: 5 steps per epoch, progress every 2 steps; killed once rank 0 passed KILL_AT
KILL_AT = 12


def _page(port: int, route: str, out: Path) -> str:
    """The text of ``#/ROUTE`` once its JavaScript ran (tags, scripts and styles removed)."""
    chromium = os.environ.get("CHROMIUM", "chromium")
    r = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--virtual-time-budget=30000", "--window-size=1600,2400", "--dump-dom",
         f"http://127.0.0.1:{port}/#/{route}"],
        capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    out.with_suffix(".html").write_text(r.stdout)  # the DOM, for what text does not show
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", r.stdout, flags=re.S)
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text)))
    out.write_text(text)  # kept in the test's directory, for a failing assertion
    return text


def _kill_the_silent_worker(cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Launches 2 workers and, once kvstore rank 0 (the one that prints progress) passed step
    :data:`KILL_AT`, SIGKILLs the other, which has printed nothing. Returns the victim's
    launch index and the job's output."""
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
            m = re.match(r"\[worker (\d+)\] step (\d+)/", line)
            if m and int(m.group(2)) >= KILL_AT:
                index = 1 - int(m.group(1))
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
    """(port, client, run ids, directory) of a served store holding the four kinds of run."""
    tmp = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp}/ui.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for d in ("launch", "sweep", "failed"):
        (tmp / d).mkdir()
    MlflowClient(tracking_uri=uri).search_experiments()  # the schema, before the server reads it
    with mlflow_server(uri, tmp) as port:  # starting while the store is made
        yield port, *_store(uri, tmp, env)


def _store(uri: str, tmp: Path, env: dict[str, str]) -> tuple[MlflowClient, dict, Path]:
    """Makes the store: two launches, the sweep and its report, the killed job; returns the
    client, the run ids (and the victim's launch index and what rank 0 printed), ``tmp``."""
    for seed in (0, 1):
        r = cli(["launch", LARGEBATCH, "-n", "2", "-s", "1", *SHORT, f"train.seed={seed}"],
                tmp / "launch", env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sweep = tmp / "sweep" / "ui.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "ui", "mode": "train", "seeds": [0],
        "runs": [{"label": "base", "config": BASELINE},
                 {"label": "big", "config": BASELINE, "overrides": ["data.batch_size=128"]}],
        "overrides": ["data.batch_size=64", *SHORT]}))
    for args in (["sweep", str(sweep)], ["report", "ui", "--out", str(tmp / "sweep" / "rep")]):
        r = cli(args, tmp / "sweep", env=env, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    victim, printed = _kill_the_silent_worker(tmp / "failed", env)
    assert not [x for x in printed.splitlines() if x.startswith(f"[worker {victim}] ")]

    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name("mxlarge").experiment_id
    runs = c.search_runs([exp])
    launches = sorted((x for x in runs if x.info.status == "FINISHED"
                       and x.data.tags.get("launcher") and "sweep" not in x.data.tags),
                      key=lambda x: x.data.params["train.seed"])
    ids = {"exp": exp, "launches": [x.info.run_id for x in launches],
           "failed": next(x.info.run_id for x in runs if x.info.status == "FAILED"),
           "parent": next(x.info.run_id for x in runs if x.data.tags.get("sweep_parent")),
           "victim": victim,
           "printed": [x.split("] ", 1)[1] for x in printed.splitlines()
                       if x.startswith(f"[worker {1 - victim}] ")],
           "cells": sorted((x.info.run_id for x in runs if x.data.tags.get("sweep") == "ui"),
                           key=lambda i: c.get_run(i).data.tags["sweep_label"])}
    return c, ids, tmp


@pytest.mark.timeout(900)
def test_launched_runs_differ_within_the_list_and_show_what_took_effect(served):
    port, c, ids, tmp = served
    names = [c.get_run(i).data.tags["mlflow.runName"] for i in ids["launches"]]
    # the config's name, what the overrides changed (the epochs), the seed (issue 56)
    assert names == ["digits-largebatch 2ep s0", "digits-largebatch 2ep s1"]
    route = f"experiments/{ids['exp']}/runs/{ids['launches'][0]}"
    page = _page(port, f"{route}?{VIEW}", tmp / "launch.txt")
    assert names[0] in page
    # the description, rendered: what it trains and the plan's table
    assert ("Description digits-largebatch ( experiments/proxy/digits-largebatch.yaml ): "
            "small_resnet on digits, 2 worker(s) x 128 images = global batch 256") in page
    assert "global_batch 256" in page and "plan.peak_lr" in page
    # params only where they take effect: step decay, no LARS, no noise scale, no compression
    assert "optim.decay_epochs" in page
    for key in ("optim.lars_eta", "optim.poly_power", "train.gns_decay",
                "dist.compression_threshold", "train.max_steps"):
        assert key not in page, key
    # the logged model, named after the run
    assert re.search(r"Logged models \(1\).* digits-largebatch-2ep-s0 Ready", page), \
        page[-3000:]
    # one throughput per name: the last epoch's and the median over epochs (the report's)
    run = c.get_run(ids["launches"][0])
    ips = [m.value for m in c.get_metric_history(run.info.run_id, "perf/images_per_sec")]
    assert run.data.metrics["perf/images_per_sec_median"] == pytest.approx(
        sorted(ips)[len(ips) // 2] if len(ips) % 2 else sum(sorted(ips)[:2]) / 2)
    assert "perf/images_per_sec_median" in page

    charts = _page(port, f"{route}/model-metrics?{VIEW}", tmp / "launch-metrics.txt")
    # MLflow's sections, by the metric's prefix, with their chart counts: perf = the total, its
    # median, the two workers' own images/s and train_seconds; train = epoch, loss, lr, samples;
    # val = the four evaluations and best_accuracy, final_error
    for section in ("perf (5) Add chart", "train (4) Add chart", "val (6) Add chart"):
        assert section in charts, section

    # system metrics every 2 s over the whole run: a curve for a short run, with the job's own
    # processes (how many points depends on how long this machine took, so the count is checked
    # against the run's own duration, the spacing against the interval)
    hist = c.get_metric_history(run.info.run_id, "system/cpu_utilization_percentage")
    seconds = (run.info.end_time - run.info.start_time) / 1000
    assert len(hist) >= max(2, seconds / SAMPLE_EVERY[0] - 3), (len(hist), seconds)
    stamps = sorted(m.timestamp for m in hist)
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:]))
    assert 0.75 * SAMPLE_EVERY[0] <= gaps[len(gaps) // 2] / 1000 <= 1.5 * SAMPLE_EVERY[0], gaps
    job = c.get_metric_history(run.info.run_id, "system/job_processes")
    assert len(job) == len(hist) and max(m.value for m in job) >= 4  # scheduler, server, 2 w.
    assert {"system/job_cpu_utilization_percentage",
            "system/job_memory_usage_megabytes"} < set(run.data.metrics)
    system = _page(port, f"{route}/system-metrics?{VIEW}", tmp / "launch-system.txt")
    # MLflow's 8 charts (CPU, memory MB and %, disk free, used MB and %, network in and out)
    # and the job's 3 (the charts' titles render only once scrolled to)
    assert "System metrics (11) Add chart" in system

    # the runs list opens with the metric columns that matter (MLflow's shared view)
    listed = _page(port, f"experiments/{ids['exp']}/runs?viewStateShareKey=mxlarge&{VIEW}",
                   tmp / "runs.txt")
    assert "You're viewing a shared view" in listed
    assert ("Metrics Duration perf/images_per_sec_median train/loss val/best_accuracy "
            "val/final_error") in listed  # the columns' header (MLflow sorts them by name)
    assert "sweep ui" in listed and names[1] in listed
    # the Models page: each logged model named after its run
    models = _page(port, f"experiments/{ids['exp']}/models?{VIEW}", tmp / "models.txt")
    for name in ("digits-largebatch-2ep-s0", "digits-largebatch-2ep-s1", "base-1x64-2ep-s0",
                 "big-1x128-2ep-s0"):
        assert name in models, name


@pytest.mark.timeout(900)
def test_the_sweep_parent_compares_its_labels_in_one_picture(served):
    port, c, ids, tmp = served
    names = [c.get_run(cell).data.tags["mlflow.runName"] for cell in ids["cells"]]
    assert names == ["base 1×64 2ep s0", "big 1×128 2ep s0"]
    page = _page(port, f"experiments/{ids['exp']}/runs/{ids['cells'][1]}?{VIEW}",
                 tmp / "big.txt")
    assert names[1] in page and "Parent run sweep ui" in page
    # a local cell (one process, one CPU device): its world is plan.*, no dist.* param
    assert "plan.workers" in page and not re.search(r"\bdist\.\w+", page), page[:3000]
    parent = c.get_run(ids["parent"])
    assert parent.data.tags["sweep_labels"] == "base, big"  # the labels that ran
    assert "" not in parent.data.params.values() and "sweep.labels" not in parent.data.params
    # no per-label metrics: MLflow would draw each as a chart of one bar with its own scale
    assert parent.data.metrics == {}
    route = f"experiments/{ids['exp']}/runs/{ids['parent']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "parent.txt")
    assert "Description sweep ui : target accuracy" in page
    # the table that fits: six columns, each label's final error as the cell's own
    assert "label workers batch final error % images/s speedup" in page
    finals = {label: c.get_run(cell).data.metrics["val/final_error"]
              for label, cell in zip(("base", "big"), ids["cells"])}
    for label, workers, batch in (("base", 1, 64), ("big", 1, 128)):
        assert f" {label} {workers} {batch} {100 * finals[label]:.2f} ± n/a " in page, label
    # the comparison: one picture with both labels, the first image of the description,
    # served by MLflow from the run's artifacts; then the report's plots, as images
    dom = html.unescape((tmp / "parent.html").read_text())
    images = re.findall(r'<img[^>]*?src="(get-artifact\?path=([^&"]+)&[^"]*)"[^>]*>', dom)
    assert [p for _, p in images] == ["compare.png", "val_error.png",
                                      "final_error_vs_batch.png", "loss_lr.png"], images
    assert re.search(r'<img[^>]*alt="compare: base, big"', dom)
    for src, _ in images:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/{src}", timeout=30) as r:
            assert r.read(8) == b"\x89PNG\r\n\x1a\n", src
    assert not c.list_artifacts(ids["parent"], "images")  # no logged images: no pile
    charts = _page(port, f"{route}/model-metrics?{VIEW}", tmp / "parent-metrics.txt")
    assert not re.search(r"\b(compare|report|base|big) \(\d+\) Add chart", charts)


@pytest.mark.timeout(900)
def test_a_silent_failed_worker_leaves_evidence(served):
    port, c, ids, tmp = served
    run = c.get_run(ids["failed"])
    tags = run.data.tags
    victim = ids["victim"]
    assert tags["failed_role"] == "worker" and tags["failed_launch_index"] == str(victim)
    assert tags["failed_kvstore_rank"] == "1"  # the rank that prints nothing
    # failed_step: the last completed step, no metric beyond it
    last = max(m.step for k in ("train/loss", "train/samples")
               for m in c.get_metric_history(run.info.run_id, k))
    assert int(tags["failed_step"]) >= last >= KILL_AT
    route = f"experiments/{ids['exp']}/runs/{ids['failed']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "failed.txt")
    for key in ("failed_step", "failed_kvstore_rank", "failed_host"):
        assert f"{key} : {tags[key]}" in page, key
    system = [k for k in run.data.metrics if k.startswith("system/")]
    assert "system/job_cpu_utilization_percentage" in system, system

    # the viewer highlights the text: compare without blanks
    log = re.sub(r"\s", "", _page(port, f"{route}/artifacts/failure/worker-1.log?{VIEW}",
                                  tmp / "failed-log.txt"))
    assert f"#worker{victim}exitedwithsignal9(SIGKILL);itslast0line(s)ofoutput" in log
    beat = re.search(r"#itslastheartbeat:workerrank1on\S+?\(pid\d+\):step(\d+),phasetrain", log)
    assert beat and int(beat.group(1)) <= int(tags["failed_step"]), log[:3000]
    assert "#meanwhileworkerrank0" in log and "(itprintednothingonstdoutorstderr)" in log

    job = re.sub(r"\s", "", _page(port, f"{route}/artifacts/failure/job.log?{VIEW}",
                                  tmp / "failed-job.txt"))
    assert f"##[worker{victim}]killedbysignal9;itslast0line(s)ofoutput:none" in job
    assert "##[scheduler]" in job and "##[server0]" in job
    assert ids["printed"] and all(re.sub(r"\s", "", x) in job for x in ids["printed"][-3:])
