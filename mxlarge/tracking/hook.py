"""The loop's MLflow hooks: rank 0 logs the run (:class:`MLflowHook`), the other ranks their
own throughput (:class:`RankThroughputHook`)."""
from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mxlarge.config import Config, dump_yaml
from mxlarge.errors import StopRequested
from mxlarge.hooks import REPORT, Hook, StepOutput
from mxlarge.stats import final_error
from mxlarge.tracking.naming import takes_effect
from mxlarge.tracking.queries import metric_history
from mxlarge.tracking.run import RunHandle
from mxlarge.tracking.system import SAMPLED_BY, system_metrics

# draws a run's training curves: plot(history, path, title=...) writes a PNG to path
# (whoever builds the hook passes one, e.g. mxlarge.reporting.plots.plot_training_curves)
Plot = Callable[..., None]


def best_and_final(val_errors: Sequence[float]) -> dict[str, float]:
    """``val/best_accuracy`` = 1 − min error and ``val/final_error_pct`` = 100 × the median of
    the last 5 evaluations' error (:func:`mxlarge.stats.final_error`), of the evaluations so far.

    The final error in percent, as the console and the report print it; the unit is in its name
    because the other ``val/`` metrics are fractions."""
    return {"val/best_accuracy": 1 - min(val_errors),
            "val/final_error_pct": 100 * final_error(val_errors)}


class MLflowHook(Hook):
    """Rank 0's logging into the job's run: ``net.*`` params, the config artifact, metrics at
    their step, the training curves (drawn by ``plot`` if given), the model, the system metrics;
    tags ``failure`` and ``failed_step`` if training raised.

    At step s: ``train/lr`` = the LR of update s and ``train/samples`` = s × ``global_batch``
    (at step 0, every ``log_every`` steps, each epoch's end); ``val/best_accuracy`` and
    ``val/final_error_pct`` over every evaluation of the run (:func:`best_and_final`, a resumed
    run's earlier ones included), ``perf/images_per_sec_median`` over every epoch. ``example``:
    a float32 batch, the logged model's input example; ``launched``: the job's processes are
    those under this worker's parent. The rules: 'What a run holds' in docs/design/tracking.md.
    """

    stage = REPORT

    def __init__(self, cfg: Config, run: RunHandle, net_facts: dict[str, Any], log_every: int,
                 global_batch: int, example: Any = None, launched: bool = False,
                 plot: Plot | None = None):
        self.cfg = cfg
        self.run = run
        self.net_facts = net_facts
        self.log_every = log_every
        self.global_batch = global_batch
        self.example = example
        self.launched = launched
        self.plot = plot
        self.val_errors: list[float] = []
        self.throughputs: list[float] = []
        self.monitor: Any = None

    def _axis(self, loop: Any, step: int) -> dict[str, float]:
        return {"train/lr": loop.trainer.lr_at(step), "train/samples": step * self.global_batch}

    def before_train(self, loop: Any) -> None:
        import psutil

        self.run.log_params({f"net.{k}": v for k, v in self.net_facts.items()
                             if takes_effect(f"net.{k}", v, self.cfg)})
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(dump_yaml(self.cfg))
            self.run.log_artifacts([path])
        earlier = {s: v for s, v in metric_history(self.run.uri, self.run.run_id,
                                                   "val/error_top1") if s <= loop.step}
        self.val_errors = [earlier[s] for s in sorted(earlier)]  # a resumed run's evaluations
        self.throughputs = [v for s, v in metric_history(self.run.uri, self.run.run_id,
                                                         "perf/images_per_sec")
                            if s <= loop.step]
        if loop.step == 0:  # a resumed run logged its step at the end of the epoch before
            self.run.log_metrics(self._axis(loop, 0), 0)
        if self.run.tags().get(SAMPLED_BY) != "launcher":  # a local launcher samples the job
            me = psutil.Process()
            self.monitor = system_metrics(self.run, (me.parent() or me).pid if self.launched
                                          else me.pid)

    def after_step(self, loop: Any, out: StepOutput) -> None:
        metrics = dict(out.metrics)
        done = out.step + 1
        if done % self.log_every == 0:
            metrics.update(self._axis(loop, done))
        if metrics:
            self.run.log_metrics(metrics, done)

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        out = {k: v for k, v in metrics.items() if k not in ("train/loss", "train/lr")}
        if loop.step % self.log_every:  # else after_step logged them at this step
            out.update(self._axis(loop, loop.step))
        if "val/error_top1" in metrics:
            self.val_errors.append(metrics["val/error_top1"])
            out.update(best_and_final(self.val_errors))
        if "perf/images_per_sec" in metrics:
            self.throughputs.append(metrics["perf/images_per_sec"])
            out["perf/images_per_sec_median"] = statistics.median(self.throughputs)
        self.run.log_metrics(out, loop.step)

    def after_train(self, loop: Any, error: BaseException | None) -> None:
        try:
            if isinstance(error, StopRequested):  # the user's Ctrl-C: the run keeps what it has
                self.run.tag({"stopped_step": loop.step})
            elif error is not None:
                self.run.tag({"failure": f"{type(error).__name__}: {error}"[:4000],
                              "failed_step": loop.step})
            with tempfile.TemporaryDirectory() as tmp:
                files: list[str | Path] = [v for k, v in loop.artifacts.items() if k != "model"]
                if loop.history and self.plot is not None:
                    png = Path(tmp) / "training_curves.png"
                    self.plot(loop.history, png, title=self.cfg.name)
                    files.append(png)
                self.run.log_artifacts(files)
            if "model" in loop.artifacts and self.example is not None:
                self.run.log_model(loop.artifacts["model"], self.example, loop.step)
        finally:
            if self.monitor is not None:
                self.monitor.finish()


class RankThroughputHook(Hook):
    """Ranks other than 0 log their own ``perf/images_per_sec_rank{r}`` and step breakdown
    (``breakdown/rank{r}/*``, :mod:`mxlarge.breakdown`) to the job's run
    (rank 0's comes with its :class:`MLflowHook`)."""

    stage = REPORT

    def __init__(self, run: RunHandle):
        self.run = run

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        own = {k: v for k, v in metrics.items()
               if k.startswith(("perf/images_per_sec_rank", "breakdown/rank"))}
        if own:
            self.run.log_metrics(own, loop.step)
