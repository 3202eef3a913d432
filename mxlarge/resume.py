"""The smallest resume hook for your own Gluon loop, for ``--max-restarts`` and for resuming.

Under ``python -m mxlarge.launcher --max-restarts N -- python my_train.py`` a failed job is
started again as it was; a script that wants to continue rather than start over saves with
:func:`save` and starts with :func:`restore`::

    start = mxlarge.resume.restore("ckpt", net, trainer)   # 0 when there is no checkpoint yet
    for step in range(start, total_steps):
        x, y = batch(step)                                  # the data of step `step`
        ...
        trainer.step(x.shape[0], step)
        if (step + 1) % 100 == 0:
            mxlarge.resume.save("ckpt", step + 1, net, trainer)

Both are collective (every worker calls them, at the same step). A checkpoint is a directory
``step-00000100`` holding each unit's parameters (``params-<u>.nd``, with that unit's own BN
statistics; a unit is a worker of the declared world, :meth:`mxlarge.Trainer.units`), the
momentum buffers and ``step.json``, written to a temporary directory and renamed, so a crash
mid-save leaves the previous one intact; the last two are kept. Only MXNet NDArray files and
JSON. The directory must be shared by every host. One device per worker. A checkpoint
restores into any world of the same units: an ``--elastic`` restart's 1 worker × 2
simulated workers reads the 2 workers' files (``mxlarge train`` / ``launch`` checkpoints
cover several devices too: :mod:`mxlarge.checkpoint`).
"""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEEP = 2


def _complete(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("step-*") if (p / "step.json").is_file())


def save(directory: str | Path, step: int, net: Any, trainer: Any) -> Path:
    """Saves the state after ``step`` updates (collective); returns the checkpoint directory."""
    directory = Path(directory)
    final = directory / f"step-{step:08d}"
    tmp = directory / f".step-{step:08d}.tmp"
    rank = trainer.rank
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    trainer.collectives.barrier()
    for unit in _units(trainer):
        net.save_parameters(str(tmp / f"params-{unit}.nd"))
    if rank == 0:
        trainer.save_states(str(tmp / "momentum.nd"))
    trainer.collectives.barrier()
    if rank == 0:
        (tmp / "step.json").write_text(json.dumps({"step": step,
                                                   "units": trainer.num_units}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in _complete(directory)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    trainer.collectives.barrier()
    return final


def restore(directory: str | Path, net: Any, trainer: Any) -> int:
    """Loads the newest complete checkpoint under ``directory``; returns its step (0 if none).

    Raises:
        ValueError: the checkpoint was written by another number of units (workers ·
            simulated workers).
    """
    found = _complete(Path(directory))
    if not found:
        return 0
    path = found[-1]
    meta = json.loads((path / "step.json").read_text())
    units = meta.get("units", meta.get("workers"))
    if units != trainer.num_units:
        raise ValueError(f"{path}: written by {units} worker(s), this job has "
                         f"{trainer.num_units} (workers x simulated workers)")
    for unit in _units(trainer):
        net.load_parameters(str(path / f"params-{unit}.nd"))
    trainer.load_states(str(path / "momentum.nd"))
    return int(meta["step"])


def _units(trainer: Any) -> Iterator[int]:
    """Each unit of this process, with its own BN statistics in place while it is
    current (:meth:`mxlarge.Trainer.units`)."""
    if trainer.num_devices > 1:
        raise ValueError("mxlarge.resume: one device per worker (several: mxlarge train)")
    for unit, _ in trainer.units():
        yield unit
