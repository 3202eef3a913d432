"""The slow-server rule (mxlarge/launcher/servers.py) on heartbeats written by hand: which
server is named, with which ratio, excess, wait and share (closed forms), from which step,
when it recovers, and nobody inside the band; and where a server's sums are waited for
(mxlarge/kvstore/fusion.py holders). Real jobs: tests/e2e/test_slow_server.py."""
from __future__ import annotations

import pytest

from mxlarge.kvstore.fusion import FUSE_KEY, Bucket, holders, server_of
from mxlarge.launcher.servers import ServerState, SlowServers, held, judge_servers
from mxlarge.launcher.straggler import Episode
from tests.launcher.test_straggler import Beat

KNOWN = {0: ("h3", 3000), 1: ("h4", 4000)}


def beats(i, h, step=60.0, share=(0.5, 0.5), workers=2):
    """Look i: every worker's window (from step 10 i + 3 to 10 i + 9), H per server ``h``
    (ms; the second worker waits 5 ms more for each, as a worker waiting for the other's
    push does)."""
    parts = {"data": 1.0, "compute": 30.0, "exchange": 20.0, "update": 9.0, "step": step,
             "n": 20.0, "from": 10.0 * i + 3, "at": 10.0 * i + 9}
    return [Beat(r, f"w{r}", 100 + r, 10 * i, "train", i, parts,
                 [[x + 5 * r if x >= 0 else -1.0, s] for x, s in zip(h, share)])
            for r in range(workers)]


def run(sequence, every=1.0, known=KNOWN):
    state, out = ServerState(), []
    for i, h in enumerate(sequence):
        state, changes = judge_servers(state, beats(i, h), every * i, lambda: known)
        out.append(changes)
    return state, out


def test_the_figures_are_the_closed_forms():
    found = held(beats(0, [10.0, 22.0], share=(0.4, 0.6)), 10)
    # H: the least over the workers; m: the median step
    assert (found.h, found.share, found.step, found.newest, found.mid) == (
        (10.0, 22.0), (0.4, 0.6), 60.0, 9, 6)


def test_a_slow_server_is_named_from_its_onset_with_what_it_costs_then_recovers():
    # server 1's sums come 30 ms after server 0's (40 against 10 ms) from look 10 on, in a
    # 60 ms step: ratio 4, the workers wait 30/60 of each step; back to 10 ms at look 40
    seq = [[10.0, 10.0]] * 10 + [[10.0, 40.0]] * 30 + [[10.0, 10.0]] * 30
    state, changes = run(seq)
    began = [(i, e) for i, c in enumerate(changes) for e in c if e.ended is None]
    ended = [(i, e) for i, c in enumerate(changes) for e in c if e.ended is not None]
    assert len(began) == 1 and len(ended) == 1
    i, e = began[0]
    assert e == Episode(1, "h4", 4000, "server", 4.0, 30.0, 0.5, 106, now=4.0, role="server",
                        share=0.5)
    assert 20 <= i <= 21  # over 20 s of looks, once half of them are slow
    assert e.line() == ("straggler: server rank 1 (pid 4000) on h4 from step 106: its sums come "
                        "30 ms after the other servers' (4.00×; now 4.00×); it holds 50% of the "
                        "gradient bytes; the workers wait 50% of each step for it")
    assert ended[0][1].ended == 10 * ended[0][0]
    assert ended[0][1].recovered_line() == (
        f"straggler recovered: server rank 1 (pid 4000) on h4: its sums come as fast as the "
        f"other servers' again at step {ended[0][1].ended} (slow from step 106)")
    assert state.open == {}


def test_inside_the_band_or_too_little_of_a_step_nobody():
    # 1.15x: inside the band; 3 ms more of a 60 ms step: 5%, below the 10% that counts
    for h in ([10.0, 11.5], [20.0, 23.0]):
        _, changes = run([h] * 60)
        assert not any(changes), h


def test_one_server_is_compared_with_its_own_start():
    seq = [[10.0]] * 10 + [[25.0]] * 30
    state = ServerState()
    named = []
    for i, h in enumerate(seq):
        state, changes = judge_servers(state, beats(i, h, share=(1.0,)), float(i),
                                       lambda: {0: ("h3", 3000)})
        named += changes
    assert [(e.rank, e.ratio, e.excess, e.alone, e.step) for e in named] == [
        (0, 2.5, 15.0, True, 106)]
    assert "its sums come 15 ms than at the job's start" not in named[0].line()
    assert "its sums come 15 ms later than at the job's start (2.50×" in named[0].line()


def test_a_server_that_holds_no_gradient_alone_is_not_judged_and_the_rest_still_are():
    seq = [[-1.0, 10.0, 10.0]] * 10 + [[-1.0, 10.0, 40.0]] * 30
    state = ServerState()
    named = []
    for i, h in enumerate(seq):
        state, changes = judge_servers(state, beats(i, h, share=(0.0, 0.5, 0.5)), float(i),
                                       lambda: {})
        named += changes
    assert [(e.rank, e.host, e.pid) for e in named] == [(2, "an unknown host", None)]
    assert named[0].line().startswith("straggler: server rank 2 on an unknown host from step")


def test_no_look_without_a_new_sampled_step_and_none_while_a_worker_is_busy():
    state, changes = judge_servers(ServerState(), beats(0, [10.0, 40.0]), 0.0, dict)
    again, changes = judge_servers(state, beats(0, [10.0, 40.0]), 5.0, dict)
    assert again is state and changes == ()
    busy = [b if b.rank else Beat(0, "w0", 100, 0, "evaluating", 1, b.parts, b.servers)
            for b in beats(1, [10.0, 40.0])]
    assert judge_servers(state, busy, 6.0, dict) == (state, ())


def test_the_keeper_emits_each_line_once():
    lines: list[str] = []
    now = [0.0]
    keeper = SlowServers(lines.append, lambda: KNOWN, clock=lambda: now[0])
    for i, h in enumerate([[10.0, 10.0]] * 5 + [[10.0, 40.0]] * 30 + [[10.0, 10.0]] * 30):
        for _ in range(3):
            keeper.see(beats(i, h))
        now[0] += 1.0
    assert [x.split(":")[0] for x in lines] == ["straggler", "straggler recovered"]
    assert keeper.episodes[0].ended is not None


def test_holders_say_which_server_sums_each_gradient_alone():
    # buckets on FUSE_KEY + j go to server (key * 9973) % 2; an array of the bound or more is
    # sliced over both, so its member is nobody's alone
    keys = [FUSE_KEY + j for j in range(4)]
    buckets = [Bucket(keys[0], (5, 4), (0, 10), 30), Bucket(keys[1], (3,), (0,), 40),
               Bucket(2, (2,), (0,), 100), Bucket(keys[2], (1, 0), (0, 5), 10)]
    found = holders(buckets, 2, 100, lambda b: b.key, lambda b: 4 * b.size)
    s = [server_of(b.key, 2) for b in buckets]
    alone: dict[int, list[int]] = {0: [], 1: []}
    for b, where in zip(buckets[:2] + buckets[3:], s[:2] + s[3:]):
        alone[where] += b.members
    assert found.alone == tuple(tuple(sorted(alone[x])) for x in (0, 1))
    load = [0.0, 0.0]
    for b, where in zip(buckets, s):
        if b.size >= 100:
            load = [x + 2 * b.size for x in load]
        else:
            load[where] += 4 * b.size
    assert found.share == pytest.approx(tuple(x / sum(load) for x in load))
    assert sum(found.share) == pytest.approx(1.0)


def test_with_one_server_every_gradient_is_its_own():
    buckets = [Bucket(FUSE_KEY, (1, 0), (0, 5), 10), Bucket(2, (2,), (0,), 10 ** 7)]
    assert holders(buckets, 1, 100, lambda b: b.key, lambda b: b.size) == \
        holders(buckets, 1, 100, lambda b: b.key, lambda b: b.size)
    found = holders(buckets, 1, 100, lambda b: b.key, lambda b: b.size)
    assert found.alone == ((0, 1, 2),) and found.share == (1.0,)


def test_while_a_worker_is_slow_a_lone_server_is_not_judged_and_servers_in_pairs_still_are():
    """A late worker makes every server's sums come later for the others: a server compared
    with its own start cannot tell that from being slow itself, so it is not judged while the
    workers' rule sees a worker slow (``uneven``); two servers are judged against each other."""
    def judged(sequence, share, uneven):
        state, named = ServerState(), []
        for i, h in enumerate(sequence):
            state, changes = judge_servers(state, beats(i, h, share=share), float(i),
                                           lambda: KNOWN, uneven=uneven and i >= 10)
            named += changes
        return named

    assert judged([[10.0]] * 10 + [[25.0]] * 30, (1.0,), uneven=True) == []
    assert len(judged([[10.0]] * 10 + [[25.0]] * 30, (1.0,), uneven=False)) == 1
    pair = judged([[10.0, 10.0]] * 10 + [[10.0, 40.0]] * 30, (0.5, 0.5), uneven=True)
    assert [(e.rank, e.alone) for e in pair] == [(1, False)]


def test_a_worker_is_uneven_in_an_episode_or_when_its_newest_look_meets_the_floors():
    """:func:`~mxlarge.launcher.straggler.uneven`: the recovery ratio and the ms and share
    floors of a part of a worker's newest look, or an open episode."""
    from mxlarge.launcher.straggler import Look, State, uneven

    def state(ratio, excess, share, open_=False):
        looks = {1: (Look(0.0, {"compute": (ratio, excess, share, share)}),)}
        episode = Episode(1, "h", 1, "compute", 2.0, 20.0, 0.3, 5)
        return State(looks=looks, open={1: episode} if open_ else {})

    assert uneven(state(1.1, 2.0, 0.1))
    assert not uneven(state(1.09, 20.0, 0.5))  # below the recovery ratio
    assert not uneven(state(3.0, 1.9, 0.5))  # less than 2 ms
    assert not uneven(state(3.0, 20.0, 0.09))  # less than 10% of a step
    assert uneven(state(1.0, 0.0, 0.0, open_=True))
    assert not uneven(State())
