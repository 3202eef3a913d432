"""`mxlarge launch --launcher ssh|mpi --max-restarts 1 --elastic` on the namespace testbed: a
2-worker job loses h2 for good (``ip link set eth0 down`` in h2's namespace, not restored while
the job runs). The launcher sees the job stall, probes every host with ``ssh host true``, and
relaunches on the answering hosts only as 1 worker × 2 simulated workers, which finishes with
weights, momentum and both units' BN statistics bitwise those of the same job uninterrupted
(run at the same time on h3 alone), in one MLflow run that records the world change. Nothing
of either job is left on any host, the cut-off one included.

- ssh: servers on h0 and h1, workers on h1 and h2, scheduler on h0; the relaunch runs on h0 and
  h1 (mxlarge.launcher.backends.ssh.survivors_hostfile). (3 workers that finish as 1 × 3, not
  bitwise: tests/e2e/test_elastic.py, locally; the 3-worker survivors' hostfile:
  tests/launcher/test_restart.py. The testbed job of that case made room for the mpi one.)
- mpi: hostfile ``h1``, ``h2`` (servers and workers co-located, mpirun on
  h0); the relaunch runs both servers and the worker on h1 from ``h1 slots=2``
  (mxlarge.launcher.backends.mpi.survivors_hostfile).
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.testbed import Testbed
from tests.cluster.observe import Observer, start, wait_until
from tests.cluster.test_failures import PY, anything_of, finish, wait_gone
from tests.e2e.test_resume import _same

CONFIG = """
name: el
data: {{dataset: digits, batch_size: 16, augment: true}}
model: {{name: small_resnet, width: 4}}
optim: {{base_lr: 0.05, reference_batch: 16, warmup: linear, warmup_epochs: 1, decay: step,
        decay_epochs: [{decay}], momentum: 0.9}}
train: {{epochs: {epochs}, progress: false, checkpoint_every: 1}}
dist: {{kvstore: dist_sync, workers: {workers}, servers: 2}}
tracking: {{enabled: true, uri: 'sqlite:///{db}/mlruns.db'}}
"""
H0, H1, H2, H3 = "198.18.0.10", "198.18.0.11", "198.18.0.12", "198.18.0.13"
# the slower cluster tier (`make test-cluster-slow`): about 100 s on 2 cores
pytestmark = pytest.mark.slow
STALL = 5  # s without a step: the cut is noticed by the watchdog (or ssh's keepalive)
# (--firewall off: the packet filter's removal from the cut-off host would wait 10 s in vain)


def _argv(work: Path, name: str, hostfile: list[str], workers: int, epochs: int, decay: float,
          *more: str, launcher: str = "ssh") -> list[str]:
    cfg = work / f"{name}.yaml"
    (work / name).mkdir()
    cfg.write_text(CONFIG.format(db=work / name, workers=workers, epochs=epochs, decay=decay))
    (work / name / "hosts").write_text("".join(f"{h}\n" for h in hostfile))
    return [PY, "-m", "mxlarge.cli", "launch", str(cfg), "--launcher", launcher, "-H",
            str(work / name / "hosts"), "--stall-timeout", str(STALL), "--firewall", "off",
            *more, f"train.checkpoint_dir={work / name}/ckpt"]


def _lose_h2(testbed: Testbed, work: Path, hosts: list[str], workers: int, epochs: int,
             decay: float, launcher: str = "ssh", lost: str = H2
             ) -> tuple[str, list[tuple[str, str | None]], int]:
    """With ``--max-restarts 1 --elastic`` on ``hosts`` (``work/el``; ``lost``: how the
    launcher names h2, the hostfile's word for it), h2's link cut once the
    first checkpoint is written; meanwhile the same job uninterrupted, all of it on h3
    (``work/ref``: where the processes run does not change the bits, test_jobs.py). Returns
    the elastic job's output, (role, host) of every process it ran, once nothing of either
    job is left on any host, and the epoch of the checkpoint the restart resumed from."""
    t0 = time.monotonic()
    ref = start(testbed, "h3", _argv(work, "ref", [H3] * (workers + 2), workers, epochs, decay),
                work, "ref.log")
    obs = Observer(testbed, str(work / "el"))
    job = start(testbed, "h0", _argv(work, "el", hosts, workers, epochs, decay,
                                     "--max-restarts", "1", "--elastic", launcher=launcher),
                work)
    try:
        wait_until(lambda: (work / "el/ckpt/epoch-0001/meta.json").exists() or
                   job.proc.poll() is not None, 90, "the first checkpoint")
        testbed.link("h2", up=False)
        cut = time.monotonic()
        rc = job.wait(120)
        ended = time.monotonic()
        took = wait_gone(work / "el", None, ended)  # h2's processes end themselves: link down
        procs = obs.stop()
        assert ref.wait(60) == 0, ref.text()[-4000:]
    finally:
        testbed.link("h2", up=True)
        finish(job, obs, work)
        if ref.proc.poll() is None:
            ref.proc.kill()
    out = job.text()
    print(f"{launcher}, {workers} workers: elastic job ended {ended - cut:.1f} s after the cut, "
          f"{ended - t0:.1f} s after its start; cut-off host empty {took:.1f} s after the end")
    assert rc == 0, out[-4000:]
    assert took < 30 and anything_of(str(work)) == []
    assert re.search(rf"^mxlarge: restart 1/1 after: .*\b{re.escape(lost)}\b", out, re.M), \
        out[-4000:]
    # the newest checkpoint before the stall: epoch 1's (the cut lands in epoch 2)
    resumed = re.search(rf"^mxlarge: restart 1: resuming from {work}/el/ckpt/epoch-(\d+)$",
                        out, re.M)
    assert resumed is not None and int(resumed.group(1)) < epochs, out[-4000:]
    return out, sorted((p.role, p.host) for p in procs.values()), int(resumed.group(1))


def _the_run(work: Path, resumed: int, workers: int,  # type: ignore[no-untyped-def]
             lost: str = H2):
    """The elastic job's one MLflow run: FINISHED, both worlds, h2 lost, world/workers."""
    c = MlflowClient(tracking_uri=f"sqlite:///{work}/el/mlruns.db")
    (run,) = c.search_runs([e.experiment_id for e in c.search_experiments()])
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    batch = 16 * workers
    assert (tags["world_0"], tags["world_1"], tags["workers_lost"], tags["restarts"]) == \
        (f"{workers} worker(s) x 16 images = global batch {batch}",
         f"1 worker(s) x {workers} simulated worker(s) x 16 images = global batch {batch}",
         lost, "1"), tags
    history = c.get_metric_history(run.info.run_id, "world/workers")
    spe = 1400 // (16 * workers)  # steps per epoch
    assert sorted((m.step, m.value) for m in history) == [(0, float(workers)),
                                                          (resumed * spe, 1.0)]


@pytest.mark.timeout(240)
def test_a_host_cut_off_for_good_continues_on_the_rest_bitwise(testbed: Testbed,
                                                               work: Path) -> None:
    # dmlc's ssh placement, process i on line i: servers h0, h1; workers h1, h2
    out, where, resumed = _lose_h2(testbed, work, [H0, H1, H1, H2], 2, 2, 1.5)
    assert ("restart 1: world 1 worker(s) x 2 simulated worker(s) x 16 images = global batch "
            f"32 (lost: {H2})") in out, out[-4000:]
    assert f"restart 1: hosts {H0}, {H1}, {H1} (2 server(s), 1 worker(s); lost: {H2})" in out
    assert "done: 86 steps on 1 worker(s) x 2 simulated worker(s)" in out, out[-4000:]
    # the first attempt on h0, h1, h2; the second without h2
    assert where == sorted([("scheduler", "h0")] * 2 + [("server", "h0"), ("server", "h1")] * 2
                           + [("worker", "h1"), ("worker", "h2"), ("worker", "h1")]), where
    for name in ("model.params", "momentum.nd", "bn-0.nd", "bn-1.nd"):
        _same(work / "ref/ckpt/epoch-0002" / name, work / "el/ckpt/epoch-0002" / name)
    _the_run(work, resumed, 2)


@pytest.mark.timeout(240)
def test_an_mpi_job_loses_a_host_for_good_and_continues_on_the_rest_bitwise(
        testbed: Testbed, work: Path) -> None:
    # Bare lines, one slot each for the layout: Open MPI alone would give each as many slots
    # as the host has cores (both workers on h1); mpirun reads a copy with slots=1, so its
    # by-slot placement puts a server and a worker on each host
    out, where, resumed = _lose_h2(testbed, work, ["h1", "h2"], 2, 2, 1.5, "mpi", "h2")
    assert ("restart 1: world 1 worker(s) x 2 simulated worker(s) x 16 images = global batch "
            "32 (lost: h2)") in out, out[-4000:]
    assert "restart 1: hosts h1 slots=2 (2 server(s), 1 worker(s); lost: h2)" in out
    assert "done: 86 steps on 1 worker(s) x 2 simulated worker(s)" in out, out[-4000:]
    assert where == sorted([("scheduler", "h0")] * 2 + [("server", "h1"), ("server", "h2")]
                           + [("server", "h1")] * 2
                           + [("worker", "h1"), ("worker", "h2"), ("worker", "h1")]), where
    for name in ("model.params", "momentum.nd", "bn-0.nd", "bn-1.nd"):
        _same(work / "ref/ckpt/epoch-0002" / name, work / "el/ckpt/epoch-0002" / name)
    _the_run(work, resumed, 2, "h2")
