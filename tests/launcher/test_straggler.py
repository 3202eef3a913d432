"""The straggler rule (mxlarge/launcher/straggler.py) on heartbeats written by hand: who is
named, for what, with which ratio and wait (closed forms), when an episode begins and ends, and
no episode from noise inside the band. Real jobs: tests/e2e/test_straggler.py."""
from __future__ import annotations

import dataclasses
import io
import random
import statistics
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from mxlarge.launcher.outcome import Outcome
from mxlarge.launcher.straggler import Episode, Look, State, Stragglers, judge, lag, look


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    pid: int
    done: int
    phase: str
    tick: int
    parts: dict[str, float] | None
    servers: list[list[float]] | None = None


def parts(compute=40.0, exchange=10.0, data=1.0, update=5.0, n=20, **more):
    step = data + compute + exchange + update
    return {"data": data, "compute": compute, "exchange": exchange, "update": update,
            "step": more.pop("step", step), "n": n, **more}


def beats(windows, done=100, tick=1, phase="train"):
    return [Beat(r, f"h{r}", 1000 + r, done, phase, tick, w) for r, w in enumerate(windows)]


def run(sequence, every=5.0):
    """Judge ``sequence`` (lists of windows, one list per look, ``every`` seconds apart); the
    changes at each look."""
    state, out = State(), []
    for i, windows in enumerate(sequence):
        state, changes = judge(state, beats(windows, done=10 * i, tick=i), every * i)
        out.append(changes)
    return state, out


def slowed(i, compute=70.0):
    """Windows of 3 ranks where rank 1 computes ``compute`` ms against 40 and the others wait
    for it at the exchange; each look is a new window (its n differs)."""
    extra = compute - 40.0
    start = {"from": 10 * i + 3, "at": 10 * i + 9}  # the window's first and newest steps
    return [parts(exchange=10 + extra, n=20 + i % 2, step=56 + extra, **start),
            parts(compute=compute, exchange=10, n=20 + i % 2, **start),
            parts(exchange=10 + extra, n=20 + i % 2, step=56 + extra, **start)]


def test_ratio_and_wait_are_the_closed_forms():
    # rank 1: 70 ms of forward+backward against 40 (ratio 1.75); the others wait 30 ms more at
    # the exchange than it does, in a step of 86 ms: 30/86 of each step
    w = 30 / 86
    assert look(slowed(0)[1], [slowed(0)[0], slowed(0)[2]], 7.0) == Look(
        7.0, {"compute": (70 / 40, 30.0, w, w), "data": (1.0, 0.0, 0.0, w),
              "update": (1.0, 0.0, 0.0, w)}, 6)


def test_one_episode_named_over_20_s_of_looks_then_its_recovery():
    healthy = [[parts(n=20 + i % 2) for _ in range(3)] for i in range(5)]
    state, changes = run([slowed(i) for i in range(6)] + healthy)  # a look every 5 s
    # named at 20 s (5 looks), from the middle of the first slow window (3 to 9); ended when
    # the median of the last 20 s is healthy
    assert [i for i, look in enumerate(changes) if look] == [4, 9]
    named = Episode(1, "h1", 1001, "compute", 70 / 40, 30.0, 30 / 86, 6, now=70 / 40)
    assert changes[4] == (named,)
    assert changes[9] == (dataclasses.replace(named, ended=90),)
    assert state.open == {}


def test_the_line_names_rank_pid_host_ratio_and_wait():
    e = Episode(1, "h2", 4242, "compute", 70 / 40, 30.0, 30 / 86, 20, now=2.2)
    assert e.line() == ("straggler: worker rank 1 (pid 4242) on h2 from step 20: forward+backward "
                        "1.75× the median (now 2.20×); the other ranks wait 34% of each step "
                        "for it")
    assert Episode(1, "h2", 4242, "link", 1.35, 26.4, 0.35, 20).line() == (
        "straggler: worker rank 1 (pid 4242) on h2 from step 20: its exchange ends 26 ms after "
        "the others' (a slow link); the other ranks wait 35% of each step for it")
    assert Episode(1, "h2", 4242, "link", 1.35, 26.4, 0.35, 20, 90).recovered_line() == (
        "straggler recovered: worker rank 1 (pid 4242) on h2: its exchange ends with the others' "
        "again at step 90 (slow from step 20)")
    assert Episode(1, "h2", 4242, "data", 3.0, 20.0, 0.5, 20, ended=90).recovered_line() == (
        "straggler recovered: worker rank 1 (pid 4242) on h2: waiting for data back near the "
        "median at step 90 (slow from step 20)")


def test_looks_for_less_than_20_s_are_no_episode_yet():
    # a look every 0.5 s: 40 slow looks are 19.5 s, the 41st 20 s
    _, changes = run([slowed(i) for i in range(41)], every=0.5)
    assert [i for i, look in enumerate(changes) if look] == [40]


def test_a_worker_that_did_not_advance_gives_no_look():
    state = State()
    for i in range(60):
        state, changes = judge(state, beats(slowed(i), done=100), 0.5 * i)
        assert changes == ()
    assert {r: len(looks) for r, looks in state.looks.items()} == {0: 1, 1: 1, 2: 1}


def test_below_the_ratio_or_the_minimum_difference_no_episode():
    # 19% above: inside the band
    _, changes = run([slowed(i, compute=40 * 1.19) for i in range(20)])
    assert not any(changes)
    # 50% above but 1.5 ms of 3: too little to matter
    small = [[parts(compute=3.0, exchange=11.5, n=20 + i % 2), parts(compute=4.5, n=20 + i % 2)]
             for i in range(20)]
    _, changes = run(small)
    assert not any(changes)
    # 3 ms of a 40 ms step: 7.5%, below the 10% that counts
    thin = [[parts(compute=20.0, exchange=13.0, n=20 + i % 2),
             parts(compute=23.0, n=20 + i % 2)] for i in range(20)]
    _, changes = run(thin)
    assert not any(changes)


def test_a_slower_worker_nobody_waits_for_is_no_straggler():
    # rank 1 computes 70 ms against 40 but waits as long at the exchange as the others: it is
    # not what holds them (rank 0's own end-of-step work is, say)
    _, changes = run([[parts(exchange=10, n=20 + i % 2), parts(compute=70, n=20 + i % 2)]
                      for i in range(20)])
    assert not any(changes)
    # they wait 5 ms of a 61 ms step for it (8%): below the 10% that counts
    _, changes = run([[parts(exchange=15, n=20 + i % 2), parts(compute=70, n=20 + i % 2)]
                      for i in range(20)])
    assert not any(changes)


def test_hysteresis_15_percent_keeps_the_episode():
    seq = [slowed(i) for i in range(5)] + [slowed(i, compute=46.0) for i in range(5, 20)]
    state, changes = run(seq)
    assert [i for i, look in enumerate(changes) if look] == [4]
    assert set(state.open) == {1}


def test_one_slow_window_in_three_is_no_episode():
    seq = [slowed(i) if i % 3 == 1 else [parts(n=20 + i % 2) for _ in range(3)]
           for i in range(100)]
    _, changes = run(seq, every=0.5)
    assert not any(changes)


def test_small_windows_and_other_phases_are_not_judged():
    _, changes = run([[parts(n=9), parts(compute=90, n=9 + i % 2)] for i in range(20)])
    assert not any(changes)
    state = State()
    for i in range(20):
        state, changes = judge(state, beats(slowed(i), done=i, phase="evaluating"), 5.0 * i)
        assert changes == ()


def test_a_slow_data_loader_is_named_as_such():
    seq = [[parts(exchange=39.0, n=20 + i % 2), parts(data=30.0, n=20 + i % 2)]
           for i in range(5)]
    _, changes = run(seq)
    assert changes[4][0].part == "data" and changes[4][0].rank == 1


def loaded(steps, seed, slow=1.0):
    """Windows of 2 workers on a loaded 2-core box, as measured there (docs/design/launcher.md,
    Stragglers) and worse: a step's forward+backward takes 16 ms on a core of its own and 32 on
    a shared one, 30% of the steps in runs of 3 on average (measured: 9-29%, runs of 2-3, the
    longest 11), and the faster worker waits for the slower at the exchange; the median of its
    last 20 steps, a look every 16 steps of 30 ms (the launcher reads every 0.5 s). ``slow``
    multiplies rank 1's."""
    rng = random.Random(seed)
    shared, history = [False, False], [[], []]
    for i in range(steps):
        compute = []
        for r in (0, 1):
            shared[r] = rng.random() < (2 / 3 if shared[r] else 1 / 7)
            compute.append((32.0 if shared[r] else 16.0) * (slow if r else 1.0))
        for r in (0, 1):
            history[r].append((compute[r], 10.0 + max(compute) - compute[r]))
        if i >= 20 and i % 16 == 0:
            yield 0.03 * i, [parts(compute=statistics.median(c for c, _ in h[-20:]),
                                   exchange=statistics.median(e for _, e in h[-20:]),
                                   n=20 + i % 2) for h in history]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("slow, named", [(1.0, []), (1.5, [1]), (2.0, [1])])
def test_noise_of_a_loaded_box_names_nobody_and_a_slowed_worker_is_named(seed, slow, named):
    state, found = State(), []
    for now, windows in loaded(40_000, seed, slow):  # 20 minutes
        state, changes = judge(state, beats(windows, done=int(now * 100)), now)
        found += [(c.rank, c.ended is None) for c in changes]
    assert found == [(r, True) for r in named]


def test_the_keeper_emits_each_line_once_and_keeps_the_episodes():
    lines: list[str] = []
    now = [0.0]
    keeper = Stragglers(lines.append, clock=lambda: now[0])
    seq = [slowed(i) for i in range(6)] + [[parts(n=20 + i % 2) for _ in range(3)]
                                           for i in range(5)]
    for i, windows in enumerate(seq):
        for _ in range(5):  # the loop polls more often than records change
            keeper.see(beats(windows, done=10 * i, tick=i))
            now[0] += 1.0
    assert [line.split(":")[0] for line in lines] == ["straggler", "straggler recovered"]
    assert keeper.episodes == (Episode(1, "h1", 1001, "compute", 70 / 40, 30.0, 30 / 86, 6, 90,
                                       now=70 / 40),)


@pytest.mark.parametrize("parts_", [None, {"n": 3}])
def test_workers_without_a_breakdown_are_left_out(parts_):
    state = State()
    for i in range(20):
        state, changes = judge(state, beats([parts(n=20 + i % 2), parts_], done=i), 5.0 * i)
        assert changes == ()


def test_lag_is_at_the_newest_step_every_rank_sampled():
    ends = {0: {10: 1.000, 20: 2.000}, 1: {10: 1.026, 20: 2.030, 30: 3.03}, 2: {20: 2.002}}
    assert lag(ends, 1) == pytest.approx(1000 * (2.030 - 2.001))
    assert lag({0: {10: 1.0}, 1: {20: 2.0}}, 1) is None


def linked(i, late=26.0, behind=0):
    """Windows of 2 ranks whose exchanges last as long (54 ms of a 78 ms step, as measured on
    the testbed with h2's link at 20 Mbit/s), rank 1's ending ``late`` ms after rank 0's at
    each sampled step; rank 1's newest sample is ``behind`` samples older."""
    at = 10 * i
    return [parts(compute=18, exchange=54, n=20 + i % 2, at=at, end=0.076 * at),
            parts(compute=18, exchange=54, n=20 + i % 2, at=at - 10 * behind,
                  end=0.076 * (at - 10 * behind) + late / 1000)]


def test_a_rank_whose_exchange_ends_late_is_named_for_its_link():
    _, changes = run([linked(i) for i in range(6)])
    step = 1 + 18 + 54 + 5
    # the onset: the middle of the first look's window, step 0 (no "from": its newest step)
    assert changes[4] == (Episode(1, "h1", 1001, "link", pytest.approx(1 + 26 / step),
                                  pytest.approx(26.0), pytest.approx(26 / step), 0,
                                  now=pytest.approx(1 + 26 / step)),)
    assert not any(changes[:4]) and not any(changes[5:])


def test_a_rank_one_sample_behind_is_compared_at_the_step_both_sampled():
    _, changes = run([linked(i, behind=i % 2) for i in range(6)])
    assert [(e.rank, e.part, round(e.excess)) for look_ in changes for e in look_] == [
        (1, "link", 26)]


def test_exchange_ends_within_the_band_or_no_common_step_name_nobody():
    _, changes = run([linked(i, late=10.0) for i in range(20)])  # 13% of a step
    assert not any(changes)
    _, changes = run([linked(i, behind=1 + 10 * i) for i in range(20)])  # never the same step
    assert not any(changes)


def test_the_lines_docs_show_are_the_lines_printed():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    e = Episode(1, "node07", 48213, "compute", 2.1, 30.0, 0.38, 4210, ended=5170, now=2.43)
    assert f"[launcher] {e.line()}\n[launcher] {e.recovered_line()}\n" in doc
    s = Episode(1, "node03", 51877, "server", 1.84, 41.2, 0.22, 1830, ended=2610, now=1.9,
                role="server", share=0.5)
    assert f"[launcher] {s.line()}\n[launcher] {s.recovered_line()}\n" in doc


def test_named_with_the_figures_the_rule_judged_from_the_step_it_slowed():
    # 15 healthy looks then slow ones, a look a second: the span's medians cross the floors
    # at the 26th look (11 slow of 21); the line prints those medians, never below the
    # floors, and how slow it is now besides; the onset is the first slow window's middle
    healthy = [[parts(n=20 + i % 2, **{"from": 10 * i + 3, "at": 10 * i + 9}) for _ in range(3)]
               for i in range(15)]
    _, changes = run(healthy + [slowed(15 + i) for i in range(15)], every=1.0)
    began = [e for look_ in changes for e in look_]
    assert [(e.rank, e.ratio, e.wait, e.now, e.step) for e in began] == [
        (1, 1.375, 15 / 86, 70 / 40, 156)]
    assert "1.37× the median (now 1.75×); the other ranks wait 17%" in began[0].line()


def test_the_supervision_loop_names_a_straggler_from_the_heartbeat_files(tmp_path):
    """The loop of every backend, the launcher's reader of worker reports reading real
    heartbeat files on a test clock, beside a real watchdog: rank 1 (pid 101) computes 70 ms
    against 40 for a minute; its line is the launcher's and the outcome carries the episode."""
    from mxlarge.launcher.reports import WorkerReports
    from mxlarge.launcher.supervisor import Supervisor, supervise
    from mxlarge.launcher.watchdog import Watchdog
    from mxlarge.protocol.heartbeat import Record, path_for
    from tests.launcher.test_supervisor import _Job, _Kid, _Run

    def write(i):  # both workers' records, a new window each every 0.5 s of the test clock
        for r, w in enumerate(slowed(i)[:2]):
            rec = Record(r, "hostA", 100 + r, 10 * i, 10 * i, 10 * i, "train", i, w)
            path_for(tmp_path, r).write_bytes(rec.encode())

    write(0)
    run = _Run({n: (lambda n=n: write(n // 10)) for n in range(10, 1200, 10)})
    dog = Watchdog(tmp_path, 2, None, lambda line: None, run.clock)
    job = _Job([], lambda: run.t >= 60, lambda s: Outcome(0, "done"))
    lines = io.StringIO()
    sup = Supervisor(lines)
    sup.children = [_Kid("worker", 0, 100), _Kid("worker", 1, 101)]
    reports = WorkerReports(tmp_path, None, lambda line: sup.sink.emit("launcher", line),
                            clock=run.clock)
    out = supervise(sup, job, dog, threading.Event(), [], reports=reports, clock=run.clock,
                    sleep=run.sleep)
    assert [(e.rank, e.pid, e.host, e.part, e.ratio, e.ended) for e in out.stragglers] == [
        (1, 101, "hostA", "compute", 70 / 40, None)]
    assert lines.getvalue() == f"[launcher] {out.stragglers[0].line()}\n"
