"""The straggler rule (mxlarge/launcher/straggler.py) on heartbeats written by hand: who is
named, for what, with which ratio and wait (closed forms), when an episode begins and ends, and
no episode from noise inside the band. Real jobs: tests/e2e/test_straggler.py."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from mxlarge.launcher.straggler import Episode, Rules, State, Stragglers, judge, slowest_part


@dataclass(frozen=True)
class Beat:
    rank: int
    host: str
    pid: int
    done: int
    phase: str
    tick: int
    parts: dict[str, float] | None


def parts(compute=40.0, exchange=10.0, data=1.0, update=5.0, n=20, **more):
    step = data + compute + exchange + update
    return {"data": data, "compute": compute, "exchange": exchange, "update": update,
            "step": more.pop("step", step), "n": n, **more}


def beats(windows, done=100, tick=1, phase="train"):
    return [Beat(r, f"h{r}", 1000 + r, done, phase, tick, w) for r, w in enumerate(windows)]


def run(sequence, rules=Rules()):
    """Judge ``sequence`` (lists of windows, one list per look); the changes at each look."""
    state, out = State(), []
    for i, windows in enumerate(sequence):
        state, changes = judge(state, beats(windows, done=10 * i, tick=i), rules)
        out.append(changes)
    return state, out


def slowed(i, compute=70.0):
    """Windows of 3 ranks where rank 1 computes ``compute`` ms against 40 and the others wait
    for it at the exchange; each look is a new window (its n differs)."""
    extra = compute - 40.0
    return [parts(exchange=10 + extra, n=20 + i % 2, step=56 + extra),
            parts(compute=compute, exchange=10, n=20 + i % 2),
            parts(exchange=10 + extra, n=20 + i % 2, step=56 + extra)]


def test_ratio_and_wait_are_the_closed_forms():
    # rank 1: 70 ms of forward+backward against 40 (ratio 1.75); the others wait 30 ms more at
    # the exchange than it does, in a step of 86 ms: 30/86 of each step
    found = slowest_part(slowed(0)[1], [slowed(0)[0], slowed(0)[2]], Rules())
    assert found == ("compute", 70 / 40, 30 / 86)


def test_one_episode_named_after_hold_new_windows_then_its_recovery():
    healthy = [[parts(n=20 + i % 2) for _ in range(3)] for i in range(4)]
    state, changes = run([slowed(i) for i in range(5)] + healthy)
    began = [c for look in changes for c in look if c.ended is None]
    assert [i for i, look in enumerate(changes) if look] == [2, 7]  # hold = 3 windows each way
    assert began == [Episode(1, "h1", 1001, "compute", 70 / 40, 30 / 86, 20)]
    assert changes[7] == (Episode(1, "h1", 1001, "compute", 70 / 40, 30 / 86, 20, ended=70),)
    assert state.open == {}


def test_the_line_names_rank_pid_host_ratio_and_wait():
    e = Episode(1, "h2", 4242, "compute", 70 / 40, 30 / 86, 20)
    assert e.line() == ("straggler: worker rank 1 (pid 4242) on h2: forward+backward 1.8× the "
                        "median; the other ranks wait 35% of each step for it")
    assert Episode(1, "h2", 4242, "data", 3.0, 0.5, 20, ended=90).recovered_line() == (
        "straggler recovered: worker rank 1 (pid 4242) on h2: waiting for data back near the "
        "median at step 90 (slow from step 20)")


def test_a_window_seen_again_does_not_count_toward_hold():
    same = slowed(0)
    _, changes = run([same] * 6)
    assert not any(changes)


def test_below_the_ratio_or_the_minimum_difference_no_episode():
    # 19% above: inside the band
    _, changes = run([slowed(i, compute=40 * 1.19) for i in range(6)])
    assert not any(changes)
    # 50% above but 1.5 ms of 3: too little to matter
    small = [[parts(compute=3.0, n=20 + i % 2), parts(compute=4.5, n=20 + i % 2)]
             for i in range(6)]
    _, changes = run(small)
    assert not any(changes)


def test_hysteresis_a_window_at_15_percent_keeps_the_episode():
    seq = [slowed(i) for i in range(3)] + [slowed(i, compute=46.0) for i in range(3, 9)]
    state, changes = run(seq)
    assert [len(c) for c in changes] == [0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert set(state.open) == {1}


def test_one_slow_window_amid_fast_ones_is_no_episode():
    seq = [slowed(i) if i % 3 == 1 else [parts(n=20 + i % 2) for _ in range(3)]
           for i in range(12)]
    _, changes = run(seq)
    assert not any(changes)


def test_small_windows_and_other_phases_are_not_judged():
    _, changes = run([[parts(n=9), parts(compute=90, n=9 + i % 2)] for i in range(6)])
    assert not any(changes)
    state = State()
    for i in range(6):
        state, changes = judge(state, beats(slowed(i), phase="evaluating"))
        assert changes == ()


def test_a_slow_data_loader_is_named_as_such():
    seq = [[parts(n=20 + i % 2), parts(data=30.0, n=20 + i % 2)] for i in range(3)]
    _, changes = run(seq)
    assert changes[2][0].part == "data" and changes[2][0].rank == 1


def test_noise_of_a_loaded_box_inside_the_band_names_nobody():
    # every rank's median within ±8% of 40 ms, independently at each window
    rng = random.Random(0)
    seq = [[parts(compute=40 * rng.uniform(0.92, 1.08), n=20) for _ in range(4)]
           for _ in range(500)]
    _, changes = run(seq)
    assert not any(changes)


def test_the_keeper_emits_each_line_once_and_keeps_the_episodes():
    lines: list[str] = []
    keeper = Stragglers(lines.append)
    seq = [slowed(i) for i in range(5)] + [[parts(n=20 + i % 2) for _ in range(3)]
                                           for i in range(4)]
    for i, windows in enumerate(seq):
        for _ in range(3):  # the loop polls more often than records change
            keeper.see(beats(windows, done=10 * i, tick=i))
    assert [line.split(":")[0] for line in lines] == ["straggler", "straggler recovered"]
    assert keeper.episodes == (Episode(1, "h1", 1001, "compute", 70 / 40, 30 / 86, 20, 70),)


@pytest.mark.parametrize("parts_", [None, {"n": 3}])
def test_workers_without_a_breakdown_are_left_out(parts_):
    state = State()
    for i in range(6):
        state, changes = judge(state, beats([parts(n=20 + i % 2), parts_]))
        assert changes == ()
