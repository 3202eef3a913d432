"""A small training loop with hooks (detectron2-style), owning the only step counter.

``before_train`` / ``after_step`` / ``after_epoch`` / ``after_train`` run inside
try/finally, so ``after_train`` always runs and is told whether training failed.
Tracking, evaluation, timing and progress are hooks; hooks that only rank 0 needs are
simply not registered elsewhere. The hook contract, the data hooks exchange and their
order are in :mod:`mxlarge.hooks`; the hooks that keep files (final parameters,
checkpoints) are in :mod:`mxlarge.persist`.
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mxnet as mx
from mxnet import autograd

from mxlarge import hooks as H
from mxlarge.errors import DivergenceError
from mxlarge.gns import sum_sq as gns_sum_sq
from mxlarge.hooks import Hook, StepOutput
from mxlarge.observers import DataWait


@dataclass
class TrainLoop:
    """Runs epochs of ``trainer`` steps over ``data``.

    Attributes:
        step: the one step counter; hooks and the trainer read it, only the loop advances it.
        epoch: current epoch.
        history: per-epoch metrics appended by hooks (for plots and reports).
        artifacts: files hooks wrote for others to report (keys in :mod:`mxlarge.hooks`).
        hooks: run in the order of their :attr:`~mxlarge.hooks.Hook.stage`.
    """

    net: mx.gluon.Block
    trainer: Any
    train_source: Any
    loss_fn: Callable
    epochs: int
    ctx: list = field(default_factory=lambda: [mx.cpu()])
    hooks: list[Hook] = field(default_factory=list)
    max_steps: int | None = None
    gns: Any = None          # a mxlarge.gns.NoiseScale (knows B_small and B_big), or None
    gns_every: int = 0
    amp: bool = False        # the trainer is under mxnet.contrib.amp (amp.init_trainer)
    step: int = 0
    epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)
    _data_wait: float = 0.0  # seconds the current step waited for its batch
    _data_began: float = 0.0  # when it began to wait (time.time(): the timeline's clock)

    def __post_init__(self) -> None:
        self.hooks = sorted(self.hooks, key=lambda h: h.stage)  # stable: equal stages keep order

    def train_step(self, data: mx.nd.NDArray, label: mx.nd.NDArray) -> StepOutput:
        """Forward/backward on each device's (or virtual worker's) slice, one
        synchronised update.

        With K simulated workers the batch holds K consecutive slices of n images; each
        runs under its own BN statistics and the gradients accumulate, exactly as K real
        workers' gradients are summed by the servers. The step is the Trainer's one
        sequence (:mod:`mxlarge.observers`): begun here with the wait for the batch, the
        forward and backward of each slice told to its observers, then
        ``allreduce_grads()``, the gradient noise scale on measuring steps, and
        ``update()``.
        """
        t = self.trainer
        observers = t.observers
        measure = (self.gns is not None and self.gns_every > 0
                   and self.step % self.gns_every == 0)
        step = t.begin_step(self.step, DataWait(self._data_began, self._data_wait))
        small: list[float] = []  # |g|² of each small-batch gradient (sums, not yet normalised)
        k = t.simulated_workers
        if k == 1:
            xs = mx.gluon.utils.split_and_load(data, self.ctx, even_split=True)
            ys = mx.gluon.utils.split_and_load(label, self.ctx, even_split=True)
            with autograd.record():
                losses = [self.loss_fn(self.net(x), y) for x, y in zip(xs, ys)]
                scaled = self._scaled(losses)
            observers.forward_done(step, losses[0])
            autograd.backward(scaled)
            observers.backward_done(step, t.grads(0))
            if measure:
                small = [gns_sum_sq(t.grads(d)) for d in range(t.num_devices)]
            loss = losses[0]
        else:
            for g in t.grads(0):  # accumulated (grad_req='add') over the micro-batches
                g[:] = 0
            n = data.shape[0] // k
            parts = []
            for j in range(k):
                x = data[j * n:(j + 1) * n]
                y = label[j * n:(j + 1) * n]
                before = [g.copy() for g in t.grads(0)] if measure else None
                with t.bn.worker(j):
                    with autograd.record():
                        part = self.loss_fn(self.net(x), y)
                        scaled = self._scaled([part])
                    observers.forward_done(step, part, j)
                    autograd.backward(scaled)
                    observers.backward_done(step, t.grads(0), j)
                if measure:
                    small.append(gns_sum_sq(t.grads(0), minus=before))
                parts.append(part)
            loss = mx.nd.concat(*parts, dim=0)
        t.allreduce_grads()
        metrics: dict[str, float] = {}
        if measure:
            total, count = t.collectives.sum_scalars([sum(small), len(small)])
            sq_small = total / count / self.gns.b_small ** 2
            sq_big = gns_sum_sq(t.grads(0)) / self.gns.b_big ** 2
            metrics.update(self.gns.update(sq_small, sq_big))
        if self.amp:
            # Gluon's rule under AMP: a skipped step does not count, so the trainer's
            # own update count (not the batch count) is the schedule's step
            lr = t.lr_at(t.num_update)
            applied = t.update(data.shape[0])
        else:
            lr = t.lr_at(self.step)
            applied = t.update(data.shape[0], self.step)
        return StepOutput(self.step, self.epoch, lr, loss, data.shape[0], metrics,
                          skipped=not applied, sample=step.sample)

    def _scaled(self, losses: list[mx.nd.NDArray]) -> list[mx.nd.NDArray]:
        """The losses to differentiate (inside ``autograd.record()``): AMP's loss-scaled
        ones under AMP (which also sets the trainer's rescale to undo the scale)."""
        if not self.amp:
            return losses
        from mxnet.contrib import amp
        with amp.scale_loss(losses, self.trainer) as scaled:
            return scaled

    def run(self, start_epoch: int = 0) -> None:
        error: BaseException | None = None
        try:
            for h in self.hooks:
                h.before_train(self)
            for epoch in range(start_epoch, self.epochs):
                self.epoch = epoch
                batches = iter(self.train_source.epoch(epoch))
                while True:
                    t0 = time.perf_counter()
                    self._data_began = time.time()
                    batch = next(batches, None)
                    if batch is None:
                        break
                    self._data_wait = time.perf_counter() - t0
                    out = self.train_step(*batch)
                    self.step += 1
                    for h in self.hooks:
                        h.after_step(self, out)
                    if self.max_steps is not None and self.step >= self.max_steps:
                        break
                metrics: dict[str, float] = {"train/epoch": float(epoch + 1)}
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
            # rank 0 may upload artifacts for a while, the others wait in ps-lite's exit
            # barrier
            with self.trainer.busy("finishing"):
                for h in self.hooks:
                    h.after_train(self, error)


class LossHook(Hook):
    """Reads the training loss every ``every`` steps and at each epoch's last step
    (every ``steps_per_epoch`` steps from where this process started; 0: unknown) and
    the run's last (``loop.max_steps``); the divergence guard.

    Stops the run (``DivergenceError``) when the loss or the gradient norm is not
    finite, or the loss exceeds ``factor`` × its first value read in this process (0
    disables that rule): the classic warmup explosion, caught before more compute is
    spent.
    """

    stage = H.MEASURE

    def __init__(self, every: int, factor: float = 0.0, steps_per_epoch: int = 0):
        self.every = every
        self.factor = factor
        self.steps_per_epoch = steps_per_epoch
        self.start = 0  # the step this process started from: a checkpoint's epoch boundary
        self.early: float | None = None
        self.sum = 0.0
        self.count = 0

    def before_train(self, loop: TrainLoop) -> None:
        self.start = loop.step

    def _reads(self, loop: TrainLoop, done: int) -> bool:
        epoch_end = self.steps_per_epoch > 0 and (done - self.start) % self.steps_per_epoch == 0
        return done % self.every == 0 or done == loop.max_steps or epoch_end

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if not self._reads(loop, out.step + 1):
            return
        loss = float(out.loss.mean().asscalar())
        grad_sq = gns_sum_sq(loop.trainer.grads(0))
        where = (f"at step {out.step} (epoch {out.epoch + 1}, lr {out.lr:.6g})")
        # an AMP step skipped for overflow has non-finite gradients by definition
        if not math.isfinite(loss) or not (out.skipped or math.isfinite(grad_sq)):
            raise DivergenceError(f"training diverged {where}: loss {loss}, gradient norm "
                                  f"{math.sqrt(grad_sq) if grad_sq >= 0 else grad_sq}")
        if self.early is None:
            self.early = loss
        elif self.factor and loss > self.factor * self.early:
            raise DivergenceError(f"training diverged {where}: loss {loss:.4g} is above "
                                  f"{self.factor:g} x its early value {self.early:.4g}")
        self.sum += loss
        self.count += 1
        out.metrics["train/loss"] = loss

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if self.count:
            metrics["train/loss"] = self.sum / self.count
        # the LR in force from this step on, as MLflow's train/lr and `show --lr-at`
        # read it
        metrics["train/lr"] = loop.trainer.lr_at(loop.step)
        self.sum = 0.0
        self.count = 0


class TimerHook(Hook):
    """Images per second over each epoch's training steps: the images of the steps after
    the epoch's first ÷ the time from the end of its first step to the end of its last
    (the first step, with its warm-up, and evaluation are left out;
    :class:`ProgressHook` shows the same measure). ``perf/images_per_sec`` = Σ over
    workers of each worker's own rate (a collective through the store's ``sum_scalars``,
    so registered on every rank), ``perf/images_per_sec_rank{r}`` = worker r's own rate
    (only with more than one worker: with one it equals the sum), ``perf/train_seconds``
    cumulative."""

    stage = H.MEASURE

    def __init__(self, steps_per_epoch: int = 0) -> None:
        self.steps_per_epoch = steps_per_epoch  # 0: unknown, the epoch ends at after_epoch
        self.begin = 0   # the step this process started from (a checkpoint's epoch boundary)
        self.start = 0.0
        self.end: float | None = None  # when the epoch's last step's work was done
        self.steps = 0   # this epoch's, the first included
        self.images = 0  # of this epoch's steps after the first
        self.first = 0   # of its first step (the rate of a one-step epoch)
        self.train_seconds = 0.0  # cumulative, evaluation excluded

    def before_train(self, loop: TrainLoop) -> None:
        self.begin = loop.step

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if self.steps == 0:
            mx.nd.waitall()  # its work done, not queued: the engine runs steps behind Python
            self.start = time.perf_counter()
            self.first = out.images
        else:
            self.images += out.images
        self.steps += 1
        done = out.step + 1
        if self.steps_per_epoch and (done - self.begin) % self.steps_per_epoch == 0:
            mx.nd.waitall()  # the epoch's last step: stop the clock before other hooks run
            self.end = time.perf_counter()

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        mx.nd.waitall()
        end = self.end if self.end is not None else time.perf_counter()
        elapsed = end - self.start
        self.train_seconds += elapsed
        images = self.images if self.steps > 1 else self.first
        own = images / elapsed if elapsed > 0 else 0.0
        metrics["perf/train_seconds"] = self.train_seconds
        metrics["perf/images_per_sec"] = loop.trainer.collectives.sum_scalars([own])[0]
        if loop.trainer.num_workers > 1:  # with one worker it is the total above
            metrics[f"perf/images_per_sec_rank{loop.trainer.rank}"] = own
        self.steps = 0
        self.images = 0
        self.end = None


class EvalHook(Hook):
    """Top-1/top-5 validation error every ``every`` epochs, sharded over the ranks.

    Rank r evaluates the validation batches i with i mod k = r under the ``bn_stats``
    statistics; the counts are summed through the store, so every rank gets the global
    numbers.
    """

    stage = H.EVALUATE

    def __init__(self, val_source: Any, batch_size: int, every: int = 1):
        self.val = val_source
        self.batch_size = batch_size
        self.every = every

    def evaluate(self, loop: TrainLoop) -> dict[str, float]:
        trainer = loop.trainer
        rank = trainer.rank
        k = trainer.num_workers
        top1 = 0.0
        top5 = 0.0
        count = 0.0
        loss_sum = 0.0
        with trainer.bn.evaluation():
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
        top1, top5, count, loss_sum = trainer.collectives.sum_scalars([top1, top5, count, loss_sum])
        return {"val/error_top1": 1 - top1 / count, "val/error_top5": 1 - top5 / count,
                "val/accuracy": top1 / count, "val/loss": loss_sum / count}

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if (epoch + 1) % self.every == 0 or epoch + 1 == loop.epochs:
            metrics.update(self.evaluate(loop))


class ReplicaCheckHook(Hook):
    """Compares a weight checksum with rank 0's every ``every`` steps (dist only)."""

    stage = H.CHECK

    def __init__(self, every: int):
        self.every = every

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if self.every and (out.step + 1) % self.every == 0:
            loop.trainer.check_replicas(out.step)


def _duration(seconds: float) -> str:
    """``1h02m03s`` / ``2m03s`` / ``3s``."""
    s = int(round(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m{s % 60:02d}s" if h else (f"{m}m{s % 60:02d}s" if m else f"{s}s")


class ProgressHook(Hook):
    """Where users look (rank 0): a progress line every ``every`` steps and one per
    epoch.

    The line is ``step N/TOTAL epoch E/EPOCHS loss=… lr=… images/s=… eta=…``: images/s
    is :class:`TimerHook`'s measure of the epoch so far, over all ranks (this rank's
    images × workers, every worker takes the same batch): the images of the epoch's
    steps after its first ÷ the time since its first step ended (none on a line at the
    first step), so at an epoch's last step it is that epoch's ``perf/images_per_sec``;
    ETA = remaining steps × seconds per step since the previous line (evaluation
    included). On a terminal a tqdm bar per epoch (``bar``) carries the same numbers
    instead, and nothing else writes carriage-return frames; in a pipe or a launched job
    (the launcher prefixes each line) only the lines are printed.
    """

    stage = H.REPORT

    def __init__(self, steps_per_epoch: int, epochs: int, total_steps: int, every: int,
                 bar: bool = True):
        self.steps = steps_per_epoch
        self.epochs = epochs
        self.total = total_steps
        self.every = every
        self.use_bar = bar and sys.stdout.isatty()
        self.bar: Any = None
        self.mark: tuple[float, int] | None = None  # (time, step) of the previous line
        self.epoch_mark: tuple[float, int] | None = None  # the end of this epoch's first step

    def before_train(self, loop: TrainLoop) -> None:
        self.mark = (time.perf_counter(), loop.step)

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        if self.use_bar and self.bar is None:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=self.steps, desc=f"epoch {out.epoch + 1}/{self.epochs}",
                            leave=False, dynamic_ncols=True)
        if self.bar is not None:
            self.bar.update(1)
        done = out.step + 1
        if self.epoch_mark is None:
            mx.nd.waitall()  # as TimerHook: the first step's work done
            self.epoch_mark = (time.perf_counter(), done)
        if done % self.every and done != self.total:
            return
        mx.nd.waitall()  # as TimerHook at the epoch's end: the steps' work done, not queued
        now = time.perf_counter()
        since, at = self.mark if self.mark is not None else (now, out.step)
        self.mark = (now, done)
        per_step = (now - since) / max(done - at, 1)
        fields = {}
        if "train/loss" in out.metrics:
            fields["loss"] = f"{out.metrics['train/loss']:.4g}"
        fields["lr"] = f"{out.lr:.4g}"
        first_end, first = self.epoch_mark
        if done > first and now > first_end:
            images = (done - first) * out.images * loop.trainer.num_workers
            fields["images/s"] = f"{images / (now - first_end):.1f}"
        if per_step > 0:
            fields["eta"] = _duration(per_step * (self.total - done))
        text = " ".join(f"{k}={v}" for k, v in fields.items())
        if self.bar is not None:
            self.bar.set_postfix_str(text)
        else:
            print(f"step {done}/{self.total} epoch {out.epoch + 1}/{self.epochs} {text}",
                  flush=True)

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        self.epoch_mark = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        shown = {name: metrics[k] for name, k in (
            ("train_loss", "train/loss"), ("val_accuracy", "val/accuracy"),
            ("images_per_sec", "perf/images_per_sec"), ("lr", "train/lr")) if k in metrics}
        print(f"epoch {epoch + 1}/{self.epochs} " + " ".join(
            f"{k}={v:.4g}" for k, v in shown.items()), flush=True)

    def after_train(self, loop: TrainLoop, error: BaseException | None) -> None:
        if self.bar is not None:
            self.bar.close()
