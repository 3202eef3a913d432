"""Your own script, launched by ``python -m mxlarge.launcher``, is one MLflow run: the world and
the Trainer's settings as params, the LR and the rate as metrics, the script's own MLflow calls
from rank 0 only, and the job's status (FINISHED, FAILED with the failure's tags, KILLED)."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge import tracking
from mxlarge.tracking import model_id

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
MLFLOW_SCRIPT = SCRIPTS / "mlflow_script.py"
OWN_LOOP = SCRIPTS / "own_loop.py"
STEPS = 30


def _launch(cwd: Path, *args: str, env: dict[str, str] | None = None,
            timeout: float = 240) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                           *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def _runs(uri: str) -> list:
    c = MlflowClient(uri)
    return c.search_runs([e.experiment_id for e in c.search_experiments()])


def _check_one_run(uri: str, before: int, out: str) -> None:
    runs = _runs(uri)
    assert len(runs) == before + 1, out[-3000:]
    run = max(runs, key=lambda r: r.info.start_time)
    c = MlflowClient(uri)
    assert run.info.status == "FINISHED"
    assert run.info.experiment_id == c.get_experiment_by_name("mlflow_script.py").experiment_id
    p = run.data.params
    assert (p["workers"], p["servers"], p["launcher"], p["server_hosts"]) == \
        ("2", "1", "local", "co-located")
    assert p["command"].endswith("mlflow_script.py 30") and p["script_lr"] == "0.1"
    assert (p["optim.optimizer"], p["optim.reference_batch"], p["plan.global_batch"]) == \
        ("sgd", "64", "32")
    mine = c.get_metric_history(run.info.run_id, "my_loss")
    assert sorted(m.step for m in mine) == list(range(STEPS))  # rank 0's, once a step
    # every 10 updates, at least MIN_SECONDS apart: the first at update 10
    lrs = sorted((m.step, m.value) for m in c.get_metric_history(run.info.run_id, "train/lr"))
    assert lrs[0] == (10, 0.05) and lrs[-1][0] == 30 and {s for s, _ in lrs} <= {10, 20, 30}, lrs
    assert all(v == 0.05 for _, v in lrs)
    samples = c.get_metric_history(run.info.run_id, "train/samples")
    assert sorted((m.step, m.value) for m in samples) == [(s, 32 * s) for s, _ in lrs]
    rates = c.get_metric_history(run.info.run_id, "perf/images_per_sec")
    assert len(rates) == len(lrs) and all(m.value > 0 for m in rates)
    assert out.count("the LR is scaled down 0.5x (linear scaling), from 0.1 to 0.05") == 1
    models = re.findall(r"mlflow_script rank=(\d) model=(\S+) done", out)
    assert sorted(models) == [("0", model_id(uri, run.info.run_id)), ("1", "None")], out[-3000:]
    assert any(k.startswith("system/") for k in run.data.metrics), run.data.metrics
    assert {"breakdown/rank0/step_ms", "breakdown/rank0/exchange_ms"} <= set(run.data.metrics)
    assert [a.path for a in c.list_artifacts(run.info.run_id, "breakdown")] == \
        ["breakdown/ranks.png"]


@pytest.mark.timeout(300)
def test_a_script_logging_on_every_rank_is_one_run_on_a_fresh_store(tmp_path):
    """On a store that does not exist yet: the launcher makes it before any worker starts
    (two workers making its schema at once kill one of them in MLflow's migration)."""
    uri = f"sqlite:///{tmp_path}/fresh.db"
    r = _launch(tmp_path, "--", sys.executable, str(MLFLOW_SCRIPT), str(STEPS),
                env={"MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    _check_one_run(uri, 0, r.stdout + r.stderr)


@pytest.mark.timeout(300)
def test_a_script_logging_on_every_rank_is_one_run_on_a_store_that_exists(tmp_path,
                                                                          mlflow_uri):
    MlflowClient(mlflow_uri).create_run(MlflowClient(mlflow_uri).create_experiment("other"))
    r = _launch(tmp_path, "--", sys.executable, str(MLFLOW_SCRIPT), str(STEPS))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    _check_one_run(mlflow_uri, 1, r.stdout + r.stderr)


@pytest.mark.timeout(300)
def test_a_failed_worker_fails_the_run_with_its_tags_and_evidence(tmp_path, mlflow_uri):
    r = _launch(tmp_path, "--experiment", "fails", "--run-name", "raise at 5", "--",
                sys.executable, str(OWN_LOOP), "--raise-rank", "1", "--raise-step", "5")
    assert r.returncode == 1, (r.stdout + r.stderr)[-3000:]
    (run,) = _runs(mlflow_uri)
    c = MlflowClient(mlflow_uri)
    assert run.info.status == "FAILED" and run.info.run_name == "raise at 5"
    assert c.get_experiment(run.info.experiment_id).name == "fails"
    tags = run.data.tags
    assert (tags["failed_role"], tags["failed_kvstore_rank"]) == ("worker", "1"), tags
    assert "failed_host" in tags and "failure" in tags
    logs = {a.path for a in c.list_artifacts(run.info.run_id, "failure")}
    assert {"failure/worker-1.log", "failure/job.log"} <= logs, logs
    text = Path(c.download_artifacts(run.info.run_id, "failure/worker-1.log", str(tmp_path)))
    assert "own_loop raising at step 5" in text.read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_stopped_with_ctrl_c_is_a_killed_run(tmp_path, mlflow_uri):
    import os
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                             "--", sys.executable, str(OWN_LOOP), "--steps", "200",
                             "--sleep-from", "0", "--sleep", "0.2"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "own_loop rank=0 step=30" in line:  # sampled steps (1 in 10) on every rank
            proc.send_signal(signal.SIGINT)
            break
    lines.extend(proc.stdout)
    proc.stdout.close()
    assert proc.wait(60) == 130, "".join(lines)[-3000:]
    (run,) = _runs(mlflow_uri)
    assert run.info.status == "KILLED", "".join(lines)[-3000:]
    pictures = MlflowClient(mlflow_uri).list_artifacts(run.info.run_id, "breakdown")
    assert [a.path for a in pictures] == ["breakdown/ranks.png"], "".join(lines)[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_script_that_saves_on_ctrl_c_logs_the_model_of_its_last_whole_step(tmp_path,
                                                                             mlflow_uri):
    """Ctrl-C at the launcher reaches rank 0's script as a KeyboardInterrupt as its next step
    begins; the script's own ``except KeyboardInterrupt`` logs its model, which is bitwise the
    model of a job of as many steps; the process leaves without the exit barrier (no wait for
    the launcher's 60 s); the run is KILLED."""
    import os
    proc = subprocess.Popen([sys.executable, "-m", "mxlarge.launcher", "-n", "2", "-s", "1",
                             "--", sys.executable, str(MLFLOW_SCRIPT), "1000000"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ))
    c = MlflowClient(mlflow_uri)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        runs = _runs(mlflow_uri)
        if runs and len(c.get_metric_history(runs[0].info.run_id, "my_loss")) >= 20:
            break
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    asked = time.monotonic()
    out, _ = proc.communicate(timeout=90)
    took = time.monotonic() - asked
    assert proc.returncode == 130, out[-3000:]
    assert took < 30, (took, out[-3000:])
    (run,) = _runs(mlflow_uri)
    assert run.info.status == "KILLED", out[-3000:]
    steps = int(re.search(r"mlflow_script rank=0 stopped after (\d+) steps", out).group(1))
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "my_loss")) == \
        list(range(steps))
    models = re.findall(r"mlflow_script rank=0 model=(\S+) done", out)
    assert models == [model_id(mlflow_uri, run.info.run_id)], out[-3000:]
    r = _launch(tmp_path, "--", sys.executable, str(MLFLOW_SCRIPT), str(steps))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    (done,) = [r for r in _runs(mlflow_uri) if r.info.status == "FINISHED"]
    mine, theirs = ({k: v.data().asnumpy() for k, v in
                     tracking.load(x.info.run_id, mlflow_uri).collect_params().items()}
                    for x in (run, done))
    assert len(mine) == 2 and mine.keys() == theirs.keys()
    for k in mine:
        assert (mine[k] == theirs[k]).all(), k


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mlflow_run_id_attaches_and_no_mlflow_makes_none(tmp_path, mlflow_uri):
    """``$MLFLOW_RUN_ID``: the job logs into that run and leaves it to its owner (RUNNING);
    ``--no-mlflow``: no run anywhere, no store in the working directory."""
    c = MlflowClient(mlflow_uri)
    mine = c.create_run(c.create_experiment("mine")).info.run_id
    r = _launch(tmp_path, "--", sys.executable, str(OWN_LOOP), "--steps", "12",
                env={"MLFLOW_RUN_ID": mine})
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    run = c.get_run(mine)
    assert run.info.status == "RUNNING" and run.data.params["workers"] == "2"
    # every 10 updates and at exit
    assert [m.step for m in c.get_metric_history(mine, "train/lr")] == [10, 12]
    assert len(_runs(mlflow_uri)) == 1
    plain = tmp_path / "plain"
    plain.mkdir()
    r = _launch(plain, "--no-mlflow", "--", sys.executable, str(OWN_LOOP), "--steps", "4",
                env={"MLFLOW_TRACKING_URI": f"sqlite:///{plain}/none.db"})
    assert r.returncode == 0 and "MLflow run" not in r.stdout + r.stderr
    assert sorted(p.name for p in plain.iterdir()) == []
