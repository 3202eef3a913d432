"""Gluon's optimizer arguments (a name + ``optimizer_params``, or an ``mx.optimizer``
instance) translated into what :class:`~mxlarge.kvstore.updater.LargeBatchSGD` (the
momentum-SGD family) or :class:`~mxlarge.kvstore.any_optimizer.MXNetUpdate` (any other
MXNet optimizer) runs, and the checks of the store and of Horovod's keywords a migrated
Trainer line may bring.

MXNet parses the arguments itself (``mx.optimizer.create``), so its own names and
defaults apply; what the recipe's update cannot honour is refused here with the reason.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

import mxnet as mx

from mxlarge import schedulers
from mxlarge.errors import InputError
from mxlarge.kvstore.any_optimizer import REFUSED
from mxlarge.kvstore.sync import live_dist_store, require_launched
from mxlarge.kvstore.updater import LargeBatchSGD
from mxlarge.schedulers import Schedule

# Optimizer classes whose update mxlarge's LargeBatchSGD reproduces, by MXNet class name
# (every other MXNet optimizer runs its own update: mxlarge.kvstore.any_optimizer).
HONOURED = {"SGD": "sgd", "NAG": "nag", "LARS": "lars", "LBSGD": "lbsgd"}
#: MXNet's registered optimizer names mxlarge accepts (its own ``largebatchsgd``
#: excluded).
REGISTERED = frozenset(n for n, c in mx.optimizer.Optimizer.opt_registry.items()
                       if c.__name__ not in REFUSED and c is not LargeBatchSGD)


class MXNetSchedule:
    """η(t) = scheduler(t + 1) of a stateful MXNet/GluonCV LR scheduler, as a function
    of t.

    MXNet's optimizers call their scheduler with ``num_update`` = 1 on the first update,
    and schedulers such as ``MultiFactorScheduler`` or GluonCV's ``LRSequential`` must
    be called in increasing order; the values are computed in order once and kept, so
    the schedule can be asked for any step (the momentum correction asks for t − 1 and
    t).
    """

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.values: list[float] = []

    def __call__(self, step: int) -> float:
        while len(self.values) <= step:
            self.values.append(float(self.scheduler(len(self.values) + 1)))
        return self.values[step]


def store_name(kvstore: str | mx.kv.KVStore | None) -> str:
    """The store's type name (``'None'`` for no store)."""
    return "None" if kvstore is None else kvstore if isinstance(kvstore, str) else kvstore.type


def check_store_for_the_process(kvstore: str | mx.kv.KVStore | None) -> None:
    """Refuses a store that cannot be what the process is: a non-dist store in a
    launched job of several workers whose process has no dist store (each worker would
    train its own model, silently; a local Trainer beside the process's dist one, e.g. a
    reference, is deliberate), a dist one outside a launched job."""
    name = store_name(kvstore)
    dist = name.startswith("dist")
    workers = os.environ.get("DMLC_NUM_WORKER", "1")
    if not dist and os.environ.get("DMLC_ROLE") == "worker" and workers.isdigit() \
            and int(workers) > 1 and live_dist_store() is None:
        given = repr(kvstore) if kvstore is None or isinstance(kvstore, str) else \
            f"(a {name!r} store)"
        raise InputError(f"kvstore {given} in a launched job of {workers} workers: each "
                         "worker would train a model of its own; pass kvstore='dist_sync' "
                         "(or pass the script's own dist store)")
    if isinstance(kvstore, str):
        require_launched(name, "run the script with `python -m mxlarge.launcher -n K -s S -- "
                         "python SCRIPT`, or pass kvstore='local' for one process")


def check_horovod_keywords(compression: Any, predivide: float) -> None:
    """Horovod's ``DistributedTrainer`` keywords, which a migrated line may keep: what
    maps is said, what has no meaning here is refused with the reason (none is dropped
    silently)."""
    if compression is not None and not isinstance(compression, Mapping):
        name = getattr(compression, "__name__", type(compression).__name__)
        raise ValueError(f"compression={name}: expected MXNet's gradient-compression dict "
                         "(e.g. {'type': '2bit', 'threshold': 0.5}); for Horovod's "
                         "Compression.fp16 (--fp16-allreduce) pass wire_dtype='float16' (the "
                         "same float16 rounding on the wire, summed in float32 by the "
                         "servers); for Compression.none pass nothing")
    if float(predivide) != 1.0:
        raise ValueError(f"gradient_predivide_factor={predivide}: Horovod splits its 1/size "
                         "average into 1/f before its float16 sum and f/size after; mxlarge's "
                         "sum is of s*g already (s = rescale_grad; the 16-bit wire sums in "
                         "float32) and its mean is the same whatever f, so there is nothing "
                         "to predivide: leave it at 1.0")


def note_differences(momentum_correction: bool, decay_bn_bias: bool, opt: Mapping[str, Any],
                     *, lr_changes: bool, workers: int = 1, rank: int = 0,
                     scaled: bool = False) -> None:
    """The Gluon form's one note on stderr (the kvstore-rank-0 process, at construction,
    labelled with its rank on dist): what this update does by default that
    gluon.Trainer's does not, the keywords that make it gluon's, and on dist
    (``workers`` k > 1, no ``reference_batch``: ``scaled`` False) the step size:
    ``step(n)`` applies the mean over the k·n global batch, where gluon.Trainer on
    dist_sync applies k times that (the servers sum)."""
    differ = []
    keys = []
    if momentum_correction and opt["momentum"] and lr_changes:
        differ.append("momentum correction (the velocity is rescaled by lr_t/lr_{t-1} when "
                      "the LR changes: Goyal et al.'s eq. 9, not MXNet's eq. 10)")
        keys.append("momentum_correction=False")
    if not decay_bn_bias and opt["wd"]:
        differ.append("no weight decay on BatchNorm gamma/beta and biases")
        keys.append("decay_bn_bias=True")
    said = []
    if differ:
        nag = (" (nag with wd: the decay term reads the weight before the update, MXNet's "
               "in-place kernel the updated one)" if opt["nesterov"] and opt["wd"] else "")
        said.append(f"the update differs from gluon.Trainer's by {' and '.join(differ)}; "
                    f"{', '.join(keys)} give{'s' if len(keys) == 1 else ''} gluon.Trainer's "
                    f"update{nag}")
    if workers > 1 and not scaled:
        said.append(f"step(n) applies the mean gradient over the global batch of {workers}*n "
                    f"images, where gluon.Trainer on dist_sync applies {workers}x that update "
                    "(the servers sum): for gluon's step size pass reference_batch=n (linear "
                    f"scaling) or multiply the LR by {workers}")
    if not said:
        return
    who = f"mxlarge.Trainer (kvstore rank {rank} of {workers})" if workers > 1 else \
        "mxlarge.Trainer"
    print(f"{who}: note: {'; '.join(said)}", file=sys.stderr, flush=True)


def optimizer_settings(optimizer: str | mx.optimizer.Optimizer,
                       optimizer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """What an MXNet optimizer (name + params, or instance) asks for: ``base`` schedule,
    ``rescale``, ``begin``, ``multi_precision``, ``wd``, the parsed optimizer as ``mxnet``, and
    ``sgd``: True for the momentum-SGD family (:data:`HONOURED`), which LargeBatchSGD runs with
    ``momentum``, ``nesterov``, ``lars*``; False for any other MXNet optimizer, which
    :class:`~mxlarge.kvstore.any_optimizer.MXNetUpdate` runs (``momentum`` 0: nothing to
    correct)."""
    if isinstance(optimizer, str):
        name = optimizer.lower()
        if name not in mx.optimizer.Optimizer.opt_registry:
            raise ValueError(f"optimizer {optimizer!r}: MXNet registers no such optimizer "
                             f"(expected one of {', '.join(sorted(REGISTERED))})")
        opt = mx.optimizer.create(name, **dict(optimizer_params or {}))
    else:
        if optimizer_params:
            raise ValueError("optimizer_params must be None when an optimizer instance is "
                             "given (as in gluon.Trainer)")
        opt = optimizer
    cls = type(opt).__name__
    if cls in REFUSED:
        raise ValueError(f"optimizer {cls} is not supported: {REFUSED[cls]}")
    if isinstance(opt, LargeBatchSGD):
        raise ValueError("optimizer LargeBatchSGD: pass its schedule to the Trainer (the "
                         "explicit form) or an MXNet optimizer")
    if opt.clip_gradient is not None and cls in HONOURED:
        # MXNet's other optimizers clip inside their kernels, after the 1/(k*n) rescale:
        # the global mean gradient is clipped, as one process's over the global batch
        # would be
        raise ValueError("clip_gradient is not supported with the momentum-SGD family: Goyal "
                         "et al.'s update does not clip (clip the summed gradient yourself "
                         "between allreduce_grads() and update())")
    if opt.lr_mult or opt.wd_mult:
        raise ValueError("per-index lr_mult/wd_mult on the optimizer are not supported: set "
                         "Parameter.wd_mult = 0 for tensors without weight decay")
    base: Schedule
    if opt.lr_scheduler is not None:
        base = MXNetSchedule(opt.lr_scheduler)
    else:
        base = schedulers.Constant(float(opt.lr))
    common = {"base": base, "wd": float(opt.wd), "rescale": float(opt.rescale_grad),
              "begin": int(opt.begin_num_update),
              "multi_precision": bool(opt.multi_precision), "mxnet": opt}
    if cls not in HONOURED:
        return {**common, "sgd": False, "momentum": 0.0, "nesterov": False, "lars": False,
                "lars_eta": 0.001, "lars_eps": 0.0}
    kind = HONOURED[cls]
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
    return {**common, "sgd": True, "momentum": float(getattr(opt, "momentum", 0.0)),
            "nesterov": kind == "nag", "lars": lars,
            "lars_eta": float(getattr(opt, "eta", 0.001)),
            "lars_eps": float(getattr(opt, "eps", 0.0)) if kind == "lars" else 0.0}
