"""The loop's hook order (stated once, as stages) and the data hooks exchange."""
from __future__ import annotations

import mxnet as mx

from mxlarge import hooks as H
from mxlarge import loop as L
from mxlarge import persist, tracking
from mxlarge.config import config_from_dict
from mxlarge.hooks import StepOutput
from mxlarge.run import build


def test_stages_order_producers_before_consumers():
    order = [L.LossHook, L.TimerHook, L.EvalHook, L.ReplicaCheckHook, persist.FinalParamsHook,
             persist.CheckpointHook, L.ProgressHook, tracking.MLflowHook,
             tracking.RankThroughputHook]
    stages = [c.stage for c in order]
    assert stages == sorted(stages)
    # an epoch's metrics are logged once its checkpoint exists; artifacts once written
    assert persist.CheckpointHook.stage < tracking.MLflowHook.stage
    assert persist.FinalParamsHook.stage < tracking.MLflowHook.stage
    assert L.LossHook.stage < L.EvalHook.stage < L.ReplicaCheckHook.stage


class Seen(H.Hook):
    stage = H.REPORT

    def __init__(self) -> None:
        self.step_keys: set[str] = set()
        self.epoch_keys: set[str] = set()
        self.artifacts: dict[str, str] = {}

    def after_step(self, loop, out):
        self.step_keys |= set(out.metrics)

    def after_epoch(self, loop, epoch, metrics):
        self.epoch_keys |= set(metrics)

    def after_train(self, loop, error):
        self.artifacts = dict(loop.artifacts)


def test_hooks_run_by_stage_whatever_the_registration_order(tmp_path):
    cfg = config_from_dict({
        "data": {"dataset": "digits", "batch_size": 64},
        "model": {"name": "small_plain", "width": 4},
        "optim": {"base_lr": 0.05, "reference_batch": 16, "warmup": "none", "decay": "none"},
        "train": {"epochs": 1, "max_steps": 3, "log_every": 1, "progress": False},
        "tracking": {"enabled": False}})
    b = build(cfg)
    seen = Seen()
    hooks = [seen, persist.FinalParamsHook(0, None, str(tmp_path)), L.EvalHook(b.data.val, 64),
             L.TimerHook(), L.LossHook(1)]
    loop = L.TrainLoop(net=b.net, trainer=b.trainer, train_source=b.data.train,
                       loss_fn=mx.gluon.loss.SoftmaxCrossEntropyLoss(), epochs=1, ctx=b.ctx,
                       hooks=hooks, max_steps=3)
    assert [type(h).__name__ for h in loop.hooks] == [
        "TimerHook", "LossHook", "EvalHook", "FinalParamsHook", "Seen"]
    loop.run()
    assert seen.step_keys == {"train/loss"}
    assert {"train/loss", "perf/images_per_sec", "val/accuracy", "train/lr"} <= seen.epoch_keys
    # the hybridized net is also exported (symbol + parameters) for mxlarge.load
    assert seen.artifacts == {"final_params": f"{tmp_path}/final.params",
                              "model": f"{tmp_path}/model"}
    assert {p.name for p in (tmp_path / "model").iterdir()} == {"model-symbol.json",
                                                               "model-0000.params"}


def test_the_loss_is_read_at_each_epochs_last_step_and_every_log_every_steps():
    """With 7 steps per epoch and log_every 5, the loss is read at 5, 7 (the epoch's end), 10,
    14, 15; a process that started from a checkpoint at step 14 counts its epochs from there."""
    from types import SimpleNamespace

    def reads(start, steps, max_steps=None):
        hook = L.LossHook(5, steps_per_epoch=7)
        loop = SimpleNamespace(step=start, max_steps=max_steps, trainer=SimpleNamespace(
            grads=lambda d: [mx.nd.ones((2,))]))
        hook.before_train(loop)
        read = []
        for s in range(start, start + steps):
            out = StepOutput(s, 0, 0.1, mx.nd.array([1.0, 3.0]), 2, {})
            hook.after_step(loop, out)
            if "train/loss" in out.metrics:
                read.append(s + 1)
        return read

    assert reads(0, 15) == [5, 7, 10, 14, 15]
    assert reads(14, 7) == [15, 20, 21]
    assert reads(0, 3, max_steps=3) == [3]
