"""Schedules: Goyal preset golden values for ImageNet, composition, pickling, MXNet parity."""
import dataclasses
import math
import pickle

import pytest

from mxlarge.config import Config, DataConfig, OptimConfig, TrainConfig
from mxlarge.plan import World, plan
from mxlarge.schedulers import (
    Constant,
    Cosine,
    Join,
    Linear,
    MultiStep,
    Polynomial,
    goyal,
)

IMAGENET = 1_281_167


def _imagenet_8k():
    cfg = Config(data=DataConfig(dataset="synthetic", batch_size=32),
                 optim=OptimConfig(base_lr=0.1, reference_batch=256, warmup_epochs=5,
                                   decay_epochs=(30, 60, 80)),
                 train=TrainConfig(epochs=90))
    d = plan(cfg, World(processes=256, batch=32), IMAGENET)
    return cfg, d, d.schedule


def test_goyal_imagenet_8k_golden_values():
    _, d, s = _imagenet_8k()
    assert d.global_batch == 8192
    assert d.steps_per_epoch == IMAGENET // 8192 == 156
    assert d.warmup_steps == 5 * 156 == 780
    assert d.decay_steps == (30 * 156, 60 * 156, 80 * 156) == (4680, 9360, 12480)
    assert math.isclose(d.peak_lr, 3.2)
    assert s(0) == pytest.approx(0.1)
    assert s(1) == pytest.approx(0.1 + 3.1 / 780)
    assert s(390) == pytest.approx(0.1 + 3.1 / 2)
    assert s(779) == pytest.approx(0.1 + 3.1 * 779 / 780)
    assert s(780) == pytest.approx(3.2)
    assert s(781) == pytest.approx(3.2)
    assert s(4679) == pytest.approx(3.2)
    assert s(4680) == pytest.approx(0.32)
    assert s(9359) == pytest.approx(0.32)
    assert s(9360) == pytest.approx(0.032)
    assert s(12479) == pytest.approx(0.032)
    assert s(12480) == pytest.approx(0.0032)
    assert s(d.total_steps - 1) == pytest.approx(0.0032)


def test_warmup_is_per_iteration_and_monotone():
    _, d, s = _imagenet_8k()
    lrs = [s(t) for t in range(d.warmup_steps + 1)]
    assert all(b > a for a, b in zip(lrs, lrs[1:]))  # rises every iteration, not every epoch


def test_join_parts_count_from_their_own_start():
    j = Join((Constant(1.0), Linear(2.0, 4.0, 4), Constant(9.0)), (3, 7))
    assert [j(t) for t in range(9)] == [1, 1, 1, 2, 2.5, 3, 3.5, 9, 9]


def test_shapes_of_cosine_poly_multistep():
    assert Cosine(1.0, 10)(0) == 1.0 and Cosine(1.0, 10)(5) == pytest.approx(0.5)
    assert Cosine(1.0, 10)(10) == pytest.approx(0.0) and Cosine(1.0, 10)(99) == pytest.approx(0)
    assert Polynomial(1.0, 10, power=2)(5) == pytest.approx(0.25)
    m = MultiStep(1.0, (2, 4), 0.5)
    assert [m(t) for t in range(6)] == [1, 1, 0.5, 0.5, 0.25, 0.25]
    with pytest.raises(ValueError):
        m(-1)


def test_constant_warmup_and_no_warmup():
    c = goyal(3.2, 0.1, 10, (20,), warmup="constant")
    assert [c(t) for t in (0, 9, 10, 19, 20)] == pytest.approx([0.1, 0.1, 3.2, 3.2, 0.32])
    n = goyal(3.2, 0.1, 0, (20,), warmup="none")
    assert [n(t) for t in (0, 19, 20)] == pytest.approx([3.2, 3.2, 0.32])


SCHEDULES = [Constant(0.1), Linear(0.1, 3.2, 780), MultiStep(3.2, (10, 20), 0.1),
             Cosine(1.0, 100, 0.01), Polynomial(1.0, 100, 0.0, 2.0),
             Join((Linear(0.1, 3.2, 780), MultiStep(3.2, (3900, 8580, 11700))), (780,))]


@pytest.mark.parametrize("sched", SCHEDULES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("proto", [0, 2, 5])
def test_schedules_pickle_round_trip(sched, proto):
    data = pickle.dumps(sched, protocol=proto)
    if proto == 0:
        data.decode("utf-8")
    back = pickle.loads(data)
    assert back == sched
    assert [back(t) for t in range(0, 13000, 97)] == [sched(t) for t in range(0, 13000, 97)]


def test_schedules_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Constant(0.1).value = 0.2


def test_agrees_with_mxnet_multifactor_in_linear_warmup_mode():
    """Same schedule in MXNet's stateful scheduler: equal at every step t when MXNet's step
    boundaries are ours minus one (MXNet drops *after* a boundary: ``num_update > step``)."""
    import mxnet as mx

    _, d, s = _imagenet_8k()
    mx_sched = mx.lr_scheduler.MultiFactorScheduler(
        step=[b - 1 for b in d.decay_steps], factor=0.1, base_lr=d.peak_lr,
        warmup_steps=d.warmup_steps, warmup_begin_lr=0.1, warmup_mode="linear")
    for t in range(0, d.total_steps, 7):  # the MXNet scheduler must be called in order
        assert mx_sched(t) == pytest.approx(s(t), rel=1e-9), t


def test_mxnet_optimizer_first_update_asks_for_num_update_1():
    """The off-by-one: MXNet's optimizer asks its scheduler for 1 on the very first update, so a
    stock optimizer runs every LR one step early; mxlarge's step 0 uses schedule(0)."""
    import mxnet as mx

    seen = []

    class Recorder(mx.lr_scheduler.LRScheduler):
        def __call__(self, num_update):
            seen.append(num_update)
            return 0.1

    opt = mx.optimizer.SGD(learning_rate=0.1, lr_scheduler=Recorder())
    w = mx.nd.ones((2,))
    for _ in range(3):
        opt.update(0, w, mx.nd.ones((2,)), None)
    assert seen == [1, 2, 3]


def test_warmed_up_ramps_to_the_main_schedule_without_a_jump():
    """warmed_up(main, W, a): linear from a to main(W) over W steps, then main(t) at its own
    absolute steps (Shifted inside the Join); Scaled multiplies a whole schedule."""
    from mxlarge.schedulers import Scaled, warmed_up

    main = Scaled(MultiStep(0.1, (6,), 0.5), 4.0)
    s = warmed_up(main, 4, 0.1)
    assert [s(t) for t in range(8)] == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4, 0.2,
                                                      0.2])
    assert warmed_up(main, 0, 0.1) is main
    assert pickle.loads(pickle.dumps(s, protocol=0)) == s
