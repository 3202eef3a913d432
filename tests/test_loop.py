"""The loop's hook order (stated once, as stages) and the data hooks exchange."""
from __future__ import annotations

import mxnet as mx

from mxlarge import hooks as H
from mxlarge import loop as L
from mxlarge import tracking
from mxlarge.config import config_from_dict
from mxlarge.run import build


def test_stages_order_producers_before_consumers():
    order = [L.LossHook, L.TimerHook, L.EvalHook, L.ReplicaCheckHook, L.FinalParamsHook,
             L.CheckpointHook, L.ProgressHook, tracking.MLflowHook, tracking.RankThroughputHook]
    stages = [c.stage for c in order]
    assert stages == sorted(stages)
    # an epoch's metrics are logged once its checkpoint exists; artifacts once written
    assert L.CheckpointHook.stage < tracking.MLflowHook.stage
    assert L.FinalParamsHook.stage < tracking.MLflowHook.stage
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
    hooks = [seen, L.FinalParamsHook(0, None, str(tmp_path)), L.EvalHook(b.data.val, 64),
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
