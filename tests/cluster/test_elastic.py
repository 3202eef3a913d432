"""`mxlarge launch --launcher ssh|mpi|slurm --max-restarts 1 --elastic` on the namespace
testbed: a 2-worker job loses h2 for good (``ip link set eth0 down`` in h2's namespace, not
restored while the job runs). The launcher sees the job stall, probes the job's hosts, and
relaunches on the answering ones only as 1 worker × 2 simulated workers, in one MLflow run that
records the world change. Nothing of the job is left on any host, and once h2's link is back,
h2 holds nothing either.

- mpi and Slurm, the cut in epoch 2 of 2: the job finishes with weights, momentum and both
  units' BN statistics bitwise those of the same job uninterrupted (run at the same time as the
  first of them, on h3 alone). mpi: hostfile ``h1``, ``h2`` (servers and workers co-located,
  mpirun on h0); the relaunch runs both servers and the worker on h1 from ``h1 slots=2``
  (mxlarge.launcher.backends.mpi.survivors_hostfile). Slurm: ``salloc --no-kill -N 2 -w
  h1,h2`` on h0 (the launcher and the scheduler on h0, a server and a worker on each node);
  the relaunch runs its steps on h1 with ``-x h2`` (mxlarge.launcher.backends.slurm: h2's
  slurmd does not answer). Slurm's step daemons on h2 wait for the link.
- ssh, the cut after the last step (once the final checkpoint is written, during the final
  hooks): servers on h0 and h1, workers on h1 and h2, scheduler on h0; the relaunch on h0 and
  h1 (mxlarge.launcher.backends.ssh.survivors_hostfile) resumes from the final checkpoint with
  no step left and finishes, exit 0. (A bitwise continuation mid-training: the mpi and Slurm
  jobs here, and tests/e2e/test_elastic.py locally; the ssh survivors' hostfiles, 2 and 3
  workers: tests/launcher/test_restart.py.)
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
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
# the slower cluster tier (`make test-cluster-slow`)
pytestmark = pytest.mark.slow
STALL = 5  # s without a step: the cut is noticed by the watchdog (or ssh's keepalive)
# (--firewall off: the packet filter's removal from the cut-off host would wait 10 s in vain)


def _argv(work: Path, name: str, hostfile: list[str] | None, workers: int, epochs: int,
          decay: float, *more: str, launcher: str = "ssh") -> list[str]:
    cfg = work / f"{name}.yaml"
    (work / name).mkdir()
    cfg.write_text(CONFIG.format(db=work / name, workers=workers, epochs=epochs, decay=decay))
    hosts: list[str] = []
    if hostfile is not None:
        (work / name / "hosts").write_text("".join(f"{h}\n" for h in hostfile))
        hosts = ["-H", str(work / name / "hosts")]
    argv = [PY, "-m", "mxlarge.cli", "launch", str(cfg), "--launcher", launcher, *hosts,
            "--stall-timeout", str(STALL), "--firewall", "off", *more,
            f"train.checkpoint_dir={work / name}/ckpt"]
    # the allocation outlives the node it loses (--no-kill)
    return ["salloc", "--no-kill", "-N", "2", "-w", "h1,h2", *argv] if launcher == "slurm" \
        else argv


@dataclass
class Lost:
    """One elastic job of :func:`_lose_h2`: its output, (role, host) of every process it ran,
    and the epoch of the checkpoint the restart resumed from."""

    out: str
    where: list[tuple[str, str | None]]
    resumed: int


ELASTIC = ("--max-restarts", "1", "--elastic")
#: (workers, epochs, decay) -> the uninterrupted job's directory, shared by the tests of a
#: session (the mpi and the Slurm tests train the same job)
REFERENCES: dict[tuple[int, int, float], Path] = {}


def _lose_h2(testbed: Testbed, work: Path, launcher: str, hostfile: list[str] | None,
             lost: str, epochs: int, cut_at: int = 1) -> Lost:
    """A 2-worker ``--max-restarts 1 --elastic`` job (``work/el``; ``lost``: how its launcher
    names h2), h2's link cut once it wrote the checkpoint of epoch ``cut_at``; unless that is
    the last, or an earlier test ran it (:data:`REFERENCES`), meanwhile the same job
    uninterrupted, all of it on h3 (``work/ref``: where the processes run does not change the
    bits, test_jobs.py). Returns the job once nothing of it is left on any host (checked again
    once h2's link is back: h2 holds nothing)."""
    t0 = time.monotonic()
    key = (2, epochs, 1.5)
    ref = None if cut_at == epochs or key in REFERENCES else start(
        testbed, "h3", _argv(work, "ref", [H3] * 4, *key), work, "ref.log")
    obs = Observer(testbed, str(work / "el"))
    job = start(testbed, "h0", _argv(work, "el", hostfile, *key, *ELASTIC, launcher=launcher),
                work)
    down = False
    try:
        wait_until(lambda: (work / f"el/ckpt/epoch-{cut_at:04d}/meta.json").exists() or
                   job.proc.poll() is not None, 90, f"the checkpoint of epoch {cut_at}")
        testbed.link("h2", up=False)
        down = True
        cut = time.monotonic()
        rc = job.wait(120)
        ended = time.monotonic() - cut
        took = wait_gone(work / "el", None, cut)  # h2's processes: their lease ends them
        procs = obs.stop()
        assert ref is None or ref.wait(60) == 0, ref.text()[-4000:]
        if ref is not None:
            REFERENCES[key] = work / "ref"
        testbed.link("h2", up=True)  # returns once Slurm sees h2 again
        down = False
        back = time.monotonic()
        wait_until(lambda: not testbed.strays("h2"), 60,
                   f"h2 empty (left: {testbed.strays('h2')})")
        empty = time.monotonic() - back
    finally:
        if down:
            testbed.link("h2", up=True)
        finish(job, obs, work / "el")
        if ref is not None and ref.proc.poll() is None:
            ref.proc.kill()
    out = job.text()
    print(f"{launcher}: elastic job ended {ended:.1f} s after the cut, {ended + cut - t0:.1f} s "
          f"after its start; nothing of it on any host {took:.1f} s after the cut; h2 empty "
          f"{empty:.1f} s after its link came back (load average {os.getloadavg()[0]:.1f})")
    assert rc == 0, out[-4000:]
    assert took < ended + 30 and anything_of(str(work)) == []
    assert re.search(rf"^mxlarge: restart 1/1 after: .*\b{re.escape(lost)}\b", out, re.M), \
        out[-4000:]
    # the newest checkpoint before the stall
    resumed = re.search(rf"^mxlarge: restart 1: resuming from {work}/el/ckpt/epoch-(\d+)$",
                        out, re.M)
    assert resumed is not None and int(resumed.group(1)) >= cut_at, out[-4000:]
    return Lost(out, sorted((p.role, p.host) for p in procs.values()), int(resumed.group(1)))


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


def _bitwise(work: Path, epoch: int) -> None:
    """The elastic job's last checkpoint is bitwise the uninterrupted job's."""
    ref = REFERENCES[(2, epoch, 1.5)]
    for f in ("model.params", "momentum.nd", "bn-0.nd", "bn-1.nd"):
        _same(ref / f"ckpt/epoch-{epoch:04d}" / f, work / f"el/ckpt/epoch-{epoch:04d}" / f)


@pytest.mark.timeout(240)
def test_a_cut_after_the_last_step_restarts_from_the_final_checkpoint_and_finishes(
        testbed: Testbed, work: Path) -> None:
    """h2 cut once the final checkpoint is written, while the workers run their final hooks
    (the model's export, the MLflow model): the job stalls, restarts on h0 and h1 from that
    checkpoint with no step left, and finishes: exit 0, its final weights those of the
    checkpoint, the run FINISHED; nothing left on any host."""
    # dmlc's ssh placement, process i on line i: servers h0, h1; workers h1, h2
    el = _lose_h2(testbed, work, "ssh", [H0, H1, H1, H2], H2, 2, cut_at=2)
    assert el.resumed == 2, el.out[-4000:]
    assert ("restart 1: world 1 worker(s) x 2 simulated worker(s) x 16 images = global batch "
            f"32 (lost: {H2})") in el.out, el.out[-4000:]
    assert f"restart 1: hosts {H0}, {H1}, {H1} (2 server(s), 1 worker(s); lost: {H2})" in el.out
    assert "no steps left after the resume" in el.out, el.out[-4000:]
    assert "done: 86 steps on 1 worker(s) x 2 simulated worker(s)" in el.out, el.out[-4000:]
    # the first attempt on h0, h1, h2; the second without h2
    assert el.where == sorted([("scheduler", "h0")] * 2 + [("server", "h0"), ("server", "h1")] * 2
                              + [("worker", "h1"), ("worker", "h2"), ("worker", "h1")]), el.where
    _the_run(work, el.resumed, 2)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launcher, hostfile, hosts", [("mpi", ["h1", "h2"], "h1 slots=2"),
                                                      ("slurm", None, "h1")])
def test_an_mpi_or_slurm_job_loses_a_host_for_good_and_continues_on_the_rest_bitwise(
        testbed: Testbed, work: Path, launcher: str, hostfile: list[str] | None,
        hosts: str) -> None:
    # mpi: bare lines, one slot each for the layout: Open MPI alone would give each as many
    # slots as the host has cores (both workers on h1); mpirun reads a copy with slots=1, so
    # its by-slot placement puts a server and a worker on each host. Slurm: -N 2 -n 2 steps.
    el = _lose_h2(testbed, work, launcher, hostfile, "h2", 2)
    assert el.resumed < 2, el.out[-4000:]  # the cut lands in epoch 2
    assert ("restart 1: world 1 worker(s) x 2 simulated worker(s) x 16 images = global "
            "batch 32 (lost: h2)") in el.out, el.out[-4000:]
    assert f"restart 1: hosts {hosts} (2 server(s), 1 worker(s); lost: h2)" in el.out
    assert "done: 86 steps on 1 worker(s) x 2 simulated worker(s)" in el.out, el.out[-4000:]
    assert el.where == sorted([("scheduler", "h0")] * 2 + [("server", "h1"), ("server", "h2")]
                              + [("server", "h1")] * 2
                              + [("worker", "h1"), ("worker", "h2"), ("worker", "h1")]), el.where
    _bitwise(work, 2)
    _the_run(work, el.resumed, 2, "h2")
