"""Exact checkpoints at epoch boundaries, and resuming from them.

A checkpoint is a directory ``<checkpoint_dir>/epoch-0004/`` holding only MXNet NDArray files
and JSON (never pickle: a checkpoint from elsewhere must not run code):

* ``model.params``: the weights (identical on every rank) with the ``bn_stats`` statistics,
  loadable by ``net.load_parameters``;
* ``bn-<u>.nd``: each gradient contributor's own BN running statistics (u = rank·devices +
  device, or rank·simulated + simulated worker), so that training continues with per-worker
  statistics, in any world of the same units (:func:`check_world`);
* ``momentum.nd``: the updater's momentum buffers (identical on every rank);
* ``meta.json``: step, completed epochs, seed, the world (worker processes, devices, simulated
  workers, per-unit batch: :class:`mxlarge.plan.World`), the resolved config and its SHA-256,
  the MLflow run id, and the SHA-256 of every file above.

Writing is atomic: every rank writes into ``.epoch-0004.tmp``, then (after a barrier) rank 0
writes ``meta.json`` last and renames the directory; a crash leaves no half checkpoint that
``latest`` could pick. For multi-host jobs ``checkpoint_dir`` must be on a shared filesystem.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from mxlarge.config import config_sha256, dump_yaml
from mxlarge.errors import InputError
from mxlarge.plan import World, same_math

FORMAT = 2


class CheckpointError(InputError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_world(path: Path, meta: dict[str, Any], world: World) -> None:
    """Resuming needs a world of the same math as the checkpoint's (:func:`mxlarge.plan.same_math`:
    the same units k and per-unit batch n): 2 workers resume as 1 worker × 2 simulated workers,
    unit u's BN statistics (``bn-<u>.nd``) going to the unit that reads u's shard.

    Raises:
        CheckpointError: another global batch or per-unit batch, with the reason (the LR
            schedule, the data shards and the per-worker BN statistics all depend on them).
    """
    saved = World(**meta["world"])
    if not same_math(saved, world):
        raise CheckpointError(
            f"{path}: written by {saved.describe()}, resuming with {world.describe()}: refused, "
            "because the global batch, the LR schedule, the data shards and the per-worker BN "
            "statistics all depend on it; resume with the same units (workers x devices x "
            "simulated workers) and data.batch_size")


def epoch_dir(root: str | Path, epoch: int) -> Path:
    return Path(root) / f"epoch-{epoch:04d}"


def complete(root: str | Path, since: float | None = None) -> list[Path]:
    """The complete checkpoints (those with ``meta.json``, written last) under ``root``, oldest
    epoch first; with ``since`` (epoch seconds) only those whose ``meta.json`` was written at
    or after it. The one search for checkpoints: ``latest``, retention and a restarted job's
    resume all use it."""
    root = Path(root)
    if not root.is_dir():
        return []
    metas = [(p, p / "meta.json") for p in sorted(root.glob("epoch-*"))]
    return [p for p, m in metas if m.is_file()
            and (since is None or os.stat(m).st_mtime >= since)]


def find_latest(root: str | Path, since: float | None = None) -> Path | None:
    """The newest complete checkpoint under ``root`` (written at or after ``since``, if given:
    one of this job, not a stale one of an earlier job in the same directory)."""
    done = complete(root, since)
    return done[-1] if done else None


def resolve(spec: str, root: str | Path) -> Path:
    """``latest`` or a path → a checkpoint directory, or a CheckpointError saying why not."""
    if spec == "latest":
        found = find_latest(root)
        if found is None:
            raise CheckpointError(f"--resume latest: no complete checkpoint under '{root}'")
        return found
    path = Path(spec)
    if path.is_file() and path.name == "meta.json":
        path = path.parent
    if not (path / "meta.json").is_file():
        raise CheckpointError(f"--resume {spec}: '{path}' is not a checkpoint directory "
                              "(no meta.json)")
    return path


def read_meta(path: Path) -> dict[str, Any]:
    """Reads and verifies a checkpoint: JSON well-formed, every file present with its hash."""
    meta_file = path / "meta.json"
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{meta_file}: unreadable checkpoint metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_file}: not an mxlarge checkpoint of format {FORMAT}")
    for name, digest in meta.get("files", {}).items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing from the checkpoint")
        actual = sha256(f)
        if actual != digest:
            raise CheckpointError(f"{f}: checksum mismatch (truncated or corrupted): expected "
                                  f"sha256 {digest[:12]}…, found {actual[:12]}…")
    return meta


def save(root: str | Path, *, epoch: int, step: int, rank: int, net: Any, trainer: Any,
         config: Any, world: World, run_id: str | None, keep_last: int) -> Path:
    """Writes checkpoint ``epoch`` (collective: every rank calls it)."""
    import mxnet as mx

    from mxlarge.bnstats import save_device_params

    final = epoch_dir(root, epoch)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    trainer.collectives.barrier()
    with trainer.bn.evaluation():
        if rank == 0:
            net.save_parameters(str(tmp / "model.params"))
    for unit, device in trainer.bn.each_unit():
        save_device_params(net, str(tmp / f"bn-{unit}.nd"), device, stats_only=True)
    if rank == 0:
        mx.nd.save(str(tmp / "momentum.nd"), trainer.state_arrays())
    trainer.collectives.barrier()
    if rank == 0:
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir())}
        meta = {"format": FORMAT, "epoch": epoch, "step": step, "seed": config.train.seed,
                "world": dataclasses.asdict(world),
                "config_sha256": config_sha256(config), "config": dump_yaml(config),
                "run_id": run_id, "files": files}
        (tmp / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
        os.replace(tmp / "meta.json.tmp", tmp / "meta.json")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _retain(Path(root), keep_last)
    trainer.collectives.barrier()
    return final


def _retain(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in complete(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def restore(path: Path, meta: dict[str, Any], *, net: Any, trainer: Any,
            world: World) -> None:
    """Loads weights, per-unit BN statistics and momentum into a freshly built run.

    Raises:
        CheckpointError: another world (:func:`check_world`) or another model (parameter
            names or shapes differ).
    """
    import mxnet as mx

    from mxlarge.bnstats import load_device_stats

    check_world(path, meta, world)
    params = net._collect_params_with_prefix()
    try:
        loaded = mx.nd.load(str(path / "model.params"))
    except mx.base.MXNetError as exc:
        raise CheckpointError(f"{path / 'model.params'}: unreadable ({exc})") from None
    missing = sorted(set(params) - set(loaded))
    extra = sorted(set(loaded) - set(params))
    if missing or extra:
        raise CheckpointError(f"{path / 'model.params'}: belongs to another model (missing "
                              f"{missing[:3]}, unexpected {extra[:3]})")
    for name, p in params.items():
        if tuple(loaded[name].shape) != tuple(p.shape):
            raise CheckpointError(f"{path / 'model.params'}: '{name}' has shape "
                                  f"{tuple(loaded[name].shape)}, this model has {tuple(p.shape)}"
                                  " (another model)")
    for name, p in params.items():
        for arr in p.list_data():
            loaded[name].copyto(arr)
    try:
        trainer.load_states(str(path / "momentum.nd"))
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    for unit, device in trainer.bn.each_unit():
        load_device_stats(net, str(path / f"bn-{unit}.nd"), device)
    mx.nd.waitall()
