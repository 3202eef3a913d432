"""Your own script on the namespace testbed, launched by ``python -m mxlarge.launcher`` with
``--server-hosts``: over ssh (hostfile h1, h2; servers on h0) and Slurm's srun inside an
allocation (``salloc -N 3``; servers on h0), both at once. Checked per job: both servers on h0
and the workers on h1 and h2, each process in its host's namespace, and one MLflow run,
FINISHED, with the world's params and the Trainer's LR. In the slower cluster tier."""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.testbed import Testbed
from tests.cluster.observe import Observer, start

PY = sys.executable
OWN_LOOP = Path(__file__).resolve().parents[1] / "scripts" / "own_loop.py"
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
