"""Real dist_sync jobs across namespace hosts through every backend: ssh, mpirun and Slurm's
srun (inside an allocation) with the servers on a host of their own (h0; workers on h1, h2),
sbatch of launch/slurm.sbatch and MXNet's own launch.py co-located (dmlc puts server i and
worker i on line i), all at once; and the 128-GPU layout. In the slower cluster tier
(``make test-cluster-slow``).

Each job trains the 12-step equivalence recipe of tests/helpers.py (warmup, a decay, momentum)
with 2 workers and 2 servers, scheduler on the launching host. Checked per job: every process ran
in a testbed host's network namespace (/proc/PID/ns/net), on the hosts its layout says (the
launcher's layout line says the same), every listening socket on that host's own address or
loopback (ps-lite bound the host's address, never another host's or 0.0.0.0), weights within
1e-5 of one process with the global batch and bitwise equal to the same job co-located on
127.0.0.1, one MLflow run FINISHED with the hosts.
"""
from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from mxlarge.data.tiny import make_imagenet
from mxlarge.launcher.tuning import MALLOC
from mxlarge.testbed import Testbed
from tests.cluster.observe import Job, Observer, start
from tests.helpers import EQ_CONFIG, cli, load_params

PY = sys.executable  # the project venv's absolute path: what every host runs
REPO = Path(__file__).resolve().parents[2]
N_WORKERS, N_SERVERS = 2, 2
# the first test's setup runs every job; the slower cluster tier (`make test-cluster-slow`)
pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]


def write_config(work: Path, tracking: bool = True) -> Path:
    cfg = work / "eq.yaml"
    track = f"{{enabled: true, uri: 'sqlite:///{work}/mlruns.db'}}" if tracking else \
        "{enabled: false}"
    cfg.write_text(EQ_CONFIG.replace("tracking: {enabled: false}", f"tracking: {track}"))
    return cfg


def launch_argv(cfg: Path, launcher: str, *more: str) -> list[str]:
    return [PY, "-m", "mxlarge.cli", "launch", str(cfg), "-n", str(N_WORKERS), "-s",
            str(N_SERVERS), "--launcher", launcher, *more,
            f"train.save_params={cfg.parent}/w-{{rank}}.params"]


def reference_weights(d: Path) -> dict[str, list[dict]]:
    """One process with the global batch, and the same 2+2 job on 127.0.0.1 (root namespace),
    run in ``d``: the ``reference`` fixture of conftest.py (once per session)."""
    cfg = write_config(d, tracking=False)
    one = cli(["train", str(cfg), "dist.kvstore=local", "dist.workers=1",
               f"data.batch_size={8 * N_WORKERS}", f"train.save_params={d}/one.params"], d)
    assert one.returncode == 0, one.stderr[-3000:]
    lo = cli(["launch", str(cfg), "-n", str(N_WORKERS), "-s", str(N_SERVERS),
              f"train.save_params={d}/lo-{{rank}}.params"], d)
    assert lo.returncode == 0, lo.stdout[-3000:] + lo.stderr[-3000:]
    return {"one": [load_params(d / "one.params")],
            "loopback": [load_params(d / f"lo-{r}.params") for r in range(N_WORKERS)]}


def check_weights(work: Path, reference: dict[str, list[dict]]) -> None:
    want = reference["one"][0]
    for rank in range(N_WORKERS):
        got = load_params(work / f"w-{rank}.params")
        assert got.keys() == want.keys()
        diff = max(float(np.abs(got[n] - want[n]).max()) for n in want)
        assert diff <= 1e-5, (rank, diff)
        for n in want:  # the same computation as on loopback, bit for bit
            np.testing.assert_array_equal(got[n], reference["loopback"][rank][n])


def check_placement(tb: Testbed, obs: Observer, scheduler_host: str, hosts: set[str],
                    tuned: bool = True, server_hosts: list[str] | None = None) -> None:
    """Roles on their hosts, listening only on their own address; with ``tuned``, the
    launcher's process settings reached every server and worker (mxlarge's launcher, not
    MXNet's launch.py, which runs unmodified). Servers on ``server_hosts`` (one each) and the
    workers elsewhere, or, without, every server and every worker on a host of its own."""
    procs = obs.procs.values()
    assert sorted(p.role for p in procs) == \
        ["scheduler"] + ["server"] * N_SERVERS + ["worker"] * N_WORKERS, obs.procs
    assert [p.host for p in obs.by_role("scheduler")] == [scheduler_host]
    assert {p.host for p in procs} == hosts, obs.procs
    assert len({p.host for p in obs.by_role("worker")}) == N_WORKERS, obs.procs
    if server_hosts is None:
        assert len({p.host for p in obs.by_role("server")}) == N_SERVERS, obs.procs
    else:
        assert sorted(p.host for p in obs.by_role("server")) == server_hosts, obs.procs
        assert not {p.host for p in obs.by_role("worker")} & set(server_hosts), obs.procs
    for p in procs:
        assert p.host is not None
        own = tb.addr(p.host)
        assert own in p.listen, p  # ps-lite listens on its own host's address ...
        assert p.listen <= {own, "127.0.0.1"}, p  # ... and nowhere else (no 0.0.0.0)
        if tuned and p.role != "scheduler":
            assert p.malloc == MALLOC["MALLOC_MMAP_THRESHOLD_"], p


def check_run(work: Path, hosts: str | None):  # type: ignore[no-untyped-def]
    """The job's one MLflow run, FINISHED, with ``hosts`` as its tag (if given)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns.db")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1, runs
    assert runs[0].info.status == "FINISHED"
    if hosts is not None:
        assert runs[0].data.tags["hosts"] == hosts
    return runs[0]


def slurm_job_end(tb: Testbed, work: Path, job_id: str, timeout: float) -> tuple[str, str]:
    """Polls ``scontrol show job`` until the batch job has ended: its (JobState, ExitCode)."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(tb.on("h0", "scontrol", "-o", "show", "job", job_id), cwd=work,
                           capture_output=True, text=True, timeout=30)
        fields = dict(kv.split("=", 1) for kv in r.stdout.split() if "=" in kv)
        if fields.get("JobState") not in (None, "PENDING", "CONFIGURING", "RUNNING",
                                          "COMPLETING"):
            return fields["JobState"], fields.get("ExitCode", "?")
        assert time.monotonic() < deadline, f"batch job {job_id} still running: {r.stdout}"
        time.sleep(0.5)


@dataclass
class Launched:
    """One job of :func:`jobs`: its directory, what was observed, its exit status and output."""

    work: Path
    obs: Observer
    rc: int
    text: str


THREE = ["h0", "h1", "h2"]  # h3 is the host outside every job (test_foreign_host.py)


# The server-host layouts, said three ways: a role=server hostfile line (ssh), --server-hosts
# (mpi, slurm); both servers on h0, the workers on h1 and h2.
def _ssh(tb: Testbed, work: Path) -> list[str]:
    (work / "hosts").write_text(f"{tb.addr('h0')} role=server\n{tb.addr('h1')}\n"
                                f"{tb.addr('h2')}\n")
    return launch_argv(write_config(work), "ssh", "-H", str(work / "hosts"))


def _mpi(tb: Testbed, work: Path) -> list[str]:
    (work / "hosts").write_text("h1 slots=1\nh2 slots=1\n")
    return launch_argv(write_config(work), "mpi", "-H", str(work / "hosts"),
                       "--server-hosts", "h0")


def _srun(tb: Testbed, work: Path) -> list[str]:
    # -O: the allocation's one CPU on h0 takes both servers' tasks (Slurm counts CPUs per node)
    return ["salloc", "-O", "-N", "3", "-w", "h0,h1,h2",
            *launch_argv(write_config(work), "slurm", "--server-hosts", "h0")]


def _sbatch(tb: Testbed, work: Path) -> list[str]:
    return ["sbatch", "--parsable", "-N", "2", "-w", "h1,h2", f"--output={work}/slurm-%j.out",
            str(REPO / "launch" / "slurm.sbatch"), str(write_config(work)),
            f"train.save_params={work}/w-{{rank}}.params"]


def _launch_py(tb: Testbed, work: Path) -> list[str]:
    (work / "hosts").write_text(f"{tb.addr('h1')}\n{tb.addr('h2')}\n")
    cfg = write_config(work)
    # Each rank opens the store; two of them creating a fresh sqlite schema at once fail
    # ("duplicate column name"). mxlarge launch creates it first; here the test does.
    MlflowClient(tracking_uri=f"sqlite:///{work}/mlruns.db").search_experiments()
    command = f"{PY} -m mxlarge.cli train {cfg} train.save_params={work}/w-{{rank}}.params"
    return [PY, "-m", "mxlarge.launcher.mxnet_launch", "-n", str(N_WORKERS), "-s",
            str(N_SERVERS), "--launcher", "ssh", "-H", str(work / "hosts"), command]


def _imagenet(tb: Testbed, work: Path) -> list[str]:
    paths = make_imagenet(work, num_train=48, num_val=8, num_classes=4)
    (work / "hosts").write_text("".join(f"{tb.addr(h)}\n" for h in THREE))
    return [PY, "-m", "mxlarge.cli", "launch",
            str(REPO / "experiments/imagenet/mxnet-128gpu-4k.yaml"), "-n", "3", "-s", "3",
            "--launcher", "ssh", "-H", str(work / "hosts"),
            f"data.train_rec={paths['train_rec']}", f"data.val_rec={paths['val_rec']}",
            "data.train_samples=null", "data.num_classes=4", "data.batch_size=2",
            "data.image_size=32", "data.resize=36", "data.threads=1", "dist.devices=2",
            "dist.device_type=cpu", "train.max_steps=3", "train.progress=false",
            f"tracking.uri=sqlite:///{work}/mlruns.db"]


JOBS = {"ssh": _ssh, "mpi": _mpi, "srun": _srun, "sbatch": _sbatch, "launch_py": _launch_py}


@pytest.fixture(scope="module")
def jobs(testbed: Testbed) -> Iterator[dict[str, Launched]]:
    """Every job of this module started at once from h0, each in its own directory (the
    observers tell their processes apart by it; ps-lite picks its ports per job), then waited
    for: the hosts run the backends side by side as a cluster runs several jobs. The sbatch job
    has ended when Slurm says so (:func:`slurm_job_end`; its status is what ``sbatch --wait``
    would return, polled every 0.5 s instead of 2-10 s)."""
    started: dict[str, tuple[Path, Observer, Job]] = {}
    try:
        for name, argv_of in JOBS.items():
            work = testbed.root / "work" / f"jobs-{name}-{uuid.uuid4().hex[:6]}"
            work.mkdir(parents=True)
            argv = argv_of(testbed, work)
            sbatch = name == "sbatch"
            env = {"MXLARGE_PYTHON": PY, "MXLARGE_WORKERS": str(N_WORKERS),
                   "MXLARGE_SERVERS": str(N_SERVERS)} if sbatch else None
            obs = Observer(testbed, str(work))
            started[name] = (work, obs, start(testbed, "h0", argv, work, env=env,
                                              log_name="sbatch.log" if sbatch else "job.log"))
        done: dict[str, Launched] = {}
        for name, (work, obs, job) in started.items():
            if name == "sbatch":
                assert job.wait(60) == 0, job.text()
                state = slurm_job_end(testbed, work, job.text().split()[-1], 300)
                out = "".join(p.read_text() for p in work.glob("slurm-*.out"))
                done[name] = Launched(work, obs, 0 if state == ("COMPLETED", "0:0") else 1,
                                      f"{state}\n{out}")
            else:
                rc = job.wait(360)
                done[name] = Launched(work, obs, rc, job.text())
    finally:
        for _, obs, job in started.values():
            obs.stop()
            if job.proc.poll() is None:
                job.proc.kill()
    yield done


def finished(launched: Launched) -> Observer:
    """The job's observer, after checking that it ended well."""
    assert launched.rc == 0, launched.text[-4000:]
    assert "ssh could not connect" not in launched.text
    return launched.obs


# job, where its scheduler runs, the hosts its processes run on, whether mxlarge's launcher
# started it (its process settings reach every server and worker), the MLflow ``hosts`` tag,
# the server hosts (None: co-located), the launcher's layout line (None: not mxlarge's):
# - ssh: ``mxlarge launch --launcher ssh`` over 198.18.0.10 role=server, .11, .12, scheduler
#   on h0;
# - mpi: ``mxlarge launch --launcher mpi --server-hosts h0`` over h1, h2, scheduler on h0;
# - srun: ``salloc -O -N 3 -w h0,h1,h2 mxlarge launch ... --launcher slurm --server-hosts h0``:
#   salloc runs the launcher (and so the scheduler) on h0, the server step on h0, the workers'
#   on h1 and h2;
# - sbatch: ``sbatch -N 2 launch/slurm.sbatch CONFIG``: the batch script runs on the first node
#   (h1), scheduler there, steps on h1 and h2;
# - launch_py: MXNet's tools/launch.py (ssh) through mxlarge.launcher.mxnet_launch, command
#   ``mxlarge train``: the rank-0 worker makes the MLflow run itself (no ``mxlarge launch``).
OWN = "layout: scheduler on {h0}; 2 server(s) on their own host(s): {servers}; 2 worker(s) on " \
    "{workers}; each worker host sends and receives |g| per step"
PLACED = [("ssh", "h0", {"h0", "h1", "h2"}, True, "{h0},{h1},{h2}", ["h0", "h0"],
           OWN.replace("{servers}", "{h0}").replace("{workers}", "{h1}, {h2}")),
          ("mpi", "h0", {"h0", "h1", "h2"}, True, "{h0},h1,h2,h0", ["h0", "h0"],
           OWN.replace("{servers}", "h0").replace("{workers}", "h1, h2")),
          ("srun", "h0", {"h0", "h1", "h2"}, True, "{h0},h0,h1,h2", ["h0", "h0"],
           OWN.replace("{servers}", "h0").replace("{workers}", "h1, h2")),
          ("sbatch", "h1", {"h1", "h2"}, True, "{h1},h1,h2", None,
           "layout: scheduler on {h1}; 2 server(s) co-located with the workers: h1, h2; 2 "
           "worker(s) on h1, h2; each worker host sends and receives 2(n-1)/n·|g| per step"),
          ("launch_py", "h0", {"h0", "h1", "h2"}, False, None, None, None)]


@pytest.mark.parametrize("name, scheduler, hosts, tuned, tag, server_hosts, layout", PLACED,
                         ids=[row[0] for row in PLACED])
def test_a_backend_runs_the_2_plus_2_job_bitwise(testbed: Testbed, jobs: dict[str, Launched],
                                                 reference: dict[str, list[dict]], name: str,
                                                 scheduler: str, hosts: set[str], tuned: bool,
                                                 tag: str | None, server_hosts: list[str] | None,
                                                 layout: str | None) -> None:
    job = jobs[name]
    check_placement(testbed, finished(job), scheduler, hosts, tuned=tuned,
                    server_hosts=server_hosts)
    addrs = {h: testbed.addr(h) for h in ("h0", "h1", "h2")}
    if layout is not None:
        assert layout.format(**addrs) in job.text, job.text[-3000:]
    check_weights(job.work, reference)
    check_run(job.work, None if tag is None else tag.format(**addrs))


def test_imagenet_128gpu_layout_one_worker_per_host(testbed: Testbed, work: Path) -> None:
    """experiments/imagenet/mxnet-128gpu-4k.yaml as its layout runs (one worker process per
    machine driving several devices, dist_device_sync, one server per machine), shrunk to fit:
    3 hosts x 2 CPU devices x 2 images of 32 px, generated RecordIO, 3 steps."""
    obs = Observer(testbed, str(work))
    started = start(testbed, "h0", _imagenet(testbed, work), work)
    try:
        rc = started.wait(300)
    finally:
        obs.stop()
    job = Launched(work, obs, rc, started.text())
    obs = finished(job)
    assert sorted(p.host for p in obs.by_role("worker")) == THREE  # one worker per host
    assert sorted(p.host for p in obs.by_role("server")) == THREE
    for p in obs.procs.values():
        assert p.host is not None and p.listen <= {testbed.addr(p.host), "127.0.0.1"}, p
    assert "done: 3 steps on 3 worker(s) x 2 device(s) x 2 images" in job.text, job.text[-3000:]
    run = check_run(job.work, ",".join(testbed.addr(h) for h in THREE))
    assert run.data.params["dist.kvstore"] == "dist_device_sync"
    assert run.data.params["plan.global_batch"] == str(3 * 2 * 2)
