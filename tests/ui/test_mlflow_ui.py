"""The MLflow UI as a user sees it (`make test-ui`, not part of `make test`): a store made by two
short launches of one config that differ in epochs, a 2-label sweep with its report, a launch
whose silent worker (the one that prints nothing) is killed and one whose silent worker is
stopped until the watchdog ends the job, served by `mlflow server` on 127.0.0.1 and rendered by
headless Chromium: read as text (`--dump-dom`, JavaScript run for a virtual 30 s) and, for
what text cannot tell (a name cut short, an image that did not load), by a script in the page
(tests/ui/browser.py). The experiment opening on its runs, names that differ within the runs
list's width, the list's metric columns, the description, params only where they take effect
(no dist.* on a sweep's local cell), one throughput per name, the metric sections, the system
metrics with the job's own, the logged model, the sweep's comparison in one picture, and a
failed or stalled worker named by one kvstore rank everywhere, with its failed_* tags (the
failed one with the ranks' breakdown picture beside its evidence)."""
from __future__ import annotations

import html
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from mxlarge.launcher.child import process_label
from mxlarge.tracking import SAMPLE_EVERY
from tests.helpers import cli, mlflow_server
from tests.ui.browser import PICTURE_LOADED, evaluate

ROOT = Path(__file__).resolve().parents[2]
LARGEBATCH = str(ROOT / "experiments/proxy/digits-largebatch.yaml")
MLFLOW_SCRIPT = ROOT / "tests" / "scripts" / "mlflow_script.py"
BASELINE = str(ROOT / "experiments/proxy/digits-baseline.yaml")
SHORT = ["train.progress=false", "optim.decay_epochs=[1]", "optim.warmup_epochs=1"]
VIEW = "workflowType=machine_learning"
# the killed and the stalled job: 5 steps per epoch, progress every 2 steps; rank 1 is killed
# (stopped) once rank 0 passed KILL_AT
KILL_AT = 12
STALL_TIMEOUT = 6  # seconds: the stopped job's --stall-timeout (a step takes ~0.05 s)
# the sweep's second label: 2 simulated workers of 64 (one process), a label that says its world
BIG = "big (2 workers x 64)"


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


def _heartbeat_pid(job: str, rank: int) -> int:
    """The pid in kvstore rank ``rank``'s heartbeat of local job ``job`` (its record names its
    rank: no launch index is read)."""
    (path,) = Path(tempfile.gettempdir()).glob(f"mxlarge-heartbeat-{job}-*/worker-{rank}.json")
    return int(json.loads(path.read_bytes())["pid"])


def _silent_worker(cwd: Path, env: dict[str, str], act: Callable[[int], None],
                   flags: tuple[str, ...] = ()) -> str:
    """Launches 2 workers and, once kvstore rank 0 (the one that prints progress) passed step
    :data:`KILL_AT`, calls ``act`` with the pid of rank 1, which has printed nothing. Returns
    the job's output (it must fail)."""
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.cli", "launch", LARGEBATCH,
                             "-n", "2", "-s", "1", "train.epochs=100", "train.log_every=2",
                             "train.progress=false", *flags],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen, job = [], None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            job = job or (m.group(1) if (m := re.match(r"\[launcher\] job (\w+):", line))
                          else None)
            m = re.match(r"\[worker 0(?: \(launch \d\))?\] step (\d+)/", line)
            if m and int(m.group(1)) >= KILL_AT:
                break
        assert job, "".join(seen)
        act(_heartbeat_pid(job, 1))
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, "".join(seen)
    return "".join(seen) + out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(port, client, run ids, directory) of a served store holding the five kinds of run."""
    tmp = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{tmp}/ui.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    for d in ("launch", "sweep", "failed", "stalled", "own"):
        (tmp / d).mkdir()
    MlflowClient(tracking_uri=uri).search_experiments()  # the schema, before the server reads it
    with mlflow_server(uri, tmp) as port:  # starting while the store is made
        yield port, *_store(uri, tmp, env)


def _store(uri: str, tmp: Path, env: dict[str, str]) -> tuple[MlflowClient, dict, Path]:
    """Makes the store: two launches, the sweep and its report, the killed and the stalled job;
    returns the client, the run ids (and what each failed job printed), ``tmp``."""
    for epochs in (2, 3):
        r = cli(["launch", LARGEBATCH, "-n", "2", "-s", "1", *SHORT, f"train.epochs={epochs}"],
                tmp / "launch", env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    sweep = tmp / "sweep" / "ui.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "ui", "mode": "train", "seeds": [0],
        "runs": [{"label": "base", "config": BASELINE},
                 {"label": BIG, "config": BASELINE, "overrides": ["dist.simulate_workers=2"]}],
        "overrides": ["data.batch_size=64", "train.epochs=2", *SHORT]}))
    for args in (["sweep", str(sweep)], ["report", "ui", "--out", str(tmp / "sweep" / "rep")]):
        r = cli(args, tmp / "sweep", env=env, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    killed = _silent_worker(tmp / "failed", env, lambda pid: os.kill(pid, signal.SIGKILL))
    stalled = _silent_worker(tmp / "stalled", env, lambda pid: os.kill(pid, signal.SIGSTOP),
                             ("--stall-timeout", str(STALL_TIMEOUT)))

    r = subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1", "--",
                        sys.executable, str(MLFLOW_SCRIPT), "30"], cwd=tmp / "own", env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    c = MlflowClient(tracking_uri=uri)
    script_exp = c.get_experiment_by_name("mlflow_script.py").experiment_id
    (script,) = c.search_runs([script_exp])
    exp = c.get_experiment_by_name("mxlarge").experiment_id
    runs = c.search_runs([exp])
    launches = sorted((x for x in runs if x.info.status == "FINISHED"
                       and x.data.tags.get("launcher") and "sweep" not in x.data.tags),
                      key=lambda x: int(x.data.params["train.epochs"]))
    failed = [x for x in runs if x.info.status == "FAILED"]
    ids = {"exp": exp, "launches": [x.info.run_id for x in launches],
           "failed": next(x.info.run_id for x in failed if x.data.tags["failure"] != "stalled"),
           "stalled": next(x.info.run_id for x in failed if x.data.tags["failure"] == "stalled"),
           "parent": next(x.info.run_id for x in runs if x.data.tags.get("sweep_parent")),
           "killed": killed, "stopped": stalled,
           "script_exp": script_exp, "script": script.info.run_id,
           "cells": sorted((x.info.run_id for x in runs if x.data.tags.get("sweep") == "ui"),
                           key=lambda i: c.get_run(i).data.tags["sweep_label"])}
    return c, ids, tmp


@pytest.mark.timeout(900)
def test_launched_runs_differ_within_the_list_and_show_what_took_effect(served):
    port, c, ids, tmp = served
    names = [c.get_run(i).data.tags["mlflow.runName"] for i in ids["launches"]]
    # the config's name, what the overrides changed (the epochs), the seed
    assert names == ["digits-largebatch 2ep s0", "digits-largebatch 3ep s0"]
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
    # val = the four evaluations and best_accuracy, final_error_pct
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

    # the runs list (the link a run prints) opens with the metric columns that matter
    # (MLflow's shared view) and shows every name whole: the two launches differ in the list
    listed_route = f"experiments/{ids['exp']}/runs?viewStateShareKey=mxlarge&{VIEW}"
    listed = _page(port, listed_route, tmp / "runs.txt")
    assert "You're viewing a shared view" in listed
    assert ("Metrics Duration perf/images_per_sec_median train/loss val/best_accuracy "
            "val/final_error_pct") in listed  # the columns' header (MLflow sorts them by name)
    shown = evaluate(f"http://127.0.0.1:{port}/#/{listed_route}", NAMES_SHOWN, 120)
    assert shown and {name: whole for name, whole in shown if name in names} == \
        dict.fromkeys(names, True), shown
    assert "sweep ui" in dict(shown)
    # the Models page: each logged model named after its run
    models = _page(port, f"experiments/{ids['exp']}/models?{VIEW}", tmp / "models.txt")
    for name in ("digits-largebatch-2ep-s0", "digits-largebatch-3ep-s0", "base-1x64-2ep-s0",
                 "big-2-workers-x-64-2ep-s0"):
        assert name in models, name


# [name, whether it shows whole] of every run in the runs list (MLflow cuts a name with an
# ellipsis: its element's content is then wider than the element), once the Run Name column's
# width has stayed the same for 2 s (the view's width is applied after the first render)
NAMES_SHOWN = """(() => {
  const head = document.querySelector('.ag-header-cell[col-id="attributes.`Run Name`"]');
  if (!head) return null;
  if (window.mxWidth !== head.style.width) {
    [window.mxWidth, window.mxSince] = [head.style.width, Date.now()];
    return null;
  }
  if (Date.now() - window.mxSince < 2000) return null;
  const cells = [...document.querySelectorAll('.ag-cell[col-id="attributes.`Run Name`"]')];
  const names = cells.map(c => [...c.querySelectorAll('*')].find(
      e => e.children.length === 0 && getComputedStyle(e).textOverflow === 'ellipsis'))
    .filter(e => e && e.textContent.trim());
  return names.length ? names.map(e => [e.textContent.trim(), e.scrollWidth <= e.clientWidth])
                      : null;
})()"""

# [the page's route, its text] once the experiment's page has landed on a view: the GenAI
# overview, or the runs list with its table
LANDED = """(() => {
  const h = location.hash, t = document.body.innerText;
  return h.includes('/overview/') || (h.includes('/runs') && t.includes('Run Name'))
    ? [h, t] : null;
})()"""


@pytest.mark.timeout(900)
def test_the_experiment_opens_on_its_runs(served):
    """The experiment's link with the training view's workflowType (every link mxlarge
    prints carries it) opens on the runs, not on MLflow's GenAI overview; without it a browser
    that never chose a view opens the GenAI overview, the experiment's classic kind
    notwithstanding (MLflow 3.17: its switch decides; docs/mlflow.md says so)."""
    port, c, ids, _ = served
    exp = ids["exp"]
    assert c.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"
    route, text = evaluate(f"http://127.0.0.1:{port}/#/experiments/{exp}?{VIEW}", LANDED, 120)
    assert route.startswith(f"#/experiments/{exp}/runs?"), route
    assert "Token Usage" not in text and "Detect Issues" not in text
    route, _ = evaluate(f"http://127.0.0.1:{port}/#/experiments/{exp}", LANDED, 120)
    assert route.startswith(f"#/experiments/{exp}/overview/") and "workflowType=genai" in route


@pytest.mark.timeout(900)
def test_the_sweep_parent_compares_its_labels_in_one_picture(served):
    port, c, ids, tmp = served
    names = [c.get_run(cell).data.tags["mlflow.runName"] for cell in ids["cells"]]
    # the world once: from the run where the label does not say it, else the label's own
    assert names == ["base 1×64 2ep s0", f"{BIG} 2ep s0"]
    big = _page(port, f"experiments/{ids['exp']}/runs/{ids['cells'][1]}?{VIEW}",
                tmp / "big.txt")
    assert names[1] in big and "Parent run sweep ui" in big and "2×64" not in big
    page = _page(port, f"experiments/{ids['exp']}/runs/{ids['cells'][0]}?{VIEW}",
                 tmp / "base.txt")
    assert names[0] in page and "Parent run sweep ui" in page
    # a local cell (one process, one CPU device): its world is plan.*, no dist.* param
    assert "plan.workers" in page and not re.search(r"\bdist\.\w+", page), page[:3000]
    assert not [k for k in c.get_run(ids["cells"][0]).data.params if k.startswith("dist.")]
    parent = c.get_run(ids["parent"])
    assert parent.data.tags["sweep_labels"] == f"base, {BIG}"  # the labels that ran
    assert "" not in parent.data.params.values() and "sweep.labels" not in parent.data.params
    # no per-label metrics: MLflow would draw each as a chart of one bar with its own scale
    assert parent.data.metrics == {}
    route = f"experiments/{ids['exp']}/runs/{ids['parent']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "parent.txt")
    assert "Description sweep ui : target accuracy" in page
    # the table that fits: six columns, each label's final error as the cell's own
    assert "label workers batch final error % images/s speedup" in page
    metrics = {label: c.get_run(cell).data.metrics for label, cell in zip(("base", BIG),
                                                                           ids["cells"])}
    ips = {label: m["perf/images_per_sec_median"] for label, m in metrics.items()}
    # workers: the world's (2 simulated, not its 1 process); speedup: base is the reference of
    # their config, big a number against it
    for label, workers, batch, speedup in (
            ("base", "1", 64, "ref."), (BIG, "2 simulated", 128,
                                        f"{ips[BIG] / ips['base']:.2f}× vs base")):
        final = metrics[label]["val/final_error_pct"]  # in %, as the table
        assert (f" {label} {workers} {batch} {final:.2f} ± n/a {ips[label]:.0f} {speedup} "
                in page), label
    assert page.count(" ref. ") == 1
    # the comparison: one picture with both labels, the first image of the description, then
    # the report's plots: each loaded by the browser from the run's artifacts
    shown = evaluate(f"http://127.0.0.1:{port}/#/{route}?{VIEW}", IMAGES_SHOWN, 120)
    assert shown and [(caption, path) for caption, path, _ in shown] == [
        (f"the labels side by side: base, {BIG}", "compare.png"),
        ("validation error by epoch", "val_error.png"),
        ("final error vs global batch", "final_error_vs_batch.png"),
        ("training loss and LR", "loss_lr.png")], shown
    assert all(width >= 700 for _, _, width in shown), shown  # the PNGs' own pixels
    assert not c.list_artifacts(ids["parent"], "images")  # no logged images: no pile
    charts = _page(port, f"{route}/model-metrics?{VIEW}", tmp / "parent-metrics.txt")
    assert not re.search(r"\b(compare|report|base|big) \(\d+\) Add chart", charts)


# [caption (its paragraph's text), artifact, natural width] of each image of the run's
# description, once every one loaded
IMAGES_SHOWN = """(() => {
  const images = [...document.querySelectorAll('img[src^="get-artifact?"]')];
  if (!images.length || !images.every(i => i.complete && i.naturalWidth > 0)) return null;
  return images.map(i => [(i.closest('p') || i).innerText.trim(),
                          new URLSearchParams(i.getAttribute('src').split('?')[1]).get('path'),
                          i.naturalWidth]);
})()"""


def _by_rank(printed: str) -> dict[str, list[str]]:
    """A job's lines by the process label they carry (``worker 0``, ``launcher``, ...)."""
    out: dict[str, list[str]] = {}
    for line in printed.splitlines():
        if m := re.match(r"\[([^\]]+)\] (.*)$", line):
            out.setdefault(m.group(1), []).append(m.group(2))
    return out


@pytest.mark.timeout(900)
def test_a_silent_failed_worker_is_named_by_one_rank_everywhere(served):
    """Kvstore rank 1, killed having printed nothing: its failure line, tags, artifact, the
    headings of its evidence and every launcher line name it as ``worker 1`` (with its launch
    index in brackets where that differs); the progress lines are rank 0's, ``[worker 0]``."""
    port, c, ids, tmp = served
    run = c.get_run(ids["failed"])
    tags = run.data.tags
    launch = int(tags["failed_launch_index"])
    name = process_label("worker", 1, launch)  # "worker 1" or "worker 1 (launch 0)"
    assert (tags["failed_role"], tags["failed_kvstore_rank"]) == ("worker", "1")
    assert tags["failure"] == f"{name} exited with signal 9 (SIGKILL)"
    lines = _by_rank(ids["killed"])
    rank0 = process_label("worker", 0, 1 - launch)
    assert {k for k in lines if k.startswith("worker")} == {rank0}, sorted(lines)
    assert any(x.startswith("step ") for x in lines[rank0])
    assert f"{name} exited with signal 9 (SIGKILL); stopping the job" in lines["launcher"]
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
    bare = re.sub(r"\s", "", name)
    log = re.sub(r"\s", "", _page(port, f"{route}/artifacts/failure/worker-1.log?{VIEW}",
                                  tmp / "failed-log.txt"))
    assert f"#{bare}exitedwithsignal9(SIGKILL);itslast0line(s)ofoutput" in log
    beat = re.search(r"#itslastheartbeat:workerrank1on\S+?\(pid\d+\):step(\d+),phasetrain", log)
    assert beat and int(beat.group(1)) <= int(tags["failed_step"]), log[:3000]
    assert "#meanwhileworkerrank0" in log and "(itprintednothingonstdoutorstderr)" in log

    job = re.sub(r"\s", "", _page(port, f"{route}/artifacts/failure/job.log?{VIEW}",
                                  tmp / "failed-job.txt"))
    assert f"##[{bare}]killedbysignal9;itslast0line(s)ofoutput:none" in job
    assert "##[" + re.sub(r"\s", "", rank0) + "]stillrunning" in job
    assert "##[scheduler]" in job and "##[server0]" in job
    assert all(re.sub(r"\s", "", x) in job for x in lines[rank0][-3:])

    # beside the evidence, the ranks' picture, drawn by the launcher: an image that loads
    shown = evaluate(f"http://127.0.0.1:{port}/#/{route}/artifacts/breakdown/ranks.png?{VIEW}",
                     PICTURE_LOADED, 120)
    assert shown == [750, 420], shown


@pytest.mark.timeout(900)
def test_a_stalled_worker_is_named_as_a_killed_one(served):
    """Kvstore rank 1, stopped (SIGSTOP) until the watchdog ends the job: the run carries the
    failed_* tags a death does (role, kvstore rank, launch index, host, pid) beside
    failure=stalled, and names it by the same rank in its artifact and on the run's page."""
    port, c, ids, tmp = served
    run = c.get_run(ids["stalled"])
    tags = run.data.tags
    assert (tags["failure"], tags["failed_role"], tags["failed_kvstore_rank"]) == \
        ("stalled", "worker", "1")
    assert {"failed_host", "failed_pid", "failed_launch_index"} <= set(tags), sorted(tags)
    assert re.search(rf"behind: worker rank 1 at step \d+ on {re.escape(tags['failed_host'])} "
                     rf"\(pid {tags['failed_pid']}\)", tags["failure_detail"]), tags
    route = f"experiments/{ids['exp']}/runs/{ids['stalled']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "stalled.txt")
    for key in ("failed_role", "failed_host", "failed_kvstore_rank"):
        assert f"{key} : {tags[key]}" in page, key
    log = re.sub(r"\s", "", _page(port, f"{route}/artifacts/failure/worker-1.log?{VIEW}",
                                  tmp / "stalled-log.txt"))
    assert "#stalled:noworkeradvancedfor" in log and "#itslastheartbeat:workerrank1" in log


@pytest.mark.timeout(900)
def test_an_own_scripts_run_shows_its_world_its_settings_and_its_own_metric(served):
    """``python -m mxlarge.launcher -- python mlflow_script.py``: one run in the experiment named
    after the script, showing the world and the Trainer's settings as params, the script's own
    metric beside the Trainer's, and its logged model."""
    port, c, ids, tmp = served
    route = f"experiments/{ids['script_exp']}/runs/{ids['script']}"
    page = _page(port, f"{route}?{VIEW}", tmp / "script.txt")
    assert "mlflow_script.py" in page and "Finished" in page
    for key in ("workers", "servers", "command", "optim.reference_batch", "plan.global_batch",
                "script_lr", "my_loss", "train/lr", "perf/images_per_sec"):
        assert key in page, key
    assert re.search(r"Logged models \(1\)", page), page[-3000:]
