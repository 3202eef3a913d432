"""Your own script on the namespace testbed, launched by ``python -m mxlarge.launcher``. In the
slower cluster tier.

- ``--server-hosts``: over ssh (hostfile h1, h2; servers on h0) and Slurm's srun inside an
  allocation (``salloc -N 3``; servers on h0), both at once. Checked per job: both servers on
  h0 and the workers on h1 and h2, each process in its host's namespace, and one MLflow run,
  FINISHED, with the world's params and the Trainer's LR.
- ``--elastic`` (tests/scripts/elastic_script.py): a 2-worker job over ssh (hostfile h1, h2)
  or Slurm (``salloc --no-kill -N 2 -w h1,h2``), a server and a worker on each host, loses h2
  for good (its link cut once the checkpoint of step 20 exists). The launcher relaunches on h1
  as 1 worker × 2 simulated workers; the script resumes through ``mxlarge.resume`` and ends
  bitwise like the same job uninterrupted on loopback (weights, momentum, each unit's BN
  statistics), in one FINISHED run with both worlds."""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.testbed import Testbed
from tests.cluster.observe import Observer, start, wait_until
from tests.cluster.test_failures import anything_of, finish, wait_gone
from tests.e2e.test_own_elastic import same_state

PY = sys.executable
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
OWN_LOOP = SCRIPTS / "own_loop.py"
ELASTIC_SCRIPT = SCRIPTS / "elastic_script.py"
pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def _argv(tb: Testbed, work: Path, backend: str) -> list[str]:
    own = [PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "2", "--launcher", backend]
    script = ["--", PY, str(OWN_LOOP), "--steps", "30", "--out", str(work / "w.params")]
    if backend == "ssh":
        (work / "hosts").write_text(f"{tb.addr('h1')}\n{tb.addr('h2')}\n")
        return [*own, "-H", str(work / "hosts"), "--server-hosts", tb.addr("h0"), *script]
    # -O: the allocation's one CPU on h0 takes both servers' tasks
    return ["salloc", "-O", "-N", "3", "-w", "h0,h1,h2", *own, "--server-hosts", "h0", *script]


def test_an_own_script_runs_on_server_hosts_over_ssh_and_slurm_in_one_run_each(
        testbed: Testbed) -> None:
    started = {}
    try:
        for backend in ("ssh", "slurm"):
            work = testbed.root / "work" / f"own-{backend}-{uuid.uuid4().hex[:6]}"
            work.mkdir(parents=True)
            started[backend] = (work, Observer(testbed, str(work)),
                                start(testbed, "h0", _argv(testbed, work, backend), work))
        for backend, (work, obs, job) in started.items():
            assert job.wait(360) == 0, job.text()[-4000:]
            obs.stop()
            servers = sorted(p.host for p in obs.by_role("server"))
            workers = sorted(p.host for p in obs.by_role("worker"))
            assert (servers, workers) == (["h0", "h0"], ["h1", "h2"]), (backend, obs.procs)
            c = MlflowClient(f"sqlite:///{work}/mlruns.db")
            (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
            assert run.info.status == "FINISHED" and run.info.run_name == "own_loop.py"
            p = run.data.params
            assert (p["launcher"], p["workers"], p["servers"]) == (backend, "2", "2"), p
            assert p["server_hosts"] == (testbed.addr("h0") if backend == "ssh" else "h0")
            assert [m.value for m in c.get_metric_history(run.info.run_id, "train/lr")][:1] \
                == [0.1], run.data.metrics
    finally:
        for _, obs, job in started.values():
            obs.stop()
            if job.proc.poll() is None:
                job.proc.kill()


@pytest.mark.parametrize("backend", ["ssh", "slurm"])
def test_an_own_script_loses_a_host_for_good_and_continues_bitwise(testbed: Testbed,
                                                                    backend: str) -> None:
    work = testbed.root / "work" / f"own-el-{backend}-{uuid.uuid4().hex[:6]}"
    work.mkdir(parents=True)
    script = [PY, str(ELASTIC_SCRIPT), "--steps", "60", "--sleep", "0.2"]
    ref = subprocess.run([PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "2", "--no-mlflow",
                          "--", *script[:4], "--ckpt", str(work / "a"), "--final",
                          str(work / "fa")], cwd=work, capture_output=True, text=True,
                         timeout=120)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-2000:]
    own = [PY, "-m", "mxlarge.launcher", "-n", "2", "-s", "2", "--launcher", backend,
           "--stall-timeout", "5", "--firewall", "off", "--max-restarts", "1", "--elastic"]
    argv = [*own, "--", *script, "--ckpt", str(work / "b"), "--final", str(work / "fb")]
    if backend == "ssh":
        (work / "hosts").write_text(f"{testbed.addr('h1')}\n{testbed.addr('h2')}\n")
        argv = [*own, "-H", str(work / "hosts"), *argv[len(own):]]
    else:  # the allocation outlives the node it loses (--no-kill)
        argv = ["salloc", "--no-kill", "-N", "2", "-w", "h1,h2", *argv]
    obs = Observer(testbed, str(work))
    job = start(testbed, "h0", argv, work)
    down = False
    try:
        wait_until(lambda: (work / "b/step-00000020/step.json").exists()
                   or job.proc.poll() is not None, 120, "the checkpoint of step 20")
        testbed.link("h2", up=False)
        down = True
        cut = time.monotonic()
        rc = job.wait(150)
        wait_gone(work, None, cut)
        obs.stop()
        testbed.link("h2", up=True)
        down = False
        wait_until(lambda: not testbed.strays("h2"), 60,
                   f"h2 empty (left: {testbed.strays('h2')})")
    finally:
        if down:
            testbed.link("h2", up=True)
        finish(job, obs, work)
    out = job.text()
    assert rc == 0, out[-4000:]
    assert anything_of(str(work)) == []
    lost = testbed.addr("h2") if backend == "ssh" else "h2"  # as its hostfile names it
    assert f"[launcher] restart 1: world 1 worker(s) x 2 simulated worker(s) (lost: {lost})" \
        in out, out[-4000:]
    assert re.search(r"elastic_script rank=0 units=2 start=(20|30|40|50)", out), out[-4000:]
    same_state(work / "fa/step-00000060", work / "fb/step-00000060")
    c = MlflowClient(f"sqlite:///{work}/mlruns.db")
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags["world_0"], tags["world_1"], tags["workers_lost"], tags["restarts"]) == (
        "2 worker(s)", "1 worker(s) x 2 simulated worker(s)", lost, "1"), tags
