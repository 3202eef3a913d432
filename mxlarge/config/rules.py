"""Cross-field rules: what one field's range cannot say, checked on a whole :class:`Config`.

Each group below yields its problems as ``key = value: expected ...`` text; :func:`validate`
raises the first one, prefixed with the source, as a one-line :class:`ConfigError`. The groups
run in a fixed order (schedule, LARS, data, devices, wire, precision, compression), so a config
that breaks two rules always gets the same message. Each rule and its reason:
docs/design/config.md.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from mxlarge.config.schema import Config, ConfigError


def _schedule(cfg: Config) -> Iterator[str]:
    """Drops in increasing order, inside the run and after the warmup; the warmup shorter
    than the run."""
    o = cfg.optim
    if list(o.decay_epochs) != sorted(o.decay_epochs):
        yield (f"optim.decay_epochs = {list(o.decay_epochs)}: "
               "expected epochs in increasing order")
    if o.decay == "step" and o.decay_epochs and o.decay_epochs[-1] >= cfg.train.epochs:
        yield (f"optim.decay_epochs = {list(o.decay_epochs)}: expected every "
               f"drop before the last epoch (train.epochs = {cfg.train.epochs})")
    if o.warmup != "none" and o.warmup_epochs >= cfg.train.epochs:
        yield (f"optim.warmup_epochs = {o.warmup_epochs}: expected fewer "
               f"than train.epochs = {cfg.train.epochs}")
    if (o.decay == "step" and o.warmup != "none" and o.decay_epochs
            and o.decay_epochs[0] < o.warmup_epochs):
        yield (f"optim.decay_epochs = {list(o.decay_epochs)}: expected every "
               f"drop after the warmup (optim.warmup_epochs = {o.warmup_epochs})")


def _lars(cfg: Config) -> Iterator[str]:
    """LARS takes its own global LR gamma (``lars_lr``), only LARS does, and has no Nesterov
    form."""
    o = cfg.optim
    if o.lars and o.lars_lr is None:
        yield ("optim.lars_lr = None: expected the LARS global LR gamma "
               "with optim.lars = true (it is not an SGD LR: each layer moves by "
               f"about gamma x lars_eta = gamma x {o.lars_eta:g} of its norm per step, "
               "so gamma is far above base_lr; 5 trains the digits proxy; "
               "docs/performance.md, LARS)")
    if o.lars_lr is not None and not o.lars:
        yield (f"optim.lars_lr = {o.lars_lr}: expected it unset with "
               "optim.lars = false (base_lr is the LR without LARS)")
    if o.lars and o.nesterov:
        yield ("optim.nesterov = true: expected false with optim.lars = "
               "true (the LARS update has no Nesterov form)")


def _data(cfg: Config) -> Iterator[str]:
    """Ranges as [low, high]; each dataset's required paths; mnist1d's own augmentation and
    per-class counts."""
    d = cfg.data
    if d.scale[0] > d.scale[1] or d.ratio[0] > d.ratio[1]:
        yield (f"data.scale/data.ratio = {list(d.scale)}/{list(d.ratio)}: "
               "expected [low, high] with low <= high")
    if d.dataset == "imagenet" and not d.train_rec:
        yield ("data.train_rec = None: expected the path of a .rec file "
               "when data.dataset is imagenet")
    if d.dataset == "cifar10" and not d.root:
        yield ("data.root = None: expected the directory of the CIFAR-10 "
               "binary batches when data.dataset is cifar10")
    if d.dataset == "mnist1d" and d.augment:
        yield ("data.augment = True: expected false when data.dataset is "
               "mnist1d (its generator already transforms every sample; see "
               "mxlarge/data/mnist1d.py)")
    if d.dataset == "mnist1d" and (d.mnist1d_train + d.mnist1d_val) % 10:
        yield ("data.mnist1d_train + data.mnist1d_val = "
               f"{d.mnist1d_train + d.mnist1d_val}: expected a multiple of 10 (the "
               "generator draws the same number of samples per class)")


def _devices(cfg: Config) -> Iterator[str]:
    """Simulated workers share one device of their process."""
    if cfg.dist.simulate_workers > 1 and cfg.dist.devices > 1:
        yield (f"dist.simulate_workers = {cfg.dist.simulate_workers}: "
               "expected dist.devices = 1 (simulated workers share one device of "
               "their process)")


def _needs_dist(cfg: Config, key: str, off: str, why: str) -> Iterator[str]:
    """``dist.<key>`` other than ``off`` needs a dist store (``dist.kvstore`` dist_*)."""
    value = getattr(cfg.dist, key)
    if value != off and not cfg.dist.kvstore.startswith("dist"):
        yield (f"dist.{key} = {value!r}: expected {off!r} with dist.kvstore = "
               f"{cfg.dist.kvstore!r} ({why})")


def _wire(cfg: Config) -> Iterator[str]:
    """A 16-bit wire needs a dist store and excludes 2-bit compression."""
    yield from _needs_dist(cfg, "wire_dtype", "float32",
                           "the 16-bit wire is between workers and servers: it needs a dist "
                           "store")
    dist = cfg.dist
    if dist.wire_dtype != "float32" and dist.compression != "none":
        yield (f"dist.wire_dtype = {dist.wire_dtype!r}: expected "
               f"'float32' with dist.compression = {dist.compression!r} (2-bit "
               "compression quantises float32 pushes; choose one)")


def _precision(cfg: Config) -> Iterator[str]:
    """AMP: float16 only on GPUs, no simulated workers, no noise-scale estimate."""
    amp = cfg.train.amp
    if amp == "float16" and cfg.dist.device_type == "cpu":
        yield ("train.amp = 'float16': expected 'bfloat16' or 'none' "
               "with dist.device_type = 'cpu' (MXNet 1.9.1 has no float16 "
               "convolution or GEMM on CPU; float16 AMP is for GPUs)")
    if amp != "none" and cfg.dist.simulate_workers > 1:
        yield (f"dist.simulate_workers = {cfg.dist.simulate_workers}: "
               f"expected 1 with train.amp = {amp!r} (MXNet 1.9.1's "
               "bfloat16 convolution and dense kernels write no gradient when it "
               "accumulates, grad_req='add', which simulated workers use: "
               "docs/mxnet-facts.md; float16 is not verified here)")
    if amp != "none" and cfg.train.gns_every:
        yield (f"train.gns_every = {cfg.train.gns_every}: expected 0 with "
               f"train.amp = {amp!r} (AMP's gradients carry its loss "
               "scale, so the noise-scale estimate would be off)")


def _compression(cfg: Config) -> Iterator[str]:
    """Gradient compression needs a dist store."""
    yield from _needs_dist(cfg, "compression", "none", "compression needs a dist store")


#: The rule groups in the order :func:`validate` checks them.
RULES: tuple[Callable[[Config], Iterator[str]], ...] = (
    _schedule, _lars, _data, _devices, _wire, _precision, _compression)


def problems(cfg: Config) -> Iterator[str]:
    """Every cross-field problem of ``cfg``, in :data:`RULES` order."""
    for rule in RULES:
        yield from rule(cfg)


def validate(cfg: Config, source: str = "<config>") -> None:
    """Cross-field checks that a single field's rules cannot express.

    Raises:
        ConfigError: ``"{source}: {the first problem}"``.
    """
    problem = next(problems(cfg), None)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
