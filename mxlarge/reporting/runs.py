"""A sweep's runs as plain data: :class:`RunData`, the metric names a report reads, and which
runs it uses.

A store written before the MLflow sections is read under the current names
(:data:`LEGACY_METRICS`), so everything downstream sees one vocabulary. A report uses the newest
FINISHED run per (label, seed) and names every run it leaves out rather than averaging it in
silently (:func:`select_runs`); a run stopped by divergence is a result of its configuration, not
a gap (:func:`diverged_runs`). Nothing here reads MLflow: :mod:`mxlarge.reporting.store` does.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Metrics logged once per epoch, all at the step at which the epoch ended (mxlarge.loop).
EPOCH_KEYS = ("train/epoch", "val/error_top1", "val/accuracy", "perf/train_seconds",
              "perf/images_per_sec", "breakdown/wait_share")
# The names stores written before the MLflow sections (train/, val/, perf/, gns/) used for the
# metrics a report reads; such a run is read under the new names.
LEGACY_METRICS = {"train/epoch": "epoch", "val/error_top1": "val_error_top1",
                  "val/accuracy": "val_accuracy", "perf/train_seconds": "train_seconds",
                  "perf/images_per_sec": "images_per_sec_global", "train/loss": "train_loss_step",
                  "train/lr": "lr", "gns/b_simple": "gns_b_simple"}
# Params that do not change what is trained: two runs whose other params are equal are "the
# same config" at different worlds (for the speedup columns). The world is every `dist.*` key:
# how many units (workers, devices, simulated workers) and how they exchange; a run of one unit
# has none of them (mxlarge.tracking.naming.TAKES_EFFECT), so they cannot tell configs apart.
_NOT_CONFIG = ("name", "train.seed", "train.progress", "train.log_every", "train.save_params")


def epoch_rows(histories: Mapping[str, Sequence[tuple[int, float]]]) -> list[dict[str, float]]:
    """Joins per-epoch metric histories ``{key: [(step, value)]}`` into one row per epoch.

    An epoch's metrics are all logged at the step at which it ended, so the rows are the steps
    of the ``train/epoch`` metric; a row holds ``step`` and every key logged at that step (the
    last value if one was logged twice). Keys logged per step (``train/lr``) must not be passed
    in.
    """
    steps = sorted({s for s, _ in histories.get("train/epoch", ())})
    by_key = {k: dict(v) for k, v in histories.items()}
    return [{"step": float(s), **{k: d[s] for k, d in by_key.items() if s in d}}
            for s in steps]


def metric_names(logged: Mapping[str, float]) -> dict[str, str]:
    """``{name: key it is stored under}`` of a run whose latest metrics are ``logged``: the
    current names, or :data:`LEGACY_METRICS`' for a run written before them."""
    legacy = "train/epoch" not in logged and "epoch" in logged
    return {k: LEGACY_METRICS.get(k, k) if legacy else k
            for k in (*EPOCH_KEYS, "train/loss", "train/lr", "gns/b_simple")}


def config_fingerprint(params: Mapping[str, str]) -> str:
    """sha256 of the params that define what is trained (the world's ``dist.*`` but the device
    type, seed and logging excluded; the plan's and the net's derived ``plan.*``/``net.*``
    follow from the rest and the world)."""
    kept = sorted((k, v) for k, v in params.items() if k not in _NOT_CONFIG
                  and not k.startswith(("tracking.", "plan.", "net.", "dist.")))
    # a CPU run of one unit logs no device type (it takes effect only when the store sums)
    kept.append(("dist.device_type", params.get("dist.device_type", "cpu")))
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()


@dataclass(frozen=True)
class RunData:
    """One run of a sweep as read from MLflow (plain data).

    Attributes:
        rows: per-epoch metrics (:func:`epoch_rows`).
        lr: ``[(step, lr)]`` as logged (every ``log_every`` steps and at each epoch end).
    """

    run_id: str
    label: str
    seed: int
    status: str = "FINISHED"
    start_time: int = 0
    workers: int | None = None  # processes (param ``plan.workers``)
    devices: int = 1            # per process (``plan.devices_per_worker``)
    simulated: int = 1          # workers simulated per process (``plan.simulated_workers``)
    global_batch: int | None = None
    peak_lr: float | None = None
    config_hash: str = ""
    fingerprint: str = ""
    rows: tuple[Mapping[str, float], ...] = ()
    lr: tuple[tuple[int, float], ...] = ()
    gns: tuple[tuple[int, float], ...] = ()  # (step, gns/b_simple) when the run measured it
    loss: tuple[tuple[int, float], ...] = ()  # (step, train/loss) as logged
    sweep_target: str = ""  # the sweep's target (JSON tag), see mxlarge.reporting.study
    commit: str = ""  # the git commit the run was made at (tag ``git_commit``)
    diverged: str = ""  # a FAILED run stopped by divergence: the message (tag ``diverged``)


def world_shape(run: RunData) -> tuple[int, int, int] | None:
    """``(processes, devices, simulated)`` of ``run``; None when its processes are unknown."""
    return None if run.workers is None else (run.workers, run.devices, run.simulated)


def by_label(runs: Sequence[RunData]) -> dict[str, list[RunData]]:
    """``{label: its runs}``, labels and runs in the order given."""
    out: dict[str, list[RunData]] = {}
    for r in runs:
        out.setdefault(r.label, []).append(r)
    return out


def select_runs(runs: Sequence[RunData]) -> tuple[list[RunData], list[str]]:
    """The newest FINISHED run per (label, seed), and notes on every run left out.

    A cell re-run after a failure, or with a changed config, leaves older runs behind; they
    are named in the notes rather than silently averaged in.
    """
    used: dict[tuple[str, int], RunData] = {}
    for r in sorted(runs, key=lambda r: -r.start_time):
        if r.status == "FINISHED" and (r.label, r.seed) not in used:
            used[(r.label, r.seed)] = r
    notes = []
    diverged = {r.run_id for r in diverged_runs(runs)}
    for r in sorted(runs, key=lambda r: (r.label, r.seed, r.start_time)):
        if used.get((r.label, r.seed)) is r:
            continue
        why = ("superseded by a newer FINISHED run" if (r.label, r.seed) in used
               else f"diverged ({r.diverged}): in the study a run that never reaches the "
                    "target, left out of the final-error numbers" if r.run_id in diverged
               else "no FINISHED run for this seed: left out of every number")
        notes.append(f"run {r.run_id[:8]} ({r.label}, seed {r.seed}) is {r.status}: {why}")
    ordered = sorted(used.values(), key=lambda r: r.start_time)
    return ordered, notes


def diverged_runs(runs: Sequence[RunData]) -> list[RunData]:
    """Per (label, seed) without a FINISHED run, the newest run that diverged (tag
    ``diverged``): a result of its configuration (it never reaches the target), not a crash."""
    finished = {(r.label, r.seed) for r in runs if r.status == "FINISHED"}
    newest: dict[tuple[str, int], RunData] = {}
    for r in sorted(runs, key=lambda r: -r.start_time):
        if (r.label, r.seed) not in finished and (r.label, r.seed) not in newest:
            newest[(r.label, r.seed)] = r
    return sorted((r for r in newest.values() if r.diverged), key=lambda r: r.start_time)
