"""mxlarge.breakdown: the pure parts against closed forms, and the step timer
(mxlarge.observers.timer) on a script's own steps with parts of known length; a launched job's
run carries the per-rank breakdown (tests/e2e/test_breakdown.py), and so does a launched
script's heartbeat."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from mxlarge import breakdown as B
from mxlarge.observers import Observers, Step
from mxlarge.observers.heartbeat import HeartbeatObserver
from mxlarge.observers.timer import StepTimer
from mxlarge.protocol.heartbeat import SIZE, Record


def sample(at: int, data=0.001, compute=0.02, exchange=0.005, update=0.002, end=1.0e9,
           micro=()):
    return B.Sample(at, data, compute, exchange, update, end, micro)


def ranks_ms(*rows):
    return [dict(zip(("data", "compute", "exchange", "update", "step"), r)) for r in rows]


def test_one_step_in_ten_is_sampled_at_every_position_of_an_epoch():
    assert [t for t in range(30) if B.sampled(t)] == [1, 6, 14, 27]
    steps = [t for t in range(1_000_000) if B.sampled(t)]
    assert len(steps) == pytest.approx(1_000_000 / B.EVERY, rel=1e-4)
    assert {b - a for a, b in zip(steps, steps[1:])} == {5, 8, 13}
    for epoch in (5, 10, 391):  # steps per epoch: each position sampled as often as the others
        at = np.bincount([t % epoch for t in steps], minlength=epoch)
        assert at.min() > 0.95 * at.mean() and at.max() < 1.05 * at.mean(), (epoch, at)


def test_a_step_is_the_sum_of_its_parts_and_medians_are_in_ms():
    assert sample(0).step == pytest.approx(0.028)
    m = B.medians_ms([sample(0, compute=0.010), sample(10, compute=0.030),
                      sample(20, compute=0.020)])
    assert m == {"data": 1.0, "compute": 20.0, "exchange": 5.0, "update": 2.0, "step": 28.0}


def test_micro_batches_have_one_median_over_every_micro_batch():
    m = B.medians_ms([sample(0, micro=(0.004, 0.006)), sample(10, micro=(0.010, 0.002, 0.003))])
    assert m["micro"] == 4.0  # median of 2, 3, 4, 6, 10 ms


def test_the_window_keeps_the_last_samples_and_fits_a_heartbeat_record():
    w = B.RecentSamples(size=3)
    for t in range(5):
        w.add(sample(10 * t, compute=0.001 * (t + 1), end=1.7e9 + t, micro=(0.001,)))
    rec = w.record()
    assert set(rec) == {*B.PARTS, "step", "n", "from", "at", "end"}  # the launcher's, no micro
    assert rec["n"] == 3.0 and rec["from"] == 20.0 and rec["at"] == 40.0
    assert rec["end"] == 1.7e9 + 4
    assert rec["compute"] == 4.0  # median of 3, 4, 5 ms
    # 256 servers' [ms, share] fit too
    r = Record(127, "h" * 40, 4194304, 10 ** 9, 10 ** 9, 10 ** 9, "evaluating", 10 ** 9,
               {k: 99999.9 for k in rec}, [[99999.9, 0.0039]] * 256)
    assert len(r.encode()) == SIZE and Record.decode(r.encode()) == r


def test_each_server_has_the_median_of_the_samples_that_waited_for_it_first():
    w = B.RecentSamples()
    for t, (server, held) in enumerate([(0, 0.010), (1, 0.030), (0, 0.012), (1, 0.034),
                                        (0, 0.014), (-1, 0.0)]):
        w.add(dataclasses.replace(sample(10 * t), server=server, held=held))
    assert w.servers([0.25, 0.5, 0.25]) == [[12.0, 0.25], [32.0, 0.5], [-1.0, 0.25]]


def test_summary_names_the_rank_with_the_most_own_work_and_the_shares_waiting():
    # own work w = step - exchange: 23, 43, 24; exchange 30, 8, 29; steps 53, 51, 53
    ranks = ranks_ms((1, 20, 30, 2, 53), (1, 40, 8, 2, 51), (1, 20, 29, 3, 53))
    s = B.summary(ranks)
    assert s["slowest_rank"] == 1.0
    assert s["spread"] == pytest.approx(43 / 23)
    assert s["wait_share"] == pytest.approx((30 + 8 + 29) / (53 + 51 + 53))
    assert s["wait_others_share"] == pytest.approx((22 + 0 + 21) / (53 + 51 + 53))
    even = B.summary(ranks_ms((1, 20, 5, 2, 28), (1, 20, 5, 2, 28)))
    assert even["spread"] == 1.0 and even["wait_others_share"] == 0.0


def test_a_rank_slowed_now_and_then_is_named_by_its_step_not_its_parts():
    """A launched digits job whose rank 1 was stopped 50 ms of every 100 ms (docs/breakdown.md):
    its parts' medians are rank 0's, but its step is 72.5 ms with 2.7 of waiting, rank 0's
    70.9 with 44.9."""
    ranks = ranks_ms((0.9, 16.5, 44.9, 0.8, 70.9), (0.8, 18.3, 2.7, 0.7, 72.5))
    s = B.summary(ranks)
    assert s["slowest_rank"] == 1.0 and s["spread"] == pytest.approx(69.8 / 26.0)


def test_the_runs_tag_names_the_slowest_rank_and_its_host():
    text = B.describe(ranks_ms((1, 20, 30, 2, 53), (1, 40, 8, 2, 51)), ["h1", "h2"])
    assert text == ("worker rank 1 on h2 is the slowest: 43.0 ms of its own work a step (its "
                    "step 51.0 less 8.0 waiting for the exchange), 1.87x the fastest rank's; "
                    "the ranks wait 37% of a step for the exchange (21% for each other)")


@pytest.mark.parametrize("name", ["h2", "ip-172-31-22-117.eu-west-1.compute.internal",
                                  "höst-ü", ""])
def test_a_host_name_survives_float32(name):
    floats = B.encode_host(name)
    assert len(floats) == B.HOST_FLOATS and all(f < 2 ** 24 for f in floats)
    back = B.decode_host(np.asarray(floats, np.float32).tolist())
    assert back == name.encode()[:3 * B.HOST_FLOATS].decode(errors="replace")


class Writer:
    """A heartbeat writer that keeps what it is given."""

    def __init__(self):
        self.parts = []
        self.issued = []

    def set_parts(self, parts, servers=None):
        self.parts.append(parts)

    def issue(self, step):
        self.issued.append(step)


class Ready:
    def __init__(self):
        self.waited = 0

    def wait_to_read(self):
        self.waited += 1


def test_a_scripts_own_steps_are_timed_coarsely_on_sampled_steps():
    """Between step() calls 30 ms of the script's own work, the exchange 20 ms, the update
    10 ms: the sampled steps 1 and 6 give compute >= 30, exchange >= 20, update >= 10 ms,
    data 0; the engine synced only at the end of steps 0 and 5 and around steps 1 and 6. The
    events are a script's step's (mxlarge.observers), in the Trainer's order."""
    writer, ready, syncs = Writer(), Ready(), []
    observers = Observers([HeartbeatObserver(writer),
                           StepTimer(sync=lambda: syncs.append(len(syncs)))])
    done = []
    for t in range(10):
        time.sleep(0.03)  # the script's forward+backward
        step = Step(t)
        observers.step_begun(step)
        observers.exchange_begun(step, [ready])
        time.sleep(0.02)  # the exchange
        observers.exchange_done(step, [ready])
        observers.update_begun(step)
        done.append(t)
        time.sleep(0.01)  # the update
        observers.update_done(step, True, [])
    assert done == list(range(10)) and ready.waited == 2  # the exchanges of steps 1 and 6
    assert writer.issued == list(range(10))
    assert len(syncs) == 6
    assert [(r["n"], r["at"]) for r in writer.parts] == [(1.0, 1.0), (2.0, 6.0)]
    rec = writer.parts[-1]
    slack = 250.0  # ms: a loaded 2-core machine
    assert rec["data"] == 0.0
    assert 30 <= rec["compute"] < 30 + slack
    assert 20 <= rec["exchange"] < 20 + slack
    assert 10 <= rec["update"] < 10 + slack
    assert rec["step"] == pytest.approx(rec["compute"] + rec["exchange"] + rec["update"],
                                        abs=0.2)


def test_the_loop_times_sampled_steps_part_by_part_and_each_simulated_worker():
    """One process, 2 simulated workers, the loop timed: steps 1 and 6 carry a sample whose
    parts add up to its step and whose 2 micro-batches fit inside its forward+backward; the
    others carry none."""
    import mxnet as mx

    from mxlarge import loop as L
    from mxlarge.config import config_from_dict
    from mxlarge.run import build

    cfg = config_from_dict({
        "data": {"dataset": "digits", "batch_size": 64},
        "model": {"name": "small_plain", "width": 4},
        "optim": {"base_lr": 0.05, "reference_batch": 16, "warmup": "none", "decay": "none"},
        "dist": {"simulate_workers": 2},
        "train": {"epochs": 1, "max_steps": 12, "progress": False},
        "tracking": {"enabled": False}})
    b = build(cfg, breakdown=True)
    loop = L.TrainLoop(net=b.net, trainer=b.trainer, train_source=b.data.train,
                       loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=1, ctx=b.ctx)
    batches = list(b.data.train.epoch(0))
    samples = []
    for t in range(12):
        samples.append(loop.train_step(*batches[t % len(batches)]).sample)
        loop.step += 1
    assert [t for t, s in enumerate(samples) if s is not None] == [1, 6]
    for s in (samples[1], samples[6]):
        assert s.at in (1, 6) and len(s.micro) == 2 and all(m > 0 for m in s.micro)
        assert sum(s.micro) <= s.compute
        assert s.step == pytest.approx(s.data + s.compute + s.exchange + s.update)
