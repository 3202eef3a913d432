"""The experiment's schema: frozen dataclasses, each field with its default, doc and range.

Every experiment is one YAML file whose keys mirror these dataclasses; :mod:`.loader` reads it
strictly and :mod:`.rules` checks what one field's range cannot. A field is declared with
:func:`_f` (default, doc, rules: ``choices``, ``ge``, ``gt``, ``le``, ``lt``); the doc is what
``mxlarge show --explain KEY`` prints. A field that takes effect only when other keys say so
names that :class:`Condition` as ``when`` (e.g. ``when=When("optim.lars", "is", True)``): the
run's MLflow params keep the key only then (:mod:`mxlarge.tracking.naming`), and
docs/config.md, which :mod:`.reference` renders from this schema, says when. What the world size
makes of a config (global batch, LR, steps) is decided in :mod:`mxlarge.plan`, not here.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mxlarge.errors import InputError
from mxlarge.kvstore import FUSION_BYTES

DATASETS = ("digits", "synthetic", "imagenet", "cifar10", "mnist1d")
KVSTORES = ("local", "device", "dist_sync", "dist_device_sync")
# models whose builder reads ``model.width`` (mxlarge.nets); zoo models ignore it
LOCAL_NETS = ("small_resnet", "small_plain", "resnet1d")


class ConfigError(InputError):
    """A configuration problem: names the file, the key, the value and what was expected."""


# How a condition tests a key's value, by the word docs/config.md shows.
_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "is": operator.eq, "is not": operator.ne, ">": operator.gt, "in": lambda v, vs: v in vs}


def _shown(value: Any) -> str:
    """A value as YAML spells it: ``true``, ``null``, ``step``."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


class Condition:
    """A condition on a config's keys: called on a :class:`Config` it tells whether it holds;
    its ``str`` says it in words (docs/config.md). ``a | b`` and ``a & b`` join two."""

    def __call__(self, cfg: Any) -> bool:
        raise NotImplementedError

    def __or__(self, other: Condition) -> Condition:
        return Joined("or", (self, other))

    def __and__(self, other: Condition) -> Condition:
        return Joined("and", (self, other))


@dataclass(frozen=True)
class When(Condition):
    """``key op value`` with op one of :data:`_TESTS`, e.g. ``When("optim.decay", "is",
    "step")``, ``When("dist.devices", ">", 1)``."""
    key: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in _TESTS:
            raise ValueError(f"When: op {self.op!r}, expected one of {', '.join(_TESTS)}")

    def __call__(self, cfg: Any) -> bool:
        value = cfg
        for part in self.key.split("."):
            value = getattr(value, part)
        return bool(_TESTS[self.op](value, self.value))

    def __str__(self) -> str:
        if self.op != "in":
            return f"`{self.key}` {self.op} {_shown(self.value)}"
        if len(self.value) == 1:
            return f"`{self.key}` is {_shown(self.value[0])}"
        return f"`{self.key}` is one of [{', '.join(map(_shown, self.value))}]"


@dataclass(frozen=True)
class Joined(Condition):
    """Conditions joined by ``or`` (any holds) or ``and`` (all hold)."""
    word: str
    parts: tuple[Condition, ...]

    def __post_init__(self) -> None:
        # (a | b) | c is a | b | c: one level per word
        flat: list[Condition] = []
        for part in self.parts:
            if isinstance(part, Joined) and part.word == self.word:
                flat.extend(part.parts)
            else:
                flat.append(part)
        object.__setattr__(self, "parts", tuple(flat))

    def __call__(self, cfg: Any) -> bool:
        test = any if self.word == "or" else all
        return test(part(cfg) for part in self.parts)

    def __str__(self) -> str:
        shown = [f"({p})" if isinstance(p, Joined) else str(p) for p in self.parts]
        return f" {self.word} ".join(shown)


#: A dist store: workers and servers exchange between processes.
DIST_STORE = When("dist.kvstore", "in", tuple(k for k in KVSTORES if k.startswith("dist")))
#: The store sums gradients: between processes, or between one process's devices.
STORE_SUMS = DIST_STORE | When("dist.devices", ">", 1)
#: More than one set of BN statistics to choose from: workers, devices or simulated workers
#: (:mod:`mxlarge.bnstats`).
BN_UNITS = STORE_SUMS | When("dist.simulate_workers", ">", 1)
_LARS = When("optim.lars", "is", True)
_WARMUP = When("optim.warmup", "is not", "none")
_STEP_DECAY = When("optim.decay", "is", "step")
_CHECKPOINTS = When("train.checkpoint_every", ">", 0)


def _f(default: Any, doc: str, **rules: Any) -> Any:
    """A dataclass field with a docstring, validation rules (choices, ge, gt, le, lt) and, as
    ``when``, the :class:`Condition` under which it takes effect."""
    if isinstance(default, (list, dict)):
        raise TypeError("mutable default")
    return field(default=default, metadata={"doc": doc, **rules})


@dataclass(frozen=True)
class DataConfig:
    """The data: which dataset, the images per worker and step, how they are read and
    augmented."""
    dataset: str = _f("digits", "which dataset", choices=DATASETS)
    batch_size: int = _f(32, "images per worker (per device) and step: Goyal's n", ge=1)
    root: str | None = _f(None, "cifar10: directory of the binary batches")
    train_rec: str | None = _f(None, "imagenet: training .rec (its .idx beside it)")
    val_rec: str | None = _f(None, "imagenet: validation .rec (its .idx beside it)")
    image_size: int = _f(224, "imagenet/synthetic: side of the square network input", ge=1)
    resize: int = _f(256, "imagenet validation: shorter side before the centre crop", ge=1)
    scale: tuple[float, float] = _f((0.08, 1.0), "imagenet: random-resized-crop area range",
                                    gt=0, le=1)
    ratio: tuple[float, float] = _f((0.75, 4 / 3), "imagenet: random-resized-crop aspect range",
                                    gt=0)
    flip: bool = _f(True, "imagenet/cifar10: random horizontal flip when training")
    augment: bool = _f(True, "digits/cifar10: random shift (pad and crop) and, for cifar10, flip")
    mean: tuple[float, float, float] = _f((123.68, 116.779, 103.939),
                                          "imagenet/cifar10: per-channel mean (0-255)")
    std: tuple[float, float, float] = _f((58.393, 57.12, 57.375),
                                         "imagenet/cifar10: per-channel std (0-255)", gt=0)
    synthetic_train: int = _f(2048, "synthetic: number of training images", ge=1)
    synthetic_val: int = _f(256, "synthetic: number of validation images", ge=1)
    mnist1d_train: int = _f(4000, "mnist1d: training samples generated", ge=1)
    mnist1d_val: int = _f(1000, "mnist1d: validation samples generated", ge=1)
    cache_dir: str | None = _f(None, "mnist1d: cache of generated sets (default: "
                                     "$XDG_CACHE_HOME/mxlarge or ~/.cache/mxlarge)")
    num_classes: int = _f(10, "number of classes in the data", ge=2)
    train_samples: int | None = _f(None, "training images, for `show` without the data at "
                                            "hand (ImageNet-1k: 1281167)", ge=1)
    threads: int = _f(2, "imagenet: decoding threads per worker", ge=1)


@dataclass(frozen=True)
class ModelConfig:
    """The network: which model, its width and its initialisation."""
    name: str = _f("small_resnet", "small_resnet, small_plain, resnet1d or a GluonCV model-zoo "
                                   "name")
    width: int = _f(16, "small_resnet/small_plain/resnet1d: channels of the first stage",
                    ge=1)
    he_init: bool = _f(True, "He/MSRA normal init of convolutions (Goyal et al.)")
    fc_init_std: float = _f(0.01, "std of the final Dense init; 0 keeps the builder's init", ge=0)
    zero_gamma: bool = _f(True, "gamma = 0 for the last BatchNorm of every residual block")
    hybridize: bool = _f(True, "hybridize the network (static graph)")


@dataclass(frozen=True)
class OptimConfig:
    """SGD and its schedule: the LR and how it scales, momentum, weight decay, warmup, decay
    and LARS."""
    base_lr: float = _f(0.1, "reference LR, valid at reference_batch", gt=0)
    reference_batch: int = _f(256, "global batch at which base_lr is right", ge=1)
    scaling: str = _f("linear", "LR scaling rule from reference_batch to the global batch",
                      choices=("linear", "sqrt", "none"))
    momentum: float = _f(0.9, "momentum m", ge=0, lt=1)
    nesterov: bool = _f(False, "Nesterov momentum")
    momentum_correction: bool = _f(True, "rescale the velocity by lr_t/lr_(t-1) (Goyal eq. 9)")
    weight_decay: float = _f(1e-4, "L2 weight decay lambda", ge=0)
    decay_bn_bias: bool = _f(False, "also decay BatchNorm gamma/beta and biases")
    warmup: str = _f("linear", "gradual (linear), constant, or no warmup",
                     choices=("linear", "constant", "none"))
    warmup_epochs: float = _f(5.0, "length of the warmup", ge=0, when=_WARMUP)
    warmup_lr: float | None = _f(None, "LR at step 0 of the warmup (default: base_lr; never "
                                       "above the peak LR)", gt=0, when=_WARMUP)
    decay: str = _f("step", "LR schedule after the warmup: step drops (Goyal et al.), cosine, "
                            "poly (see poly_power), or none: the peak LR to the end",
                    choices=("step", "cosine", "poly", "none"))
    decay_epochs: tuple[float, ...] = _f((30.0, 60.0, 80.0), "step decay: epochs of each drop",
                                         ge=0, when=_STEP_DECAY)
    decay_factor: float = _f(0.1, "step decay: multiplier at each drop", gt=0, le=1,
                              when=_STEP_DECAY)
    poly_power: float = _f(2.0, "poly decay: the power p of LR = peak·(1 - t/T)^p over the T "
                                "steps after the warmup", gt=0,
                            when=When("optim.decay", "is", "poly"))
    lars: bool = _f(False, "layer-wise adaptive rate scaling (You et al. 2017); the scheduled LR "
                           "is then the paper's global LR gamma, not an SGD LR "
                           "(docs/performance.md, LARS)")
    lars_eta: float = _f(0.001, "LARS trust coefficient eta (the paper's and MXNet's 0.001)",
                         gt=0, when=_LARS)
    lars_lr: float | None = _f(None, "LARS: the global LR gamma at reference_batch, used "
                                     "instead of base_lr (required with lars)", gt=0,
                                when=_LARS)


@dataclass(frozen=True)
class TrainConfig:
    """The run: epochs, seed, evaluation and logging, checkpoints, the noise scale, precision
    and the timeline."""
    epochs: int = _f(90, "training epochs", ge=1)
    seed: int = _f(0, "seed of init and data order", ge=0)
    eval_every: int = _f(1, "evaluate every this many epochs", ge=1)
    log_every: int = _f(10, "log training metrics every this many steps", ge=1)
    progress: bool = _f(True, "tqdm progress bar per epoch")
    max_steps: int | None = _f(None, "stop after this many steps (smoke runs)", ge=1)
    checkpoint_every: int = _f(0, "write an exact checkpoint every N epochs and after the last "
                                  "(0: never)", ge=0)
    checkpoint_dir: str = _f("checkpoints/{name}", "where checkpoints go ({name}: the "
                                                   "experiment name); shared storage for "
                                                   "multi-host jobs", when=_CHECKPOINTS)
    keep_last: int = _f(3, "checkpoints kept (0: all)", ge=0, when=_CHECKPOINTS)
    divergence_factor: float = _f(10.0, "stop when the training loss exceeds this multiple of "
                                        "its first value (0: only non-finite values stop)",
                                  ge=0)
    gns_every: int = _f(0, "estimate the gradient noise scale every N steps (0: off; needs "
                           "2+ workers, devices or simulated workers)", ge=0)
    gns_decay: float = _f(0.9, "EMA factor of the gradient-noise-scale estimates", ge=0, lt=1,
                          when=When("train.gns_every", ">", 0))
    amp: str = _f("none", "MXNet AMP (mxnet.contrib.amp) with dynamic loss scaling: bfloat16 "
                          "(CPU) or float16 (GPU); weights stay float32",
                  choices=("none", "bfloat16", "float16"))
    timeline_start: int | None = _f(None, "record this step and the next timeline_steps - 1 "
                                          "on every worker as a Chrome trace, "
                                          "timeline/trace.json in the run (launched jobs)",
                                    ge=0)
    timeline_steps: int = _f(3, "steps the timeline records", ge=1)
    save_params: str | None = _f(None, "also write the final parameters here ('{rank}' is "
                                       "replaced by the rank; '.local' copy has the rank's own "
                                       "BN statistics)")


@dataclass(frozen=True)
class DistConfig:
    """The world and the exchange: the store, workers, devices, servers, BN statistics and what
    travels."""
    kvstore: str = _f("local", "KVStore type: local or device within one process, dist_sync or "
                               "dist_device_sync between the processes of a launched job",
                      choices=KVSTORES, when=STORE_SUMS)
    workers: int = _f(1, "worker processes the experiment is written for", ge=1,
                     when=DIST_STORE)
    devices: int = _f(1, "devices per worker; each takes data.batch_size images and keeps its "
                         "own BN statistics", ge=1, when=STORE_SUMS)
    device_type: str = _f("cpu", "cpu (mx.cpu(i) per device) or gpu (mx.gpu(i))",
                          choices=("cpu", "gpu"),
                          when=STORE_SUMS | When("dist.device_type", "is not", "cpu"))
    simulate_workers: int = _f(1, "reproduce this many dist_sync workers exactly in one "
                                  "process (micro-batches of data.batch_size, own BN "
                                  "statistics each)", ge=1,
                               when=When("dist.simulate_workers", ">", 1))
    servers: int = _f(0, "parameter servers the experiment is written for (0: one per worker, "
                         "as MXNet's launch.py: each server then carries a worker's share of "
                         "every gradient, |g| per step, as much as a worker's own link)", ge=0,
                    when=DIST_STORE)
    server_hosts: tuple[str, ...] = _f((), "hosts that run parameter servers only (ssh: "
                                           "addresses, mpi: names, slurm: nodes of the "
                                           "allocation); empty: servers share the worker "
                                           "hosts. Each worker host then moves |g| per step "
                                           "each way instead of 2(n-1)/n·|g| (n worker hosts)",
                                       when=DIST_STORE)
    bn_stats: str = _f("reduce", "BN statistics for evaluation/checkpoints",
                       choices=("local", "broadcast", "reduce"), when=BN_UNITS)
    check_every: int = _f(50, "compare a weight checksum across ranks every N steps (0: never)",
                          ge=0, when=DIST_STORE)
    compression: str = _f("none", "gradient compression on push", choices=("none", "2bit"),
                          when=DIST_STORE)
    compression_threshold: float = _f(0.5, "2bit compression threshold", gt=0,
                                       when=DIST_STORE & When("dist.compression", "is not",
                                                              "none"))
    fusion_bytes: int = _f(FUSION_BYTES, "gradient fusion: tensors smaller than this travel "
                                         "packed in buckets of up to this many bytes, one "
                                         "request each, and with S ≥ 2 servers tensors over S "
                                         "buckets as pieces of S buckets (0: one key per "
                                         "tensor)", ge=0, when=STORE_SUMS)
    wire_dtype: str = _f("float32", "the type gradients travel in between workers and servers "
                                    "(float16: half the bytes, summed in float32 by the "
                                    "servers)", choices=("float32", "float16"),
                        when=DIST_STORE)


@dataclass(frozen=True)
class TrackingConfig:
    """Where MLflow records the run."""
    enabled: bool = _f(True, "track the run in MLflow")
    uri: str | None = _f(None, "tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                  "sqlite:///mlruns.db in the working directory)")
    experiment: str = _f("mxlarge", "MLflow experiment name")


@dataclass(frozen=True)
class Config:
    """An experiment: its name and one section each for the data, the model, the optimiser,
    the run, the world and tracking."""
    name: str = _f("unnamed", "experiment name: a run's MLflow name starts with it (in a "
                              "sweep, the label does), and it is train.checkpoint_dir's {name}")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
