"""Server hosts as a layout, in-process: the hostfile's ``role=server`` lines and
``dist.server_hosts``, where each backend puts each server and worker, and the command lines
dmlc_tracker's own mpi and slurm code builds, as the backends fix them (the jobs themselves
run on the namespace testbed: tests/cluster/test_jobs.py)."""
from __future__ import annotations

import argparse
import importlib
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from mxlarge.launcher.hostfile import HostEntry, place, read_hostfile, with_server_hosts
from mxlarge.launcher.registry import backend_for


def test_role_server_lines_and_dist_server_hosts(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("10.0.0.9 role=server  # spare CPU box\n10.0.0.1\n10.0.0.2 role=worker\n")
    lines = read_hostfile(str(f))
    assert [(e.host, e.server) for e in lines] == \
        [("10.0.0.9", True), ("10.0.0.1", False), ("10.0.0.2", False)]
    f.write_text("10.0.0.1 role=servers\n")
    with pytest.raises(ValueError, match=rf"hostfile {f}, line 1: role=servers: expected "
                                         "role=server or role=worker"):
        read_hostfile(str(f))
    plain = [HostEntry("a", None, None), HostEntry("b", None, None)]
    # a listed host becomes a server host, an unlisted one is added
    got = with_server_hosts(plain, ["b", "c"], "F")
    assert [(e.host, e.server) for e in got] == [("a", False), ("b", True), ("c", True)]
    assert with_server_hosts(lines, ["10.0.0.9"], "F") == lines  # the same answer twice
    with pytest.raises(ValueError, match="role=server lines name 10.0.0.9 but "
                                         "dist.server_hosts is c: expected one"):
        with_server_hosts(lines, ["c"], "F")
    with pytest.raises(ValueError, match="every line is a server host"):
        with_server_hosts(plain, ["a", "b"], "F")


def test_place_round_robin_per_role_and_dmlc_co_located() -> None:
    lines = [HostEntry("s", None, None, True), HostEntry("w1", None, None),
             HostEntry("w2", None, None)]
    servers, workers = place(lines, 3, 4)
    assert [e.host for e in servers] == ["s", "s", "s"]
    assert [e.host for e in workers] == ["w1", "w2", "w1", "w2"]
    co = [HostEntry("a", None, None), HostEntry("b", None, None)]
    servers, workers = place(co, 2, 2)  # dmlc's ssh: process i on line i mod L
    assert [e.host for e in servers + workers] == ["a", "b", "a", "b"]


def test_ssh_gives_dmlc_one_line_per_process(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("10.0.0.1\n10.0.0.2\n")
    ssh = backend_for("ssh")
    lines = ssh.check_hosts(str(f), 2, 3, ["10.0.0.9"])
    assert [(e.host, e.server) for e in lines] == [("10.0.0.9", True)] * 3 + \
        [("10.0.0.1", False), ("10.0.0.2", False)]
    lay = ssh.layout(lines, 3, 2, "10.0.0.9")
    assert lay.dedicated
    assert lay.describe() == (
        "layout: scheduler on 10.0.0.9; 3 server(s) on their own host(s): 10.0.0.9; "
        "2 worker(s) on 10.0.0.1, 10.0.0.2; each worker host sends and receives |g| per step")
    co = ssh.layout(ssh.check_hosts(str(f), 2, 2), 2, 2, "10.0.0.1")
    assert not co.dedicated and "co-located with the workers: 10.0.0.1, 10.0.0.2" in \
        co.describe() and "2(n-1)/n·|g|" in co.describe()
    with pytest.raises(ValueError, match=r"2 server hosts \(10.0.0.8, 10.0.0.9\) but 1 "
                                         r"server\(s\): expected -s/--servers >= 2"):
        ssh.check_hosts(str(f), 2, 1, ["10.0.0.8", "10.0.0.9"])
    with pytest.raises(ValueError, match=r"lists 1 worker host\(s\) but 2 workers"):
        ssh.check_hosts(str(f), 2, 1, ["10.0.0.2"])
    with pytest.raises(ValueError, match=r"needs IP addresses, not names \(spare\)"):
        ssh.check_hosts(str(f), 2, 1, ["spare"])


def _dmlc_commands(name: str, workers: int, servers: int, host_file: str | None,
                   backend: Any) -> list[str]:
    """The commands dmlc_tracker's own ``name`` backend starts for a job, through ``backend``'s
    fixes (its tracker does not run: fun_submit is called with the environment it would
    pass)."""
    module = importlib.import_module(f"dmlc_tracker.{name}")

    class Recorder:
        commands: list[str] = []
        PIPE = -1

        def check_call(self, prog: str, shell: bool = False) -> int:
            self.commands.append(backend.fix_command(prog))
            return 0

        def Popen(self, *args: Any, **kwargs: Any) -> Any:  # mpirun --version
            return argparse.Namespace(communicate=lambda: (b"mpirun (Open MPI) 4.1.4", b""))

    class Tracker:
        @staticmethod
        def submit(nworker: int, nserver: int, fun_submit: Any, **kw: Any) -> None:
            fun_submit(nworker, nserver, {"DMLC_PS_ROOT_URI": "10.0.0.9"})

    args = argparse.Namespace(num_workers=workers, num_servers=servers, host_file=host_file,
                              command=["python", "train.py"], slurm_worker_nodes=None,
                              slurm_server_nodes=None)
    rec = Recorder()
    saved = module.subprocess, module.tracker, module.Thread
    module.subprocess, module.tracker = rec, Tracker

    class Now:  # dmlc's daemon threads, run at start()
        def __init__(self, target: Any, args: tuple) -> None:
            self.run = lambda: target(*args)

        def setDaemon(self, daemonic: bool) -> None:
            pass

        def start(self) -> None:
            self.run()
    module.Thread = Now
    try:
        module.submit(args)
    finally:
        module.subprocess, module.tracker, module.Thread = saved
    return rec.commands


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs mpirun (make test-cluster)")
def test_open_mpi_gets_every_slot_count_the_layout_assumes(tmp_path: Path) -> None:
    """A line without a slot count is one slot in the layout; Open MPI would give it as many as
    its host has cores (both workers on w1), so its mpirun reads a copy that says 1."""
    import contextlib

    from mxlarge.launcher.backends import mpi as mpi_module

    f = tmp_path / "hosts"
    f.write_text("w1\nw2:2\n")
    mpi = backend_for("mpi")
    lines = mpi.check_hosts(str(f), 3, 1)
    with contextlib.ExitStack() as stack:
        given = Path(mpi.prepare(str(f), lines, stack)[0])
        if mpi_module._open_mpi():
            assert given != f and given.read_text() == "w1 slots=1\nw2 slots=2\n"
        else:  # MPICH: a bare line is one slot already, and its hostfile syntax is host:n
            assert given == f
    assert given == f or not given.exists()  # a copy lives as long as the job
    f.write_text("w1 slots=1\nw2 slots=2\n")
    with contextlib.ExitStack() as stack:
        assert mpi.prepare(str(f), mpi.check_hosts(str(f), 3, 1), stack)[0] == str(f)
    # what mpirun's by-slot mapping does over the copy: w1 one rank, w2 two
    assert mpi.layout(lines, 1, 3, "h0").describe().startswith(
        "layout: scheduler on h0; 1 server(s) co-located with the workers: w1; 3 worker(s) on "
        "w1, w2;")


def test_mpi_servers_get_a_hostfile_of_their_own(tmp_path: Path) -> None:
    import contextlib

    f = tmp_path / "hosts"
    f.write_text("w1 slots=2\nw2\nspare role=server\n")
    mpi = backend_for("mpi")
    lines = mpi.check_hosts(str(f), 3, 2)
    with contextlib.ExitStack() as stack:
        dmlc_file = mpi.prepare(str(f), lines, stack)[0]
        assert Path(dmlc_file).read_text() == "w1 slots=2\nw2 slots=1\n"
        commands = _dmlc_commands("mpi", 3, 2, dmlc_file, mpi)
        files = {re.search(r"DMLC_ROLE=(\w+)", c).group(1):
                 Path(re.search(r"--hostfile (\S+)", c).group(1)).read_text() for c in commands}
    assert files == {"worker": "w1 slots=2\nw2 slots=1\n", "server": "spare slots=2\n"}
    assert mpi.layout(lines, 2, 3, "spare").describe().startswith(
        "layout: scheduler on spare; 2 server(s) on their own host(s): spare; 3 worker(s) on "
        "w1, w2")
    with pytest.raises(ValueError, match=r"provides 3 slot\(s\) on 2 worker host\(s\) but 4 "
                                         "workers need 4"):
        mpi.check_hosts(str(f), 4, 1)
    f.write_text("w1 slots=2\nw2\n")
    assert [(e.host, e.server) for e in mpi.check_hosts(str(f), 2, 2, ["w2", "spare"])] == \
        [("w1", False), ("w2", True), ("spare", True)]  # a listed host, an added one


def test_slurm_steps_on_two_node_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    slurm_mod = importlib.import_module("mxlarge.launcher.backends.slurm")
    monkeypatch.setattr(slurm_mod, "slurm_nodes", lambda: ["n0", "n1", "n2", "n3"])
    slurm = backend_for("slurm")
    assert slurm.check_hosts(None, 2, 2, ["n0"]) is None
    commands = {re.search(r"DMLC_ROLE=(\w+)", c).group(1): c
                for c in _dmlc_commands("slurm", 2, 2, None, slurm)}
    assert " -N 1 -w n0 -n 2 python train.py" in commands["server"]
    assert " -N 2 -x n0 -n 2 python train.py" in commands["worker"]
    assert slurm.layout(None, 2, 2, "n0").describe().startswith(
        "layout: scheduler on n0; 2 server(s) on their own host(s): n0; 2 worker(s) on "
        "n1, n2, n3")
    with pytest.raises(ValueError, match=r"dist.server_hosts: n9 not among the allocation's "
                                         r"nodes \(n0, n1, n2, n3\)"):
        slurm.check_hosts(None, 2, 2, ["n9"])
    with pytest.raises(ValueError, match="every node of the allocation"):
        slurm.check_hosts(None, 1, 4, ["n0", "n1", "n2", "n3"])


def test_local_refuses_server_hosts() -> None:
    from mxlarge.launcher.job import JobSpec
    from mxlarge.plan import World

    with pytest.raises(ValueError, match="dist.server_hosts = h9: expected none with "
                                         "--launcher local"):
        JobSpec("local", ["true"], World(2, 1, 1, 8), 1, server_hosts=("h9",))
