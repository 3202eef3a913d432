"""The step observer seam (mxlarge.observers): one sequence of events for every driver of a step,
in the documented order, with real Trainers in one process; the example of docs/observers.md
run as written."""
from __future__ import annotations

import math
import re
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxlarge
from mxlarge.observers import MARK, REPORT, TIME, DataWait, Observers, Step, StepObserver

DOC = Path(__file__).resolve().parents[2] / "docs" / "observers.md"


class Log(StepObserver):
    """Every event it sees, as ``(event, step)``."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def step_begun(self, step):
        self.events.append(("step_begun", step.t))

    def forward_done(self, step, loss, micro):
        self.events.append(("forward_done", step.t))

    def backward_done(self, step, grads, micro):
        self.events.append(("backward_done", step.t))

    def exchange_begun(self, step, grads):
        self.events.append(("exchange_begun", step.t))

    def exchange_done(self, step, grads):
        self.events.append(("exchange_done", step.t))

    def update_begun(self, step):
        self.events.append(("update_begun", step.t))

    def update_done(self, step, applied, weights):
        self.events.append(("update_done", step.t))


def _net_and_trainer(observers=(), **keywords):
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu"), gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    trainer = mxlarge.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                              observers=list(observers), **keywords)
    return net, trainer


def _batch(seed=0):
    rng = np.random.RandomState(seed)
    return mx.nd.array(rng.randn(4, 5)), mx.nd.array(rng.randint(0, 3, 4))


def _forward_backward(net, x, y):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()


SCRIPT = ["step_begun", "exchange_begun", "exchange_done", "update_begun", "update_done"]


def test_trainer_step_and_a_scripts_own_calls_run_the_same_sequence():
    log = Log()
    net, trainer = _net_and_trainer([log])
    x, y = _batch()
    _forward_backward(net, x, y)
    assert trainer.step(4) is True
    _forward_backward(net, x, y)
    trainer.allreduce_grads()
    trainer.update(4)
    assert log.events == [(e, 0) for e in SCRIPT] + [(e, 1) for e in SCRIPT]
    assert trainer.num_update == 2


def test_the_loop_reports_its_data_forward_and_backward_through_the_same_seam():
    from mxlarge.loop import TrainLoop

    log = Log()
    net, trainer = _net_and_trainer([log])
    loop = TrainLoop(net=net, trainer=trainer, train_source=None,
                     loss_fn=gluon.loss.SoftmaxCrossEntropyLoss(), epochs=1)
    loop.step = 7
    loop.train_step(*_batch())
    assert log.events == [(e, 7) for e in ("step_begun", "forward_done", "backward_done",
                                           *SCRIPT[1:])]


def test_observers_run_in_the_order_of_their_stage_and_pass_data_on_the_step():
    order = []

    class At(StepObserver):
        def __init__(self, stage, name):
            self.stage, self.name = stage, name

        def step_begun(self, step):
            order.append(self.name)
            if self.name == "mark":
                step.marked = True
            else:
                assert step.marked  # written by the one before it

    observers = Observers([At(REPORT, "report"), At(MARK, "mark")])
    observers.add(At(TIME, "time"))
    step = Step(3, DataWait(1.0, 0.5))
    observers.step_begun(step)
    assert order == ["mark", "time", "report"]
    report = observers.members[-1]
    observers.remove(report)
    assert [o.name for o in observers.members] == ["mark", "time"]
    assert observers.find(At) is observers.members[0]


def test_an_amp_skip_or_an_explicit_step_keeps_the_drivers_number():
    """The step's number is its driver's: ``step(n, t)`` begins step t."""
    log = Log()
    net, trainer = _net_and_trainer([log])
    x, y = _batch()
    _forward_backward(net, x, y)
    trainer.step(4, 41)
    assert {t for _, t in log.events} == {41} and trainer.num_update == 42


def _doc_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return next(b for b in blocks if "class GradientNorm" in b)


def test_the_docs_example_observer_runs_as_written_on_a_real_trainer():
    space: dict = {}
    exec(compile(_doc_example(), str(DOC), "exec"), space)  # noqa: S102 - the docs' own code
    watch = space["GradientNorm"](2)
    net, trainer = _net_and_trainer([watch])
    seen = {}
    for t in range(5):
        x, y = _batch(t)
        _forward_backward(net, x, y)
        trainer.allreduce_grads()
        seen[t] = math.sqrt(sum(float((g ** 2).sum().asscalar()) for g in trainer.grads(0)))
        trainer.update(4)
    assert sorted(watch.norms) == [0, 2, 4]
    for t, norm in watch.norms.items():
        assert norm == pytest.approx(seen[t], rel=1e-6) and norm > 0


def test_the_launchers_stop_refuses_the_next_step_once_and_costs_no_step_before(tmp_path):
    """Until the launcher's stop, the heartbeat observer has no ``step_begun`` of its own (the
    base's no-op: a step pays nothing); after it, the next step to begin raises StopRequested
    (a KeyboardInterrupt) once, and the writer says the process stopped."""
    from mxlarge.errors import StopRequested
    from mxlarge.observers.heartbeat import HeartbeatObserver
    from mxlarge.protocol.heartbeat import HeartbeatWriter

    writer = HeartbeatWriter(tmp_path, rank=0, interval=60)
    observer = HeartbeatObserver(writer)
    observers = Observers([observer])
    assert "step_begun" not in vars(observer)
    observers.step_begun(Step(4))
    writer.on_stop()
    with pytest.raises(StopRequested) as refused:
        observers.step_begun(Step(5))
    assert isinstance(refused.value, KeyboardInterrupt) and refused.value.step == 5
    assert writer.stopped and "step_begun" not in vars(observer)
    observers.step_begun(Step(6))
