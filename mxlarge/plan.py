"""What a job is, decided once: its world, and everything that follows from the world.

A :class:`World` is the job's shape: worker processes, devices per process, simulated workers
per process, and the per-device (per-unit) batch n. Every other number is derived from it by one
pure function, :func:`plan` (detectron2's ``auto_scale_workers`` is the model: cfg → numbers,
no side effects)::

    units (Goyal's k)  = processes · devices · simulated
    global batch  B    = units · n
    steps per epoch    = floor(N / B)       (the last partial global batch is dropped, so every
                                             rank takes the same number of steps)
    peak LR            = scaling rule from (base_lr, or lars_lr with LARS, reference_batch) to B
    warmup, decay      = epochs · steps per epoch, rounded (``schedulers.epochs_to_steps``)

``mxlarge show``, ``train``, ``launch``, ``sweep``, checkpoints, the noise-scale estimator and
the MLflow tags all read a :class:`Plan`; nothing else multiplies workers by devices.

Which world a config declares (:func:`world_of`), and the rules that refuse a world that cannot
be the one that runs:

* a ``local``/``device`` store runs one worker process, so ``dist.workers`` must be 1
  (``dist.simulate_workers: K`` reproduces K workers in that one process);
* a ``dist_*`` store runs ``dist.workers`` processes. ``mxlarge launch -n K`` sets
  ``dist.workers = K`` in the launcher's config (the command line wins over the file, as every
  override does), so ``mxlarge show CONFIG dist.workers=K`` prints what ``launch -n K`` runs.

The launcher decides the world once; from then on it is a value. Its workers receive it as
``mxlarge train --world PxDxSxN`` (:meth:`World.to_arg`, :meth:`World.parse`), which
:func:`with_world` puts into their config in place of ``dist.workers`` and
``dist.simulate_workers``, refusing a world that contradicts the config's fixed facts (the
per-unit batch, the devices per process, a one-process store). A worker still checks the
store's real number of workers against the world (:func:`check_processes`): a job started by
other means (a user's own ``mpirun -n`` or ``launch.py -n``) may have another.

Which worlds are the *same computation* (:func:`same_math`): those with the same units k and the
same per-unit batch n. Units are numbered alike in every world (device d of rank r is unit
r·devices + d; simulated worker j of rank r is unit r·simulated + j), each unit reads the same
n positions of the global order and keeps its own BN statistics, so a checkpoint of one such
world resumes in another, and :func:`elastic_world` picks one for the hosts that are left.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from mxlarge import schedulers
from mxlarge.config import Config, ConfigError, validate
from mxlarge.schedulers import Schedule

#: How an elastic attempt of a command of the user's own learns its simulated workers per
#: process (an ``mxlarge train`` command gets the whole world as ``--world``).
SIMULATED_ENV = "MXLARGE_SIMULATE_WORKERS"


@dataclass(frozen=True)
class World:
    """The shape of a job.

    Attributes:
        processes: worker processes (the KVStore's ``num_workers``).
        devices: devices per process, each taking ``batch`` images and its own BN statistics.
        simulated: workers simulated per process (one device), each with ``batch`` images.
        batch: images per unit and step (Goyal's n).
    """

    processes: int
    devices: int = 1
    simulated: int = 1
    batch: int = 1

    @property
    def units(self) -> int:
        """Gradient contributors per step, Goyal's k: processes · devices · simulated."""
        return self.processes * self.devices * self.simulated

    @property
    def per_process_batch(self) -> int:
        """Images one process takes per step: devices · simulated · n."""
        return self.devices * self.simulated * self.batch

    @property
    def global_batch(self) -> int:
        """B = k · n."""
        return self.units * self.batch

    def to_arg(self) -> str:
        """The world as one command-line word, ``PxDxSxN`` (processes x devices x simulated x
        batch, e.g. ``2x1x1x32``); :meth:`parse` reads it back: ``parse(w.to_arg()) == w``."""
        return f"{self.processes}x{self.devices}x{self.simulated}x{self.batch}"

    @classmethod
    def parse(cls, text: str, source: str = "--world") -> World:
        """The world written by :meth:`to_arg`.

        Raises:
            ConfigError: anything but four integers >= 1 joined by ``x``.
        """
        parts = text.split("x")
        if len(parts) != 4 or not all(p.isdigit() and int(p) >= 1 for p in parts):
            raise ConfigError(f"{source} {text!r}: expected PROCESSESxDEVICESxSIMULATEDxBATCH, "
                              "four integers >= 1 (e.g. 2x1x1x32)")
        return cls(*(int(p) for p in parts))

    def shape(self) -> str:
        """``16 worker(s) x 8 device(s)``: the processes, and devices and simulated workers
        when more than one."""
        parts = [f"{self.processes} worker(s)"]
        if self.devices > 1:
            parts.append(f"{self.devices} device(s)")
        if self.simulated > 1:
            parts.append(f"{self.simulated} simulated worker(s)")
        return " x ".join(parts)

    def describe(self) -> str:
        """``16 worker(s) x 8 device(s) x 32 images = global batch 4096``."""
        return f"{self.shape()} x {self.batch} images = global batch {self.global_batch}"


def precision(cfg: Config) -> dict[str, str]:
    """What runs in which type: ``compute`` (the ops; AMP's target type or float32), ``weights``
    (and optimizer states) and ``wire`` (gradients between workers and servers)."""
    amp = cfg.train.amp
    return {"compute": f"{amp} (MXNet AMP, dynamic loss scaling)" if amp != "none"
            else "float32",
            "weights": "float32",
            "wire": ("float16 (summed in float32 by the servers)"
                     if cfg.dist.wire_dtype == "float16" else "float32")}


def world_of(cfg: Config, source: str = "<config>") -> World:
    """The world ``cfg`` declares, refused where it cannot be the one that runs.

    Raises:
        ConfigError: ``dist.workers`` > 1 with a store that runs one process.
    """
    d = cfg.dist
    if not d.kvstore.startswith("dist") and d.workers != 1:
        raise ConfigError(
            f"{source}: dist.workers = {d.workers}: expected 1 with dist.kvstore = "
            f"{d.kvstore!r} (a local store trains in one process); set dist.workers=1 "
            f"(add dist.simulate_workers={d.workers} to reproduce {d.workers} workers in one "
            "process), or run it with `mxlarge launch`")
    return World(processes=d.workers, devices=d.devices, simulated=d.simulate_workers,
                 batch=cfg.data.batch_size)


def with_world(cfg: Config, world: World, source: str = "--world") -> Config:
    """``cfg`` running in ``world`` (a launcher's decision): its ``dist.workers`` and
    ``dist.simulate_workers`` are the world's, so that ``world_of(with_world(cfg, w)) == w`` and
    the config a worker records (checkpoints, MLflow) is the one it runs.

    Raises:
        ConfigError: a world that contradicts what the config fixes: the per-unit batch
            ``data.batch_size``, ``dist.devices``, or several processes on a one-process store;
            one the config's own rules refuse (:func:`~mxlarge.config.validate`).
    """
    d = cfg.dist
    for key, fixed, given in (("data.batch_size", cfg.data.batch_size, world.batch),
                              ("dist.devices", d.devices, world.devices)):
        if fixed != given:
            raise ConfigError(f"{source} {world.to_arg()}: {key} = {fixed} in the config, "
                              f"{given} in the world; expected {fixed} (a world changes only the "
                              "processes and simulated workers)")
    if not d.kvstore.startswith("dist") and world.processes != 1:
        raise ConfigError(f"{source} {world.to_arg()}: {world.processes} processes, expected 1 "
                          f"with dist.kvstore = {d.kvstore!r} (a local store trains in one "
                          "process)")
    run = dataclasses.replace(cfg, dist=dataclasses.replace(
        d, workers=world.processes, simulate_workers=world.simulated))
    validate(run, f"{source} {world.to_arg()}")  # the config's cross-field rules hold in it
    return run


def check_processes(world: World, actual: int, source: str = "<config>") -> None:
    """A worker's check that the store has the processes of its world (a job started by other
    means than ``mxlarge launch``, e.g. ``mpirun -n``, may have another number).

    Raises:
        ConfigError: naming both numbers and what to change.
    """
    if actual != world.processes:
        raise ConfigError(
            f"{source}: the world has {world.processes} worker process(es) (dist.workers), but "
            f"this job's store has {actual}: launch it with -n {world.processes}, or set "
            f"dist.workers={actual}")


def same_math(a: World, b: World) -> bool:
    """Whether ``a`` and ``b`` run the same training: equal units k and per-unit batch n (so
    equal global batch, schedule, shards and per-unit BN statistics; module docstring)."""
    return a.units == b.units and a.batch == b.batch


def factorisations(world: World) -> list[World]:
    """Every world of the same math as ``world`` with its devices per process: P workers ×
    (k / (P · devices)) simulated workers for each P dividing k / devices, fewest workers first.

    Simulated workers run on one device, so with ``devices`` > 1 only ``simulated = 1`` counts.
    """
    per_device = world.units // world.devices
    return [World(p, world.devices, per_device // p, world.batch)
            for p in range(1, per_device + 1)
            if per_device % p == 0 and (world.devices == 1 or per_device // p == 1)]


def elastic_world(world: World, live: int, min_workers: int = 1) -> World:
    """The world to relaunch ``world`` in when ``live`` of its worker hosts answer.

    The most worker processes P <= ``live`` (P >= ``min_workers``) among
    :func:`factorisations`: P · devices · simulated · n = ``world.global_batch`` unchanged.

    Raises:
        WorldError: no factorisation fits; the one line names the possible ones.
    """
    options = factorisations(world)
    fits = [w for w in options if min_workers <= w.processes <= live]
    if fits:
        return fits[-1]
    names = "; ".join(f"{w.processes} x {w.simulated}" + (f" x {w.devices} devices"
                                                            if w.devices > 1 else "")
                      for w in options)
    raise WorldError(
        f"no world keeps global batch {world.global_batch} ({world.units} units x "
        f"{world.batch} images) on {live} live worker host(s) with --min-workers "
        f"{min_workers}: possible worker x simulated-worker factorisations are {names}")


class WorldError(ConfigError):
    """No world of the same math fits the hosts that are left."""


def train_samples(cfg: Config, need_data: bool = True) -> tuple[int, str]:
    """N, the training images over all ranks, and where the number comes from.

    The data wins when it is at hand (``"data"``); ``data.train_samples`` is for planning without
    it (``"data.train_samples"``), e.g. ``mxlarge show`` of an ImageNet job on a laptop, or a
    launcher whose hosts hold the data. With ``need_data`` the data must be readable.

    Raises:
        ConfigError: the data is missing or malformed (and no fallback applies).
    """
    from mxlarge.data import train_size

    try:
        return train_size(cfg.data), "data"
    except ConfigError:
        if need_data or cfg.data.train_samples is None:
            raise
        return cfg.data.train_samples, "data.train_samples"


@dataclass(frozen=True)
class Plan:
    """Everything a job's numbers are, derived once from its config and world."""

    world: World
    train_samples: int
    samples_from: str
    steps_per_epoch: int
    total_steps: int
    peak_lr: float
    warmup_lr: float
    warmup_steps: int
    decay_steps: tuple[int, ...]
    schedule: Schedule
    lr_note: str | None = None  # :func:`scaled_down`'s line, when the LR is scaled down

    @property
    def global_batch(self) -> int:
        return self.world.global_batch

    def summary(self) -> dict[str, Any]:
        """The plan as plain data: ``mxlarge show --json`` prints it, MLflow params ``plan.*``
        record it."""
        w = self.world
        return {"workers": w.processes, "devices_per_worker": w.devices,
                "simulated_workers": w.simulated, "per_device_batch": w.batch,
                "world_size": w.units, "global_batch": w.global_batch,
                "train_samples": self.train_samples, "train_samples_from": self.samples_from,
                "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
                "peak_lr": self.peak_lr, "warmup_lr": self.warmup_lr,
                "warmup_steps": self.warmup_steps, "decay_steps": list(self.decay_steps)}


def plan(cfg: Config, world: World, train_samples: int, samples_from: str = "data",
         source: str = "<config>") -> Plan:
    """The one pure function from (config, world, N) to the job's numbers (module docstring).

    Raises:
        ConfigError: one global batch does not fit the training data, or the noise scale is
            asked of a single gradient contributor.
    """
    steps = train_samples // world.global_batch
    if steps < 1:
        fit = train_samples // (world.units or 1)
        raise ConfigError(
            f"{source}: data.batch_size = {world.batch}: {world.describe()} is larger than the "
            f"{train_samples} training images of '{cfg.data.dataset}'; expected batch_size "
            f"<= {fit}")
    if cfg.train.gns_every and world.units == 1:
        raise ConfigError(f"{source}: train.gns_every = {cfg.train.gns_every}: the gradient noise "
                          "scale needs 2 or more workers, devices or simulated workers")
    o = cfg.optim
    base = o.base_lr
    if o.lars:  # LARS: its own global LR γ (docs/performance.md)
        if o.lars_lr is None:  # the loader refuses this (config.rules); a Config built in code
            raise ConfigError(f"{source}: optim.lars_lr = None: expected the LARS global LR "
                              "gamma with optim.lars = true")
        base = o.lars_lr
    peak = schedulers.scaled_lr(base, o.reference_batch, world.global_batch, o.scaling)
    # a warmup ramps up to the peak, never down to it (a global batch below the reference)
    warmup_lr = min(o.warmup_lr if o.warmup_lr is not None else base, peak)
    warmup = schedulers.epochs_to_steps(o.warmup_epochs, steps) if o.warmup != "none" else 0
    decay = (tuple(schedulers.epochs_to_steps(e, steps) for e in o.decay_epochs)
             if o.decay == "step" else ())
    total = steps * cfg.train.epochs
    return Plan(world=world, train_samples=train_samples, samples_from=samples_from,
                steps_per_epoch=steps, total_steps=total, peak_lr=peak, warmup_lr=warmup_lr,
                warmup_steps=warmup, decay_steps=decay,
                schedule=_schedule(cfg, peak, warmup_lr, warmup, decay, total),
                lr_note=scaled_down(base, peak, world.global_batch, o.reference_batch,
                                    o.scaling))


def scaled_down(base: float, peak: float, global_batch: int, reference: int,
                rule: str) -> str | None:
    """The line that says the LR is scaled down (``peak`` < ``base``: a global batch below the
    reference batch), and that the warmup starts at the scaled LR; None otherwise."""
    if peak >= base:
        return None
    return (f"the global batch of {global_batch} is below the reference batch of {reference}: "
            f"the LR is scaled down {peak / base:.4g}x ({rule} scaling), from {base:.6g} to "
            f"{peak:.6g}, and any warmup starts there (it never ramps the LR down)")


def _schedule(cfg: Config, peak: float, warmup_lr: float, warmup: int,
              decay: tuple[int, ...], total: int) -> Schedule:
    """The schedule the config asks for, in steps of this plan."""
    o = cfg.optim
    if o.decay == "step":
        return schedulers.goyal(peak, warmup_lr, warmup, decay, o.decay_factor, o.warmup)
    main: Schedule
    if o.decay == "cosine":
        main = schedulers.Cosine(peak, max(total - warmup, 1))
    elif o.decay == "poly":
        main = schedulers.Polynomial(peak, max(total - warmup, 1), power=o.poly_power)
    else:
        main = schedulers.Constant(peak)
    if warmup == 0:
        return main
    first = (schedulers.Linear(warmup_lr, peak, warmup) if o.warmup == "linear"
             else schedulers.Constant(warmup_lr))
    return schedulers.Join((first, main), (warmup,))


def plan_for(cfg: Config, source: str = "<config>", need_data: bool = False,
             world: World | None = None) -> Plan:
    """:func:`plan` of ``world`` (default: the declared one, :func:`world_of`) and
    :func:`train_samples`."""
    world = world if world is not None else world_of(cfg, source)
    samples, samples_from = train_samples(cfg, need_data)
    return plan(cfg, world, samples, samples_from, source)


def check_timeline(cfg: Config, total_steps: int, source: str = "<config>") -> None:
    """Refuses a ``train.timeline_start``/``timeline_steps`` window beyond the run's steps
    (``total_steps``, or ``train.max_steps`` if fewer).

    Raises:
        ConfigError: the window's last step is not a step of the run.
    """
    t = cfg.train
    if t.timeline_start is None:
        return
    steps = total_steps if t.max_steps is None else min(total_steps, t.max_steps)
    if t.timeline_start + t.timeline_steps > steps:
        raise ConfigError(f"{source}: train.timeline_start = {t.timeline_start}, "
                          f"train.timeline_steps = {t.timeline_steps}: expected steps within "
                          f"the run's {steps} (0 to {steps - 1})")


def servers_of(cfg: Config) -> int:
    """Server processes of a launched job: ``dist.servers``, or one per worker when it is 0."""
    return cfg.dist.servers or cfg.dist.workers


def server_layout(cfg: Config, pushed_elements: int) -> dict[str, Any]:
    """Where a launched job's servers run and what each worker host moves per step each way,
    |g| = ``pushed_elements`` × the wire's bytes, n = ``dist.workers`` hosts (one worker per
    host): with server hosts (``dist.server_hosts``) it pushes |g| and pulls |g|; co-located,
    the (n-1)/n of its pushes that leave it plus its server's slices to the n-1 others,
    2(n-1)/n·|g|. Each of S server hosts moves n·|g|/S each way."""
    n = cfg.dist.workers
    homes = cfg.dist.server_hosts
    g = pushed_elements * (2 if cfg.dist.wire_dtype == "float16" else 4)
    colocated = 2 * (n - 1) / n * g
    return {"servers": servers_of(cfg),
            "server_hosts": list(homes) or "co-located with the workers",
            "worker_host_bytes_each_way": int(g if homes else colocated),
            "colocated_bytes_each_way": int(colocated), "server_hosts_bytes_each_way": g,
            "server_host_bytes_each_way": int(n * g / len(homes)) if homes else None}
