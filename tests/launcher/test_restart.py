"""The restart policy and loop with scripted attempts (no processes; real restarted jobs are
tests/e2e/test_restart.py), the local probe and the elastic world of each attempt, the restart
plan (what each attempt runs), and the parts of an elastic ssh or mpi job that need no testbed
(the whole jobs: tests/cluster/test_elastic.py)."""
import shutil
import socket
import time
from pathlib import Path

import pytest

from mxlarge.launcher.backends.local import local_hosts, local_probe
from mxlarge.launcher.backends.mpi import MpiBackend, mpi_slots
from mxlarge.launcher.backends.mpi import survivors_hostfile as mpi_survivors
from mxlarge.launcher.backends.ssh import ssh_probe, ssh_slots, survivors_hostfile
from mxlarge.launcher.hostfile import HostEntry
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.reach import ssh_fails
from mxlarge.launcher.restart import (
    Attempt,
    Elastic,
    Failure,
    RestartPlan,
    RestartPolicy,
    run_with_restarts,
)
from mxlarge.plan import World


def test_policy_counts_restarts_and_spots_repeats():
    policy = RestartPolicy(2)
    crash = Failure("crashed", "server", -9, 40, "server 0 exited with signal 9 (SIGKILL)")
    stall = Failure("stalled", "worker", None, 90, "stalled: ...")
    assert policy.give_up(crash) is None and policy.restarts == 1
    assert policy.give_up(stall) is None and policy.restarts == 2
    assert policy.give_up(Failure("crashed", "worker", 1, 95, "x")) == "2 restart(s) used up"
    again = RestartPolicy(9)
    assert again.give_up(Failure("crashed", "worker", 1, None, "x")) is None
    assert again.give_up(Failure("crashed", "worker", 1, None, "x")) is None  # step unknown
    assert again.give_up(Failure("crashed", "worker", 1, 7, "x")) is None
    assert "twice" in again.give_up(Failure("crashed", "worker", 1, 7, "y"))
    assert again.restarts == 3



def _failed(step, status=1):
    return Outcome(status, f"worker 0 exited with status {status}", "crashed", step,
                   ProcessFailure("worker", 0, 0, status=status))


def test_attempts_run_until_success_or_the_policy_stops():
    lines, told = [], []
    outcomes = iter([_failed(3), _failed(5), Outcome(0, "done")])
    numbers = []

    def attempt(n):
        numbers.append(n)
        return next(outcomes)

    out = run_with_restarts(attempt, RestartPolicy(5), lines.append,
                            lambda f, r, why: told.append((f.step, r, why)))
    assert out.exit_code == 0 and numbers == [0, 1, 2]
    assert told == [(3, 1, None), (5, 2, None)]
    assert lines == ["restart 1/5 after: worker 0 exited with status 1 at step 3",
                     "restart 2/5 after: worker 0 exited with status 1 at step 5"]


def test_the_same_failure_twice_is_not_restarted_and_no_restarts_means_one_attempt():
    lines = []
    out = run_with_restarts(lambda n: _failed(7), RestartPolicy(5), lines.append)
    assert out.exit_code == 1 and len(lines) == 2
    assert lines[1].startswith("not restarting: the same failure at step 7 twice")
    calls = []
    out = run_with_restarts(lambda n: calls.append(n) or _failed(7), RestartPolicy(0),
                            lines.append)
    assert calls == [0] and len(lines) == 2  # no line, no callback


def test_an_interrupted_launcher_is_never_restarted():
    calls = []
    stopped = Outcome(130, "interrupted")
    out = run_with_restarts(lambda n: calls.append(n) or stopped, RestartPolicy(3), print)
    assert out is stopped and calls == [0]


# -- elastic ssh jobs: where dmlc puts them, the survivors' hostfile, the ssh probe ---------

def _lines(*hosts: str) -> list[HostEntry]:
    return [HostEntry(h.partition(":")[0], h.partition(":")[2] or None, None) for h in hosts]


def test_ssh_slots_follow_dmlcs_round_robin_servers_first():
    servers, workers = ssh_slots(_lines("a", "b", "b", "c"), 2, 2)
    assert [e.host for e in servers] == ["a", "b"] and [e.host for e in workers] == ["b", "c"]
    servers, workers = ssh_slots(_lines("a", "b"), 2, 2)  # line i mod 2
    assert [e.host for e in servers] == ["a", "b"] and [e.host for e in workers] == ["a", "b"]


def test_survivors_hostfile_puts_each_process_on_a_host_that_answered():
    slots = ssh_slots(_lines("a", "b", "b", "c:2222"), 2, 2)
    # worker host c lost: 2 servers on a, b; the one worker on its own line's host b
    assert survivors_hostfile(*slots, {"a", "b"}, 2, 1) == "a\nb\nb\n"
    # server host a lost: both servers re-placed on b; the workers keep b and c (its port too)
    assert survivors_hostfile(*slots, {"b", "c"}, 2, 2) == "b\nb\nb\nc:2222\n"
    # no server host answers: the servers go to the workers' hosts
    only_c = ssh_slots(_lines("a", "b", "c"), 1, 2)
    assert survivors_hostfile(*only_c, {"c"}, 1, 1) == "c\nc\n"
    with pytest.raises(ValueError, match="2 worker.s. but 1 answering worker line"):
        survivors_hostfile(*slots, {"a", "b"}, 2, 2)


def test_elastic_probes_the_server_hosts_too_and_names_them_lost():
    answering = {"a", "b", "c"}
    asked: list[list[str]] = []

    def probe(hosts):
        asked.append(list(hosts))
        return [h for h in hosts if h in answering]

    e = Elastic(World(2, batch=8), ["b", "c"], probe, others=["a", "b"])
    answering.discard("a")  # a server-only host: the workers' world stays
    assert e.replan() is None and asked[-1] == ["b", "c", "a"]
    assert e.world == World(2, batch=8) and e.lost == ["a"] and e.answering == {"b", "c"}
    answering.discard("c")
    assert e.replan() is None and e.world == World(1, simulated=2, batch=8)
    assert e.lost == ["c", "a"]
    answering |= {"a", "c"}  # both answer again: the declared world
    assert e.replan() is None and e.world == World(2, batch=8) and e.lost == []


# -- elastic mpi jobs: mpirun's by-slot placement, the survivors' mpi hostfile ---------------

def _mpi_lines(*lines: str) -> list[HostEntry]:
    out = []
    for line in lines:
        host, *opts = line.split()
        kv = dict(o.split("=") for o in opts)
        out.append(HostEntry(host, None, int(kv["slots"]) if "slots" in kv else None,
                             kv.get("role") == "server"))
    return out


def test_mpi_slots_fill_each_hosts_slots_in_order():
    servers, workers = mpi_slots(_mpi_lines("a", "b"), 2, 2)  # co-located: both fill a, b
    assert [e.host for e in servers] == ["a", "b"] and [e.host for e in workers] == ["a", "b"]
    servers, workers = mpi_slots(_mpi_lines("a slots=2", "b slots=2"), 1, 3)
    assert [e.host for e in servers] == ["a"] and [e.host for e in workers] == ["a", "a", "b"]
    servers, workers = mpi_slots(_mpi_lines("s role=server", "a", "b"), 2, 2)
    assert [e.host for e in servers] == ["s", "s"] and [e.host for e in workers] == ["a", "b"]


def test_mpi_survivors_hostfile_keeps_the_workers_slots_and_places_the_servers():
    # co-located, b lost: 1 worker and 2 servers on a, which needs 2 slots for the servers
    assert mpi_survivors(_mpi_lines("a", "b"), 2, {"a"}, 2, 1) == "a slots=2\n"
    # the servers' extra slots go on the last worker host: the workers' fill stays a, a, c
    lines = _mpi_lines("a slots=2", "b", "c")
    assert mpi_survivors(lines, 4, {"a", "c"}, 4, 3) == "a slots=2\nc slots=2\n"
    # answering server hosts stay server lines (a lost one is dropped), workers on the rest
    lines = _mpi_lines("s role=server", "t role=server", "a", "b")
    assert mpi_survivors(lines, 2, {"t", "a"}, 2, 1) == "a slots=1\nt role=server\n"
    # no server host answers: the servers share the workers' host
    assert mpi_survivors(lines, 2, {"b"}, 2, 1) == "b slots=2\n"
    with pytest.raises(ValueError, match="2 worker.s. but 1 answering worker slot"):
        mpi_survivors(_mpi_lines("a", "b"), 2, {"a"}, 2, 2)


def test_mpi_elastic_probes_worker_and_server_hosts_and_refuses_mpiruns_own_agent(
        monkeypatch):
    for var in ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_rsh_agent"):
        monkeypatch.delenv(var, raising=False)
    backend = MpiBackend()
    e = backend.elastic(World(2, batch=8), 2, _mpi_lines("s role=server", "a", "b"), 1, None)
    assert (e.hosts, e.others) == (["a", "b"], ["s", "s"])
    assert backend.attempt_hostfile(_mpi_lines("a", "b"), e, 2, 2, 1) is None  # none lost
    with pytest.raises(ValueError, match="--local-lost: expected with --launcher local"):
        backend.elastic(World(2, batch=8), 2, _mpi_lines("a", "b"), 1, "lost")
    for var in ("OMPI_MCA_plm_rsh_agent", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_rsh_agent"):
        with monkeypatch.context() as m:
            m.setenv(var, "rsh")
            with pytest.raises(ValueError, match=rf"^--elastic with --launcher mpi: {var} is "
                                                 r"set \(mpirun's remote"):
                backend.elastic(World(2, batch=8), 2, _mpi_lines("a", "b"), 1, None)


def test_ssh_probe_takes_a_host_whose_ssh_fails_as_lost():
    """A real ``ssh -p PORT 127.0.0.1 true`` to a port nothing listens on: refused at once."""
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    why = ssh_fails("127.0.0.1", port, timeout=3)
    assert why is not None and why.startswith("ssh 127.0.0.1 true: status 255"), why
    assert ssh_probe({"127.0.0.1": port})(["127.0.0.1", "127.0.0.1"]) == []
    assert time.monotonic() - started < 6


# --------------------------------------------------------------------------- local elastic jobs

def test_local_probe_reads_the_lost_file_at_each_probe(tmp_path):
    hosts = local_hosts(3)
    assert hosts == ["worker-0", "worker-1", "worker-2"]
    lost = tmp_path / "lost"
    probe = local_probe(lost)
    assert probe(hosts) == hosts  # no file: none lost
    lost.write_text("worker-1\n\n")
    assert probe(hosts) == ["worker-0", "worker-2"]
    lost.write_text("")  # the host answers again
    assert probe(hosts) == hosts
    assert local_probe(None)(hosts) == hosts


def test_elastic_follows_the_live_hosts_and_grows_back():
    live = {"worker-0", "worker-1", "worker-2", "worker-3"}
    e = Elastic(World(4, batch=8), local_hosts(4), lambda hs: [h for h in hs if h in live])
    assert e.world == World(4, batch=8) and e.lost == []
    live.discard("worker-3")
    assert e.replan() is None
    assert e.world == World(2, simulated=2, batch=8) and e.lost == ["worker-3"]
    live.add("worker-3")
    assert e.replan() is None and e.world == World(4, batch=8) and e.lost == []


def test_elastic_refusal_keeps_the_last_world_and_names_the_lost():
    e = Elastic(World(2, batch=8), local_hosts(2), lambda hs: hs[:1], min_workers=2)
    why = e.replan()
    assert why.startswith("no world keeps global batch 16") and why.endswith(
        "(lost: worker-1)")
    assert e.world == World(2, batch=8)


def _crash(step):
    return Outcome(137, "worker 1 exited with signal 9 (SIGKILL)", "crashed", step,
                   ProcessFailure("worker", 1, 1))


def test_run_with_restarts_asks_for_a_world_before_each_granted_restart():
    outcomes = [_crash(10), _crash(20), Outcome(0, "")]
    asked: list[int] = []
    got = run_with_restarts(lambda n: outcomes[n], RestartPolicy(3), lambda line: None,
                            replan=lambda: asked.append(1))
    assert got.exit_code == 0 and len(asked) == 2


def test_a_refused_world_ends_the_job_and_is_not_counted_as_a_restart():
    lines: list[str] = []
    told: list[tuple[int, str | None]] = []
    policy = RestartPolicy(3)
    got = run_with_restarts(lambda n: _crash(10), policy, lines.append,
                            lambda f, restarts, why: told.append((restarts, why)),
                            replan=lambda: "no world keeps global batch 16")
    assert got.exit_code == 137 and policy.restarts == 0
    assert told == [(0, "no world keeps global batch 16")]
    assert lines == ["not restarting: no world keeps global batch 16; last failure: worker 1 "
                     "exited with signal 9 (SIGKILL)"]


# --------------------------------------------------------------------------- the restart plan

def test_the_plan_resumes_the_first_attempt_from_resume_and_restarts_from_the_newest():
    newest: list[Path | None] = [None]
    plan = RestartPlan(RestartPolicy(2), World(2, batch=8), 1, resume=Path("/given"),
                       latest=lambda: newest[0])
    assert plan.attempt(0) == Attempt(0, World(2, batch=8), 1, Path("/given"))
    assert plan.attempt(1).resume == Path("/given")  # no checkpoint of this job yet
    newest[0] = Path("/ckpt-40")
    assert plan.attempt(2) == Attempt(2, World(2, batch=8), 1, Path("/ckpt-40"))
    assert RestartPlan(RestartPolicy(0), World(1), 1).attempt(0).resume is None


def test_an_elastic_plan_runs_each_attempt_in_the_world_of_the_live_hosts():
    """The declared world and servers while every host answers; after a loss the smaller world
    with the servers of that world and the backend's hostfile; a world recorded when it
    changes (and for the first attempt)."""
    live = {"worker-0", "worker-1"}
    elastic = Elastic(World(2, batch=8), ["worker-0", "worker-1"],
                      lambda hs: [h for h in hs if h in live])
    asked: list[tuple[int, int]] = []

    def hostfile_of(e, servers, workers):
        asked.append((servers, workers))
        return "h0\n" if e.lost else None

    plan = RestartPlan(RestartPolicy(3), World(2, batch=8), 2, elastic=elastic,
                       servers_of=lambda world: 7, hostfile_of=hostfile_of)
    first = plan.attempt(0)
    assert (first.world, first.servers, first.hostfile, first.new_world, first.lost) == \
        (World(2, batch=8), 2, None, True, ())
    live.discard("worker-1")
    assert elastic.replan() is None
    second = plan.attempt(1)
    assert (second.world, second.servers, second.hostfile, second.new_world, second.lost) == \
        (World(1, simulated=2, batch=8), 7, "h0\n", True, ("worker-1",))
    assert elastic.replan() is None
    assert plan.attempt(2).new_world is False  # the same smaller world again
    assert asked == [(2, 2), (7, 1), (7, 1)]


def test_the_plan_runs_attempts_until_the_policy_stops_and_probes_before_each_restart():
    probes: list[int] = []
    elastic = Elastic(World(2, batch=8), ["a", "b"], lambda hs: probes.append(1) or list(hs))
    outcomes = iter([_failed(3), _failed(5), Outcome(0, "done")])
    seen: list[Attempt] = []

    def attempt(a: Attempt) -> Outcome:
        seen.append(a)
        return next(outcomes)

    out = RestartPlan(RestartPolicy(5), World(2, batch=8), 1, elastic=elastic).run(
        attempt, lambda line: None)
    assert out.exit_code == 0 and [a.number for a in seen] == [0, 1, 2] and len(probes) == 2


# -- elastic Slurm jobs: the allocation's nodes, the survivors' steps ------------------------

def test_slurm_elastic_runs_a_restart_on_the_answering_nodes_only(monkeypatch, tmp_path):
    """h2 lost in a 2-node allocation: the restart's hostfile is h1, whose steps leave h2 out
    and overcommit h1 (2 servers, 1 worker: the allocation may grant one CPU per node)."""
    import importlib

    from tests.launcher.test_layout import _dmlc_commands

    slurm_mod = importlib.import_module("mxlarge.launcher.backends.slurm")
    monkeypatch.setattr(slurm_mod, "slurm_nodes", lambda: ["h1", "h2"])
    monkeypatch.setattr(slurm_mod, "silent_nodes", lambda nodes: {"h2": "cut"})
    backend = slurm_mod.SlurmBackend()
    assert backend.check_hosts(None, 2, 2) is None
    e = backend.elastic(World(2, batch=8), 2, None, 1, None)
    assert (e.hosts, e.others) == (["h1", "h2"], [])
    assert backend.attempt_hostfile(None, e, 2, 2, 2) is None  # nobody lost yet
    assert e.replan() is None and e.world == World(1, simulated=2, batch=8) and e.lost == ["h2"]
    text = backend.attempt_hostfile(None, e, 2, 2, 1)
    assert text == "h1\n"
    with pytest.raises(ValueError, match="--local-lost: expected with --launcher local"):
        backend.elastic(World(2, batch=8), 2, None, 1, "lost")
    with pytest.raises(ValueError, match=r"3 workers on 2 worker node\(s\) \(h1, h2\)"):
        backend.elastic(World(3, batch=8), 2, None, 1, None)
    (tmp_path / "nodes").write_text(text)
    attempt = slurm_mod.SlurmBackend()
    assert attempt.check_hosts(str(tmp_path / "nodes"), 1, 2) is None
    commands = {c.split("DMLC_ROLE=")[1].split()[0]: c
                for c in _dmlc_commands("slurm", 1, 2, None, attempt)}
    assert attempt.layout(None, 2, 1, "h0").describe().startswith(
        "layout: scheduler on h0; 2 server(s) co-located with the workers: h1; 1 worker(s) on h1")
    (tmp_path / "nodes").write_text("h1\nh9\n")
    with pytest.raises(ValueError, match=r"h9 not among the allocation's nodes \(h1, h2\)"):
        attempt.check_hosts(str(tmp_path / "nodes"), 1, 2)
    (tmp_path / "nodes").write_text("h1 slots=2\n")
    with pytest.raises(ValueError, match=r"h1: expected node names only"):
        attempt.check_hosts(str(tmp_path / "nodes"), 1, 2)
    assert " --overcommit " in commands["server"] and " -N 1 -x h2 -n 2 " in commands["server"]
    assert " --overcommit " not in commands["worker"] and " -N 1 -x h2 -n 1 " in commands["worker"]


def test_a_lost_server_host_is_not_given_servers_again(tmp_path):
    """dist.server_hosts s, t; t lost: the restart's spec names s only, so the backend that
    reads the survivors' hostfile does not add t back as a server line."""
    from mxlarge.launch_cli import Launch, attempt_spec
    from mxlarge.launcher.backends.ssh import SshBackend
    from mxlarge.launcher.hostfile import place
    from mxlarge.launcher.job import JobSpec

    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1\n10.0.0.2\n")
    backend = SshBackend()
    spec = JobSpec("ssh", ["true"], World(2, batch=8), 2, hostfile=str(hosts),
                   server_hosts=("10.0.0.8", "10.0.0.9"))
    lines = backend.check_hosts(str(hosts), 2, 2, spec.server_hosts)
    e = backend.elastic(spec.world, 2, lines, 1, None)
    e.probe = lambda asked: [h for h in asked if h != "10.0.0.9"]
    plan = RestartPlan(RestartPolicy(1), spec.world, 2, elastic=e,
                       hostfile_of=lambda el, s, w: backend.attempt_hostfile(lines, el, 2, s, w))
    plan.attempt(0)
    assert e.replan() is None
    attempt = plan.attempt(1)
    job = Launch(spec, backend, plan, None, None, None, None, "c.yaml")
    again = attempt_spec(job, attempt)
    assert again.server_hosts == ("10.0.0.8",)
    hosts.write_text(attempt.hostfile)
    servers, workers = place(backend.check_hosts(str(hosts), 2, 2, again.server_hosts), 2, 2)
    assert [e.host for e in servers] == ["10.0.0.8", "10.0.0.8"]
    assert [e.host for e in workers] == ["10.0.0.1", "10.0.0.2"]
