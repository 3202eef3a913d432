"""The restart rules without processes: the local probe, the elastic world of each attempt, and
run_with_restarts asking for a world before each granted restart."""
from mxlarge.launcher.backends.local import local_hosts, local_probe
from mxlarge.launcher.outcome import Outcome, ProcessFailure
from mxlarge.launcher.restart import Elastic, RestartPolicy, run_with_restarts
from mxlarge.plan import World


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
