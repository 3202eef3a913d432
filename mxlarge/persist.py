"""The hooks of the ``PERSIST`` stage (:mod:`mxlarge.hooks`): what a run keeps on disk, written
before anything reports it. :class:`FinalParamsHook` saves the final parameters (and exports
a hybridized net) after training; :class:`CheckpointHook` writes exact checkpoints
(:mod:`mxlarge.checkpoint`) at epoch ends. Both run after the epoch's or the run's steps,
never inside one (the loop itself is :mod:`mxlarge.loop`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from mxlarge import hooks as H
from mxlarge.bnstats import save_device_params
from mxlarge.errors import StopRequested
from mxlarge.hooks import Hook
from mxlarge.loop import TrainLoop


class FinalParamsHook(Hook):
    """After a successful run, saves the parameters with the ``bn_stats`` statistics;
    after a stop the launcher asked for (:class:`~mxlarge.errors.StopRequested`),
    rank 0 saves them as they are, with its own BN statistics.

    Registered on every rank because choosing the statistics is collective. Rank 0
    writes ``tmpdir/final.params`` and publishes it as
    ``loop.artifacts['final_params']`` (a hybridized net is also exported,
    ``net.export``, to ``tmpdir/model/`` as ``loop.artifacts['model']``: symbol +
    parameters anyone can load without mxlarge's code); with ``template`` every unit
    also writes ``template.format(rank=unit)`` and, with its own BN statistics, that
    path + ``.local`` (units: :mod:`mxlarge.bnstats`).
    """

    stage = H.PERSIST

    def __init__(self, rank: int, template: str | None, tmpdir: str | None):
        self.rank = rank
        self.template = template
        self.tmpdir = tmpdir

    def after_train(self, loop: TrainLoop, error: BaseException | None) -> None:
        stopped = isinstance(error, StopRequested)
        if error is not None and not (stopped and self.rank == 0):
            return
        bn = loop.trainer.bn
        # stopped, rank 0 is alone: the shared BN statistics are collective, its own are kept
        with contextlib.nullcontext() if stopped else bn.evaluation():
            if self.rank == 0 and self.tmpdir is not None:
                path = f"{self.tmpdir}/final.params"
                loop.net.save_parameters(path)
                loop.artifacts["final_params"] = path
                if getattr(loop.net, "_active", False):  # hybridized: a symbol to export
                    if getattr(loop.net, "_cached_graph", ()):
                        model = Path(self.tmpdir) / "model"
                        model.mkdir(exist_ok=True)
                        loop.net.export(str(model / "model"))
                        loop.artifacts["model"] = str(model)
                    else:  # resumed after the last step: no forward ran, Gluon has no graph
                        print("mxlarge: no steps left after the resume: the model symbol is "
                              "not exported (the final parameters are)", flush=True)
            if self.template and not stopped:
                for unit in bn.unit_ids():
                    loop.net.save_parameters(self.template.format(rank=unit))
        if self.template and not stopped:
            for unit, device in bn.each_unit():
                save_device_params(loop.net, self.template.format(rank=unit) + ".local", device)


class CheckpointHook(Hook):
    """Writes an exact checkpoint every ``every`` epochs and after the last (every rank)."""

    stage = H.PERSIST

    def __init__(self, root: str, every: int, keep_last: int, config: Any, world: Any,
                 run_id: str | None, rank: int):
        self.root = root
        self.every = every
        self.keep_last = keep_last
        self.config = config
        self.world = world
        self.run_id = run_id
        self.rank = rank

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        done = epoch + 1
        if done % self.every and done != loop.epochs:
            return
        from mxlarge import checkpoint
        checkpoint.save(self.root, epoch=done, step=loop.step, rank=self.rank, net=loop.net,
                        trainer=loop.trainer, config=self.config, world=self.world,
                        run_id=self.run_id, keep_last=self.keep_last)
