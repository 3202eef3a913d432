"""Experiment configuration: frozen dataclasses, a strict YAML loader and world-size scaling.

Every experiment is one YAML file whose keys mirror the dataclasses below. The loader rejects
unknown keys (suggesting the nearest valid one), wrong types and out-of-range values with one
message naming the file, the key path, the value and what was expected. ``key=value`` overrides
from the command line go through the same checks.

The loader also reads other YAML files made of such dataclasses (sweep files: a section may
be a list of mappings, ``tuple[Dataclass, ...]``; a field without a default is required).
What the world size makes of a config (global batch, LR, steps) is decided in
:mod:`mxlarge.plan`, not here.

It is over 500 lines because the whole schema (every field with its doc and range) and the
cross-field rules live with the loader, so a key's rule and its error message are in one place.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mxlarge.errors import InputError, closest
from mxlarge.kvstore import FUSION_BYTES

DATASETS = ("digits", "synthetic", "imagenet", "cifar10", "mnist1d")
KVSTORES = ("local", "device", "dist_sync", "dist_device_sync")


class ConfigError(InputError):
    """A configuration problem: names the file, the key, the value and what was expected."""


def _f(default: Any, doc: str, **rules: Any) -> Any:
    """A dataclass field with a docstring and validation rules (choices, ge, gt, le, lt)."""
    if isinstance(default, (list, dict)):
        raise TypeError("mutable default")
    return field(default=default, metadata={"doc": doc, **rules})


@dataclass(frozen=True)
class DataConfig:
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
    warmup_epochs: float = _f(5.0, "length of the warmup", ge=0)
    warmup_lr: float | None = _f(None, "LR at step 0 of the warmup (default: base_lr)", gt=0)
    decay: str = _f("step", "schedule after warmup", choices=("step", "cosine", "poly", "none"))
    decay_epochs: tuple[float, ...] = _f((30.0, 60.0, 80.0), "step decay: epochs of each drop",
                                         ge=0)
    decay_factor: float = _f(0.1, "step decay: multiplier at each drop", gt=0, le=1)
    poly_power: float = _f(2.0, "poly decay: power", gt=0)
    lars: bool = _f(False, "layer-wise adaptive rate scaling (You et al. 2017); the scheduled LR "
                           "is then the paper's global LR gamma, not an SGD LR "
                           "(docs/performance.md, LARS)")
    lars_eta: float = _f(0.001, "LARS trust coefficient eta (the paper's and MXNet's 0.001)",
                         gt=0)
    lars_lr: float | None = _f(None, "LARS: the global LR gamma at reference_batch, used "
                                     "instead of base_lr (required with lars)", gt=0)


@dataclass(frozen=True)
class TrainConfig:
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
                                                   "multi-host jobs")
    keep_last: int = _f(3, "checkpoints kept (0: all)", ge=0)
    divergence_factor: float = _f(10.0, "stop when the training loss exceeds this multiple of "
                                        "its first value (0: only non-finite values stop)",
                                  ge=0)
    gns_every: int = _f(0, "estimate the gradient noise scale every N steps (0: off; needs "
                           "2+ workers, devices or simulated workers)", ge=0)
    gns_decay: float = _f(0.9, "EMA factor of the gradient-noise-scale estimates", ge=0, lt=1)
    amp: str = _f("none", "MXNet AMP (mxnet.contrib.amp) with dynamic loss scaling: bfloat16 "
                          "(CPU) or float16 (GPU); weights stay float32",
                  choices=("none", "bfloat16", "float16"))
    save_params: str | None = _f(None, "also write the final parameters here ('{rank}' is "
                                       "replaced by the rank; '.local' copy has the rank's own "
                                       "BN statistics)")


@dataclass(frozen=True)
class DistConfig:
    kvstore: str = _f("local", "KVStore type", choices=KVSTORES)
    workers: int = _f(1, "worker processes the experiment is written for", ge=1)
    devices: int = _f(1, "devices per worker; each takes data.batch_size images and keeps its "
                         "own BN statistics", ge=1)
    device_type: str = _f("cpu", "cpu (mx.cpu(i) per device) or gpu (mx.gpu(i))",
                          choices=("cpu", "gpu"))
    simulate_workers: int = _f(1, "reproduce this many dist_sync workers exactly in one "
                                  "process (micro-batches of data.batch_size, own BN "
                                  "statistics each)", ge=1)
    servers: int = _f(0, "parameter servers the experiment is written for (0: one per worker, "
                         "as MXNet's launch.py: each server then carries a worker's share of "
                         "every gradient, |g| per step, as much as a worker's own link)", ge=0)
    server_hosts: tuple[str, ...] = _f((), "hosts that run parameter servers only (ssh: "
                                           "addresses, mpi: names, slurm: nodes of the "
                                           "allocation); empty: servers share the worker "
                                           "hosts. Each worker host then moves |g| per step "
                                           "each way instead of 2(n-1)/n·|g| (n worker hosts)")
    bn_stats: str = _f("reduce", "BN statistics for evaluation/checkpoints",
                       choices=("local", "broadcast", "reduce"))
    check_every: int = _f(50, "compare a weight checksum across ranks every N steps (0: never)",
                          ge=0)
    compression: str = _f("none", "gradient compression on push", choices=("none", "2bit"))
    compression_threshold: float = _f(0.5, "2bit compression threshold", gt=0)
    fusion_bytes: int = _f(FUSION_BYTES, "gradient fusion: tensors smaller than this travel "
                                         "packed in buckets of up to this many bytes, one "
                                         "request each, and with S ≥ 2 servers tensors over S "
                                         "buckets as pieces of S buckets (0: one key per "
                                         "tensor)", ge=0)
    wire_dtype: str = _f("float32", "the type gradients travel in between workers and servers "
                                    "(float16: half the bytes, summed in float32 by the "
                                    "servers)", choices=("float32", "float16"))


@dataclass(frozen=True)
class TrackingConfig:
    enabled: bool = _f(True, "track the run in MLflow")
    uri: str | None = _f(None, "tracking URI (default: $MLFLOW_TRACKING_URI, else "
                                  "sqlite:///mlruns.db in the working directory)")
    experiment: str = _f("mxlarge", "MLflow experiment name")


@dataclass(frozen=True)
class Config:
    name: str = _f("unnamed", "experiment name")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


# ---------------------------------------------------------------------------------------------
# strict loading


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return f"{_describe(inner[0])} or null"
    if origin is tuple:
        noun = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}[args[0]]
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {noun}"
        return f"a list of {len(args)} {noun}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _rules_text(meta: dict) -> str:
    parts = []
    for key, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in meta:
            parts.append(f"{sym} {meta[key]}")
    return " and ".join(parts)


_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _dataclass_items(tp: Any) -> type | None:
    """The item class of ``tuple[SomeDataclass, ...]``, else None."""
    args = typing.get_args(tp)
    if (typing.get_origin(tp) is tuple and len(args) == 2 and args[1] is Ellipsis
            and dataclasses.is_dataclass(args[0])):
        return args[0]
    return None


class _Loader:
    def __init__(self, source: str):
        self.source = source

    def error(self, path: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path} = {value!r}: expected {expected}")

    def scalar(self, tp: Any, value: Any, path: str, meta: dict) -> Any:
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            if value is None:
                return None
            inner = [a for a in args if a is not type(None)][0]
            return self.scalar(inner, value, path, meta)
        if origin is tuple:
            if not isinstance(value, (list, tuple)):
                raise self.error(path, value, _describe(tp))
            item_tp = args[0]
            if not (len(args) == 2 and args[1] is Ellipsis) and len(value) != len(args):
                raise self.error(path, value, _describe(tp))
            return tuple(self.scalar(item_tp, v, f"{path}[{i}]", meta) for i, v in enumerate(value))
        if tp is bool:
            if not isinstance(value, bool):
                raise self.error(path, value, "true or false")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(path, value, "an integer" + self._range(meta))
            out: Any = value
        elif tp is float:
            # YAML 1.1 reads 5e-4 and 1e-4 (no dot) as strings: accept what a user means
            if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
                value = float(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.error(path, value, "a number" + self._range(meta))
            out = float(value)
            if not math.isfinite(out):
                raise self.error(path, value, "a finite number")
        elif tp is str:
            if not isinstance(value, str):
                raise self.error(path, value, "a string")
            out = value
        else:  # pragma: no cover - guarded by the schema
            raise TypeError(tp)
        self.check_rules(out, path, meta, shown=value)
        return out

    @staticmethod
    def _range(meta: dict) -> str:
        text = _rules_text(meta)
        return f" {text}" if text else ""

    def check_rules(self, value: Any, path: str, meta: dict, shown: Any = None) -> None:
        shown = value if shown is None else shown  # the value as written, e.g. 0 not 0.0
        choices = meta.get("choices")
        if choices is not None and value not in choices:
            raise self.error(path, shown, "one of " + ", ".join(map(str, choices)))
        for key, ok in (("ge", lambda v, b: v >= b), ("gt", lambda v, b: v > b),
                        ("le", lambda v, b: v <= b), ("lt", lambda v, b: v < b)):
            if key in meta and not ok(value, meta[key]):
                raise self.error(path, shown, f"{_describe(type(value))} {_rules_text(meta)}")

    def section(self, cls: type, data: Any, path: str) -> Any:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise self.error(path or "<top level>", data, "a mapping of keys to values")
        hints = typing.get_type_hints(cls)
        # fields marked internal are set by code, never read from a file
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
        kwargs = {}
        for key, value in data.items():
            full = f"{path}.{key}" if path else str(key)
            if key not in fields:
                raise ConfigError(f"{self.source}: unknown key '{full}'" + self._suggest(
                    str(key), list(fields), path))
            tp = hints[key]
            item = _dataclass_items(tp)
            if dataclasses.is_dataclass(tp):
                kwargs[key] = self.section(tp, value, full)
            elif item is not None:
                if not isinstance(value, list) or not value:
                    keys = ", ".join(f.name for f in dataclasses.fields(item))
                    raise self.error(full, value, f"a non-empty list of mappings ({keys})")
                kwargs[key] = tuple(self.section(item, v, f"{full}[{i}]")
                                    for i, v in enumerate(value))
            else:
                kwargs[key] = self.scalar(tp, value, full, dict(fields[key].metadata))
        for name, f in fields.items():
            if (name not in kwargs and f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING):
                full = f"{path}.{name}" if path else name
                raise ConfigError(f"{self.source}: missing key '{full}'")
        return cls(**kwargs)

    @staticmethod
    def _suggest(key: str, names: list[str], path: str) -> str:
        close = closest(key, names)
        if not close:
            where = f"'{path}'" if path else "the top level"
            return f" (valid keys in {where}: {', '.join(names)})"
        full = f"{path}.{close[0]}" if path else close[0]
        return f" (did you mean '{full}'?)"


def _set_path(tree: dict, dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{dotted}': '{part}' is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: typing.Sequence[str]) -> list[tuple[str, Any]]:
    """Parses ``key.path=value`` strings; values are YAML scalars or flow lists."""
    out = []
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key or any(not p for p in key.split(".")):
            raise ConfigError(f"override {item!r}: expected KEY.PATH=VALUE, e.g. optim.base_lr=0.2")
        try:
            value = yaml.safe_load(text) if text != "" else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from None
        out.append((key, value))
    return out


def config_from_dict(tree: dict, source: str = "<dict>") -> Config:
    """Builds and validates a :class:`Config` from a nested dict."""
    cfg = _Loader(source).section(Config, tree, "")
    validate(cfg, source)
    return cfg


def load_dataclass(cls: type, tree: Any, source: str) -> Any:
    """Strictly loads any dataclass written with this module's field rules (e.g. a sweep file).

    Raises:
        ConfigError: naming the file, the key path, the value and what was expected.
    """
    return _Loader(source).section(cls, tree, "")


def read_yaml(path: str | Path, what: str = "config") -> Any:
    """Parses a YAML file; a missing file or malformed YAML is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what} file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: malformed YAML{where}: {problem}") from None


def load_config(path: str | Path, overrides: typing.Sequence[str] = ()) -> Config:
    """Loads an experiment YAML strictly, applies ``key=value`` overrides, validates.

    Raises:
        ConfigError: naming the file, key path, value and what was expected.
    """
    path = Path(path)
    tree = read_yaml(path)
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, "
                          f"got {type(tree).__name__}")
    source = str(path)
    parsed = parse_overrides(overrides)
    for key, value in parsed:
        _set_path(tree, key, value, f"{path} (override {key}={value!r})")
    if parsed:
        source += " with overrides " + " ".join(overrides)
    return config_from_dict(tree, source)


def validate(cfg: Config, source: str = "<config>") -> None:
    """Cross-field checks that a single field's rules cannot express."""
    o, d = cfg.optim, cfg.data
    if list(o.decay_epochs) != sorted(o.decay_epochs):
        raise ConfigError(f"{source}: optim.decay_epochs = {list(o.decay_epochs)}: "
                          "expected epochs in increasing order")
    if o.decay == "step" and o.decay_epochs and o.decay_epochs[-1] >= cfg.train.epochs:
        raise ConfigError(f"{source}: optim.decay_epochs = {list(o.decay_epochs)}: expected every "
                          f"drop before the last epoch (train.epochs = {cfg.train.epochs})")
    if o.warmup != "none" and o.warmup_epochs >= cfg.train.epochs:
        raise ConfigError(f"{source}: optim.warmup_epochs = {o.warmup_epochs}: expected fewer "
                          f"than train.epochs = {cfg.train.epochs}")
    if (o.decay == "step" and o.warmup != "none" and o.decay_epochs
            and o.decay_epochs[0] < o.warmup_epochs):
        raise ConfigError(f"{source}: optim.decay_epochs = {list(o.decay_epochs)}: expected every "
                          f"drop after the warmup (optim.warmup_epochs = {o.warmup_epochs})")
    if o.lars and o.lars_lr is None:
        raise ConfigError(f"{source}: optim.lars_lr = None: expected the LARS global LR gamma "
                          "with optim.lars = true (it is not an SGD LR: each layer moves by "
                          f"about gamma x lars_eta = gamma x {o.lars_eta:g} of its norm per step, "
                          "so gamma is far above base_lr; 5 trains the digits proxy; "
                          "docs/performance.md, LARS)")
    if o.lars_lr is not None and not o.lars:
        raise ConfigError(f"{source}: optim.lars_lr = {o.lars_lr}: expected it unset with "
                          "optim.lars = false (base_lr is the LR without LARS)")
    if o.lars and o.nesterov:
        raise ConfigError(f"{source}: optim.nesterov = true: expected false with optim.lars = "
                          "true (the LARS update has no Nesterov form)")
    if d.scale[0] > d.scale[1] or d.ratio[0] > d.ratio[1]:
        raise ConfigError(f"{source}: data.scale/data.ratio = {list(d.scale)}/{list(d.ratio)}: "
                          "expected [low, high] with low <= high")
    if d.dataset == "imagenet" and not d.train_rec:
        raise ConfigError(f"{source}: data.train_rec = None: expected the path of a .rec file "
                          "when data.dataset is imagenet")
    if d.dataset == "cifar10" and not d.root:
        raise ConfigError(f"{source}: data.root = None: expected the directory of the CIFAR-10 "
                          "binary batches when data.dataset is cifar10")
    if d.dataset == "mnist1d" and d.augment:
        raise ConfigError(f"{source}: data.augment = True: expected false when data.dataset is "
                          "mnist1d (its generator already transforms every sample; see "
                          "mxlarge/data/mnist1d.py)")
    if d.dataset == "mnist1d" and (d.mnist1d_train + d.mnist1d_val) % 10:
        raise ConfigError(f"{source}: data.mnist1d_train + data.mnist1d_val = "
                          f"{d.mnist1d_train + d.mnist1d_val}: expected a multiple of 10 (the "
                          "generator draws the same number of samples per class)")
    if cfg.dist.simulate_workers > 1 and cfg.dist.devices > 1:
        raise ConfigError(f"{source}: dist.simulate_workers = {cfg.dist.simulate_workers}: "
                          "expected dist.devices = 1 (simulated workers share one device of "
                          "their process)")
    if cfg.dist.wire_dtype != "float32" and not cfg.dist.kvstore.startswith("dist"):
        raise ConfigError(f"{source}: dist.wire_dtype = {cfg.dist.wire_dtype!r}: expected "
                          f"'float32' with dist.kvstore = {cfg.dist.kvstore!r} (the 16-bit wire "
                          "is between workers and servers: it needs a dist store)")
    if cfg.dist.wire_dtype != "float32" and cfg.dist.compression != "none":
        raise ConfigError(f"{source}: dist.wire_dtype = {cfg.dist.wire_dtype!r}: expected "
                          f"'float32' with dist.compression = {cfg.dist.compression!r} (2-bit "
                          "compression quantises float32 pushes; choose one)")
    if cfg.train.amp == "float16" and cfg.dist.device_type == "cpu":
        raise ConfigError(f"{source}: train.amp = 'float16': expected 'bfloat16' or 'none' "
                          "with dist.device_type = 'cpu' (MXNet 1.9.1 has no float16 "
                          "convolution or GEMM on CPU; float16 AMP is for GPUs)")
    if cfg.train.amp != "none" and cfg.dist.simulate_workers > 1:
        raise ConfigError(f"{source}: dist.simulate_workers = {cfg.dist.simulate_workers}: "
                          f"expected 1 with train.amp = {cfg.train.amp!r} (MXNet 1.9.1's "
                          "bfloat16 convolution and dense kernels write no gradient when it "
                          "accumulates, grad_req='add', which simulated workers use: "
                          "docs/mxnet-facts.md; float16 is not verified here)")
    if cfg.train.amp != "none" and cfg.train.gns_every:
        raise ConfigError(f"{source}: train.gns_every = {cfg.train.gns_every}: expected 0 with "
                          f"train.amp = {cfg.train.amp!r} (AMP's gradients carry its loss "
                          "scale, so the noise-scale estimate would be off)")
    if cfg.dist.compression != "none" and not cfg.dist.kvstore.startswith("dist"):
        raise ConfigError(f"{source}: dist.compression = {cfg.dist.compression!r}: expected "
                          f"'none' with dist.kvstore = {cfg.dist.kvstore!r} (compression needs "
                          "a dist store)")


def to_dict(cfg: Any) -> dict:
    """The config as plain YAML-able data (tuples become lists)."""
    def conv(v: Any) -> Any:
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    return conv(dataclasses.asdict(cfg))


def field_docs(node: Any = None, prefix: str = "") -> dict[str, str]:
    """``{'optim.base_lr': '...', ...}``: each field's ``_f`` doc string by dotted key
    (``mxlarge show --explain KEY``; which MLflow params apply, :func:`applies`)."""
    node = Config() if node is None else node
    out: dict[str, str] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            out.update(field_docs(value, f"{prefix}{f.name}."))
        elif "doc" in f.metadata and not f.metadata.get("internal"):
            out[f"{prefix}{f.name}"] = f.metadata["doc"]
    return out


# models whose builder reads ``model.width`` (mxlarge.nets); zoo models ignore it
LOCAL_NETS = ("small_resnet", "small_plain", "resnet1d")


def applies(key: str, cfg: Config) -> bool:
    """Whether ``key`` means anything for ``cfg``'s dataset and model: a doc string that starts
    with dataset names (``imagenet: ...``, ``digits/cifar10: ...``, ``imagenet validation:
    ...``) limits the field to those datasets, one that starts with model names
    (``small_resnet/resnet1d: ...``, from :data:`LOCAL_NETS`) to those models."""
    doc = field_docs().get(key, "")
    head = doc.split(":", 1)[0].split(" ", 1)[0] if ":" in doc else ""
    named = [d for d in head.split("/") if d]
    if named and all(d in DATASETS for d in named):
        return cfg.data.dataset in named
    if named and all(d in LOCAL_NETS for d in named):
        return cfg.model.name in named
    return True


def flatten(cfg: Config) -> dict[str, Any]:
    """``{'optim.base_lr': 0.1, ...}``: the resolved config as dotted keys (MLflow params)."""
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value
    walk(to_dict(cfg), "")
    return out


def checkpoint_root(cfg: Config) -> str:
    return cfg.train.checkpoint_dir.replace("{name}", cfg.name)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def config_sha256(cfg: Config) -> str:
    """SHA-256 of the resolved config's YAML: equal iff the configs are equal."""
    return hashlib.sha256(dump_yaml(cfg).encode()).hexdigest()
