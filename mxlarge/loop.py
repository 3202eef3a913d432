"""A small training loop with hooks (detectron2-style), owning the only step counter.

``before_train`` / ``after_step`` / ``after_epoch`` / ``after_train`` run inside try/finally, so
``after_train`` always runs and is told whether training failed. Tracking, evaluation, timing
and progress are hooks; hooks that only rank 0 needs are simply not registered elsewhere.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
from mxnet import autograd

from mxlarge.errors import DivergenceError


class Hook:
    """Base class: override what you need. ``loop.step`` is the number of updates applied."""

    def before_train(self, loop: "TrainLoop") -> None: ...

    def after_step(self, loop: "TrainLoop", out: "StepOutput") -> None: ...

    def after_epoch(self, loop: "TrainLoop", epoch: int, metrics: dict[str, float]) -> None: ...

    def after_train(self, loop: "TrainLoop", error: BaseException | None) -> None: ...


@dataclass
class StepOutput:
    step: int               # the update just applied (0-based)
    epoch: int
    lr: float
    loss: mx.nd.NDArray     # per-sample losses of this worker's batch (lazy: read only to log)
    images: int             # images this worker processed
    # per-step metrics for trackers: the noise scale on measuring steps, and whatever hooks
    # registered earlier add (the training loss on logging steps)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainLoop:
    """Runs epochs of ``trainer`` steps over ``data``.

    Attributes:
        step: the one step counter; hooks and the trainer read it, only the loop advances it.
        epoch: current epoch.
        history: per-epoch metrics appended by hooks (for plots and reports).
    """

    net: mx.gluon.Block
    trainer: Any
    train_source: Any
    loss_fn: Callable
    epochs: int
    ctx: list = field(default_factory=lambda: [mx.cpu()])
    hooks: list[Hook] = field(default_factory=list)
    max_steps: int | None = None
    gns: Any = None          # a mxlarge.gns.NoiseScale, or None
    gns_every: int = 0
    step: int = 0
    epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)

    def train_step(self, data: mx.nd.NDArray, label: mx.nd.NDArray) -> StepOutput:
        """Forward/backward on each device's (or virtual worker's) slice, one synchronised update.

        With K simulated workers the batch holds K consecutive slices of n images; each runs
        under its own BN statistics and the gradients accumulate, exactly as K real workers'
        gradients are summed by the servers.
        """
        t = self.trainer
        measure = (self.gns is not None and self.gns_every > 0
                   and self.step % self.gns_every == 0)
        small: list[float] = []  # |g|² of each small-batch gradient (sums, not yet normalised)
        k = t.simulated_workers
        if k == 1:
            xs = mx.gluon.utils.split_and_load(data, self.ctx, even_split=True)
            ys = mx.gluon.utils.split_and_load(label, self.ctx, even_split=True)
            with autograd.record():
                losses = [self.loss_fn(self.net(x), y) for x, y in zip(xs, ys)]
            autograd.backward(losses)
            if measure:
                small = [t.grad_sq(d) for d in range(t.num_devices)]
            loss = losses[0]
        else:
            t.zero_grads()
            n = data.shape[0] // k
            parts = []
            for j in range(k):
                x, y = data[j * n:(j + 1) * n], label[j * n:(j + 1) * n]
                before = t.grad_copies() if measure else None
                with t.worker_stats(j):
                    with autograd.record():
                        part = self.loss_fn(self.net(x), y)
                    part.backward()
                if measure:
                    small.append(t.grad_sq(0, minus=before))
                parts.append(part)
            loss = mx.nd.concat(*parts, dim=0)
        t.allreduce_grads()
        metrics: dict[str, float] = {}
        if measure:
            n_small = data.shape[0] // (t.num_devices * k)
            b_big = n_small * t.world_size
            total, count = t.store.sum_scalars([sum(small), len(small)])
            sq_small = total / count / n_small ** 2
            sq_big = t.grad_sq(0) / b_big ** 2
            metrics.update(self.gns.update(sq_small, sq_big))
        lr = t.learning_rate(self.step)
        t.update(data.shape[0], self.step)
        return StepOutput(self.step, self.epoch, lr, loss, data.shape[0], metrics)

    def run(self, start_epoch: int = 0) -> None:
        error: BaseException | None = None
        try:
            for h in self.hooks:
                h.before_train(self)
            for epoch in range(start_epoch, self.epochs):
                self.epoch = epoch
                for data, label in self.train_source.epoch(epoch):
                    out = self.train_step(data, label)
                    self.step += 1
                    for h in self.hooks:
                        h.after_step(self, out)
                    if self.max_steps is not None and self.step >= self.max_steps:
                        break
                metrics: dict[str, float] = {"epoch": float(epoch + 1)}
                with self.trainer.busy("evaluating/checkpointing"):
                    for h in self.hooks:
                        h.after_epoch(self, epoch, metrics)
                self.history.append(metrics)
                if self.max_steps is not None and self.step >= self.max_steps:
                    break
        except BaseException as exc:
            error = exc
            raise
        finally:
            # rank 0 may upload artifacts for a while, the others wait in ps-lite's exit barrier
            with self.trainer.busy("finishing"):
                for h in self.hooks:
                    h.after_train(self, error)


class LossHook(Hook):
    """Reads the training loss every ``every`` steps; the divergence guard.

    Stops the run (``DivergenceError``) when the loss or the gradient norm is not finite, or the
    loss exceeds ``factor`` × its first value read in this process (0 disables that rule): the
    classic warmup explosion, caught before more compute is spent.
    """

    def __init__(self, every: int, factor: float = 0.0):
        self.every = every
        self.factor = factor
        self.early: float | None = None
        self.sum = 0.0
        self.count = 0

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if (out.step + 1) % self.every and out.step + 1 != loop.max_steps:
            return
        loss = float(out.loss.mean().asscalar())
        grad_sq = loop.trainer.grad_sq(0)
        where = (f"at step {out.step} (epoch {out.epoch + 1}, lr {out.lr:.6g})")
        if not math.isfinite(loss) or not math.isfinite(grad_sq):
            raise DivergenceError(f"training diverged {where}: loss {loss}, gradient norm "
                                  f"{math.sqrt(grad_sq) if grad_sq >= 0 else grad_sq}")
        if self.early is None:
            self.early = loss
        elif self.factor and loss > self.factor * self.early:
            raise DivergenceError(f"training diverged {where}: loss {loss:.4g} is above "
                                  f"{self.factor:g} x its early value {self.early:.4g}")
        self.sum += loss
        self.count += 1
        out.metrics["train_loss_step"] = loss

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if self.count:
            metrics["train_loss"] = self.sum / self.count
        metrics["lr"] = loop.trainer.learning_rate(max(loop.step - 1, 0))
        self.sum, self.count = 0.0, 0


class TimerHook(Hook):
    """Images per second of this worker over each epoch's training steps."""

    def __init__(self) -> None:
        self.start = 0.0
        self.images = 0
        self.train_seconds = 0.0  # cumulative, evaluation excluded

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if self.images == 0:
            self.start = time.perf_counter()
        self.images += out.images

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        mx.nd.waitall()
        elapsed = time.perf_counter() - self.start
        self.train_seconds += elapsed
        metrics["images_per_sec"] = self.images / elapsed if elapsed > 0 else 0.0
        metrics["train_seconds"] = self.train_seconds
        metrics["images_per_sec_global"] = metrics["images_per_sec"] * loop.trainer.num_workers
        self.images = 0


class EvalHook(Hook):
    """Top-1/top-5 validation error every ``every`` epochs, sharded over the ranks.

    Rank r evaluates the validation batches i with i mod k = r under the ``bn_stats``
    statistics; the counts are summed through the store, so every rank gets the global numbers.
    """

    def __init__(self, val_source: Any, batch_size: int, every: int = 1):
        self.val = val_source
        self.batch_size = batch_size
        self.every = every

    def evaluate(self, loop: TrainLoop) -> dict[str, float]:
        trainer = loop.trainer
        rank, k = trainer.rank, trainer.num_workers
        top1 = top5 = count = 0.0
        loss_sum = 0.0
        with trainer.evaluation_stats():
            for i, (data, label) in enumerate(self.val.batches(self.batch_size)):
                if i % k != rank:
                    continue
                out = loop.net(data.as_in_context(loop.ctx[0]))
                lab = label.as_in_context(loop.ctx[0])
                loss_sum += float(loop.loss_fn(out, lab).sum().asscalar())
                ranked = mx.nd.topk(out, k=min(5, out.shape[1]), ret_typ="indices")
                hit = ranked == lab.reshape((-1, 1)).astype(ranked.dtype)
                top1 += float(hit[:, 0].sum().asscalar())
                top5 += float(hit.sum().asscalar())
                count += data.shape[0]
        top1, top5, count, loss_sum = trainer.store.sum_scalars([top1, top5, count, loss_sum])
        return {"val_error_top1": 1 - top1 / count, "val_error_top5": 1 - top5 / count,
                "val_accuracy": top1 / count, "val_loss": loss_sum / count}

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if (epoch + 1) % self.every == 0 or epoch + 1 == loop.epochs:
            metrics.update(self.evaluate(loop))


class ReplicaCheckHook(Hook):
    """Compares a weight checksum with rank 0's every ``every`` steps (dist only)."""

    def __init__(self, every: int):
        self.every = every

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if self.every and (out.step + 1) % self.every == 0:
            loop.trainer.check_replicas(out.step)


class FinalParamsHook(Hook):
    """After a successful run, saves the parameters with the ``bn_stats`` statistics.

    Registered on every rank because choosing the statistics is collective. Rank 0 writes
    ``self.path`` (a temporary file for MLflow); with ``template`` every rank also writes
    ``template.format(rank=r)`` and, with its own BN statistics, that path + ``.local``.
    """

    def __init__(self, rank: int, template: str | None, tmpdir: str | None):
        self.rank = rank
        self.template = template
        self.tmpdir = tmpdir
        self.path: str | None = None

    def after_train(self, loop: TrainLoop, error: BaseException | None) -> None:
        if error is not None:
            return
        trainer = loop.trainer
        # Every gradient contributor (virtual worker, or device of a worker) writes the files
        # its one-device real counterpart would (see Trainer.each_unit).
        with trainer.evaluation_stats():
            if self.rank == 0 and self.tmpdir is not None:
                self.path = f"{self.tmpdir}/final.params"
                loop.net.save_parameters(self.path)
            if self.template:
                for unit in trainer.unit_ids():
                    loop.net.save_parameters(self.template.format(rank=unit))
        if self.template:
            for unit, device in trainer.each_unit():
                save_device_params(loop.net, self.template.format(rank=unit) + ".local", device)


def save_device_params(net: mx.gluon.Block, path: str, device: int,
                       stats_only: bool = False) -> None:
    """Like ``save_parameters``, but one device's copies (Gluon's own save averages devices).

    ``stats_only`` keeps just the local statistics (``grad_req == 'null'``).
    """
    mx.nd.waitall()
    arrays = {name: p.list_data()[device]
              for name, p in net._collect_params_with_prefix().items()
              if not stats_only or p.grad_req == "null"}
    mx.nd.save(path, arrays)


class CheckpointHook(Hook):
    """Writes an exact checkpoint every ``every`` epochs and after the last (every rank)."""

    def __init__(self, root: str, every: int, keep_last: int, config: Any, seed: int,
                 layout: Any, run_id: Any, rank: int):
        self.root, self.every, self.keep_last = root, every, keep_last
        self.config, self.seed, self.layout = config, seed, layout
        self.run_id = run_id  # a callable: the MLflow run may only exist after before_train
        self.rank = rank

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        done = epoch + 1
        if done % self.every and done != loop.epochs:
            return
        from mxlarge import checkpoint
        checkpoint.save(self.root, epoch=done, step=loop.step, rank=self.rank, net=loop.net,
                        trainer=loop.trainer, config=self.config, seed=self.seed,
                        layout=self.layout, run_id=self.run_id(), keep_last=self.keep_last)


class ProgressHook(Hook):
    """A tqdm bar per epoch with loss and LR (rank 0)."""

    def __init__(self, steps_per_epoch: int, epochs: int):
        self.steps = steps_per_epoch
        self.epochs = epochs
        self.bar = None

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        from tqdm.auto import tqdm
        if self.bar is None:
            # disable=None: no bar when not on a terminal (a launched worker's prefixed
            # output would be one long line of carriage returns); the epoch line remains
            self.bar = tqdm(total=self.steps, desc=f"epoch {out.epoch + 1}/{self.epochs}",
                            leave=False, dynamic_ncols=True, disable=None)
        self.bar.update(1)

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        shown = {k: metrics[k] for k in ("train_loss", "val_accuracy", "images_per_sec", "lr")
                 if k in metrics}
        print(f"epoch {epoch + 1}/{self.epochs} " + " ".join(
            f"{k}={v:.4g}" for k, v in shown.items()), flush=True)

    def after_train(self, loop: TrainLoop, error: BaseException | None) -> None:
        if self.bar is not None:
            self.bar.close()
