"""Exact checkpoints at epoch boundaries, and resuming from them.

A checkpoint is a directory ``<checkpoint_dir>/epoch-0004/`` holding only MXNet NDArray files
and JSON (never pickle: a checkpoint from elsewhere must not run code):

* ``model.params``: the weights (identical on every rank) with the ``bn_stats`` statistics,
  loadable by ``net.load_parameters``;
* ``bn-<u>.nd``: each gradient contributor's own BN running statistics (u = rank·devices +
  device, or the virtual worker), so that training continues with per-worker statistics;
* ``momentum.nd``: the updater's momentum buffers (identical on every rank);
* ``meta.json``: step, completed epochs, seed, layout (workers, devices, simulated workers),
  the resolved config and its SHA-256, the MLflow run id, and the SHA-256 of every file above.

Writing is atomic: every rank writes into ``.epoch-0004.tmp``, then (after a barrier) rank 0
writes ``meta.json`` last and renames the directory; a crash leaves no half checkpoint that
``latest`` could pick. For multi-host jobs ``checkpoint_dir`` must be on a shared filesystem.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the problem."""

    exit_code = 2


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Layout:
    workers: int
    devices: int
    simulated_workers: int

    @property
    def units(self) -> int:
        return self.workers * self.devices * self.simulated_workers


def epoch_dir(root: str | Path, epoch: int) -> Path:
    return Path(root) / f"epoch-{epoch:04d}"


def find_latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint (one with ``meta.json``) under ``root``."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("epoch-*") if (p / "meta.json").is_file())
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
         config: Any, seed: int, layout: Layout, run_id: str | None, keep_last: int) -> Path:
    """Writes checkpoint ``epoch`` (collective: every rank calls it)."""
    import mxnet as mx

    from mxlarge.config import config_sha256, dump_yaml
    from mxlarge.loop import save_device_params

    final = epoch_dir(root, epoch)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    trainer.store.barrier()
    with trainer.evaluation_stats():
        if rank == 0:
            net.save_parameters(str(tmp / "model.params"))
    for unit, device in trainer.each_unit():
        save_device_params(net, str(tmp / f"bn-{unit}.nd"), device, stats_only=True)
    if rank == 0:
        mx.nd.save(str(tmp / "momentum.nd"), trainer.state_arrays())
    trainer.store.barrier()
    if rank == 0:
        files = {p.name: sha256(p) for p in sorted(tmp.iterdir())}
        meta = {"format": FORMAT, "epoch": epoch, "step": step, "seed": seed,
                "layout": {"workers": layout.workers, "devices": layout.devices,
                           "simulated_workers": layout.simulated_workers},
                "config_sha256": config_sha256(config), "config": dump_yaml(config),
                "run_id": run_id, "files": files}
        (tmp / "meta.json.tmp").write_text(json.dumps(meta, indent=1))
        os.replace(tmp / "meta.json.tmp", tmp / "meta.json")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _retain(Path(root), keep_last)
    trainer.store.barrier()
    return final


def _retain(root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    done = sorted(p for p in root.glob("epoch-*") if (p / "meta.json").is_file())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def restore(path: Path, meta: dict[str, Any], *, net: Any, trainer: Any,
            layout: Layout) -> None:
    """Loads weights, per-unit BN statistics and momentum into a freshly built run.

    Raises:
        CheckpointError: another layout (the LR schedule, data order and BN statistics all
            depend on it) or another model (parameter names or shapes differ).
    """
    import mxnet as mx

    saved = Layout(**meta["layout"])
    if saved != layout:
        raise CheckpointError(
            f"{path}: written by {saved.workers} worker(s) x {saved.devices} device(s) x "
            f"{saved.simulated_workers} simulated, resuming with {layout.workers} x "
            f"{layout.devices} x {layout.simulated_workers}: refused, because the global batch, "
            "the LR schedule, the data shards and the per-worker BN statistics all depend on "
            "the layout; resume with the same -n/dist.devices/dist.simulate_workers")
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
    for unit, device in trainer.each_unit():
        _load_stats(params, mx.nd.load(str(path / f"bn-{unit}.nd")), device)
    mx.nd.waitall()


def _load_stats(params: dict, stats: dict, device: int) -> None:
    for name, value in stats.items():
        value.copyto(params[name].list_data()[device])
