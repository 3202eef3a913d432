"""Gluon's optimizer arguments (a name + ``optimizer_params``, or an ``mx.optimizer`` instance)
translated into what :class:`~mxlarge.kvstore.updater.LargeBatchSGD` runs.

MXNet parses the arguments itself (``mx.optimizer.create``), so its own names and defaults
apply; what the recipe's update cannot honour is refused here with the reason.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import mxnet as mx

from mxlarge import schedulers
from mxlarge.schedulers import Schedule

# Optimizer classes whose update mxlarge's LargeBatchSGD reproduces, by MXNet class name.
HONOURED = {"SGD": "sgd", "NAG": "nag", "LARS": "lars", "LBSGD": "lbsgd"}


class MXNetSchedule:
    """η(t) = scheduler(t + 1) of a stateful MXNet/GluonCV LR scheduler, as a function of t.

    MXNet's optimizers call their scheduler with ``num_update`` = 1 on the first update, and
    schedulers such as ``MultiFactorScheduler`` or GluonCV's ``LRSequential`` must be called in
    increasing order; the values are computed in order once and kept, so the schedule can be
    asked for any step (the momentum correction asks for t − 1 and t).
    """

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.values: list[float] = []

    def __call__(self, step: int) -> float:
        while len(self.values) <= step:
            self.values.append(float(self.scheduler(len(self.values) + 1)))
        return self.values[step]


def note_differences(momentum_correction: bool, decay_bn_bias: bool,
                     opt: Mapping[str, Any]) -> None:
    """The Gluon form's one note on stderr (rank 0, at construction): what this update does by
    default that gluon.Trainer's does not, and the keywords that make it gluon's."""
    differ = []
    if momentum_correction and opt["momentum"]:
        differ.append("momentum correction (the velocity is rescaled by lr_t/lr_{t-1} when "
                      "the LR changes: Goyal et al.'s eq. 9, not MXNet's eq. 10)")
    if not decay_bn_bias and opt["wd"]:
        differ.append("no weight decay on BatchNorm gamma/beta and biases")
    if not differ:
        return
    nag = (" (nag with wd: the decay term reads the weight before the update, MXNet's in-place "
           "kernel the updated one)" if opt["nesterov"] and opt["wd"] else "")
    print(f"mxlarge.Trainer: note: the update differs from gluon.Trainer's by "
          f"{' and '.join(differ)}; momentum_correction=False, decay_bn_bias=True give "
          f"gluon.Trainer's update{nag}", file=sys.stderr, flush=True)


def optimizer_settings(optimizer: str | mx.optimizer.Optimizer,
                       optimizer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """What an MXNet optimizer (name + params, or instance) asks for, as LargeBatchSGD
    arguments (``base`` schedule, ``momentum``, ``nesterov``, ``wd``, ``lars*``, ``rescale``,
    ``begin``, ``multi_precision``, and the parsed optimizer as ``mxnet``)."""
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name not in HONOURED.values():
            raise ValueError(f"optimizer {optimizer!r} is not supported: mxlarge applies "
                             "Goyal et al.'s momentum SGD; expected one of "
                             f"{', '.join(HONOURED.values())}")
        opt = mx.optimizer.create(name, **dict(optimizer_params or {}))
    else:
        if optimizer_params:
            raise ValueError("optimizer_params must be None when an optimizer instance is "
                             "given (as in gluon.Trainer)")
        opt = optimizer
        if type(opt).__name__ not in HONOURED:
            raise ValueError(f"optimizer {type(opt).__name__} is not supported: mxlarge "
                             "applies Goyal et al.'s momentum SGD; expected an instance of "
                             f"mx.optimizer.{', '.join(HONOURED)}")
    kind = HONOURED[type(opt).__name__]
    if opt.clip_gradient is not None:
        raise ValueError("clip_gradient is not supported: Goyal et al.'s update does not clip "
                         "(clip the summed gradient yourself between allreduce_grads() and "
                         "update())")
    if opt.lr_mult or opt.wd_mult:
        raise ValueError("per-index lr_mult/wd_mult on the optimizer are not supported: set "
                         "Parameter.wd_mult = 0 for tensors without weight decay")
    if kind == "lbsgd":
        # LBSGD's own warmup/batch scaling would be applied on top of mxlarge's.
        defaults = {"warmup_strategy": "linear", "warmup_epochs": 5, "batch_scale": 1}
        changed = [k for k, v in defaults.items() if getattr(opt, k) != v]
        if changed or opt.init_updates:
            raise ValueError(f"lbsgd's {', '.join(changed) or 'begin_epoch'} are not "
                             "supported: use the Trainer's reference_batch, scaling, "
                             "warmup_steps and warmup_lr keywords (the warmup and LR "
                             "scaling are derived from the store's world size)")
    lars = kind in ("lars", "lbsgd")
    base: Schedule
    if opt.lr_scheduler is not None:
        base = MXNetSchedule(opt.lr_scheduler)
    else:
        base = schedulers.Constant(float(opt.lr))
    return {"base": base, "momentum": float(getattr(opt, "momentum", 0.0)),
            "nesterov": kind == "nag", "wd": float(opt.wd), "lars": lars,
            "lars_eta": float(getattr(opt, "eta", 0.001)),
            "lars_eps": float(getattr(opt, "eps", 0.0)) if kind == "lars" else 0.0,
            "rescale": float(opt.rescale_grad), "begin": int(opt.begin_num_update),
            "multi_precision": bool(opt.multi_precision), "mxnet": opt}
