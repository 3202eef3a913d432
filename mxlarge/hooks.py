"""The hook contract of :class:`mxlarge.loop.TrainLoop` (no MXNet import: trackers
subclass it).

A hook overrides what it needs of ``before_train`` / ``after_step`` / ``after_epoch`` /
``after_train``. Hooks never hold one another: what one produces travels in the data the
loop hands to the next,

* per step, ``StepOutput.metrics`` (declared keys: ``train/loss`` from the loss hook on
  logging steps; ``gns/g2``, ``gns/trace``, ``gns/b_simple`` from the loop on measuring steps)
  and ``StepOutput.sample`` (a sampled step's parts, when the Trainer's
  :class:`~mxlarge.observers.timer.StepTimer` timed it);
* per epoch, the ``metrics`` dict (``train/epoch``, ``train/loss`` (the epoch's mean of the
  logged losses), ``train/lr`` (the LR of the next update), ``perf/images_per_sec`` (all
  workers), ``perf/images_per_sec_rank{r}`` (more than one worker), ``perf/train_seconds``,
  ``val/error_top1``, ``val/error_top5``, ``val/accuracy``, ``val/loss``, and on a dist store
  ``breakdown/rank{r}/{part}_ms`` and ``breakdown/slowest_rank``, ``spread``, ``wait_share``,
  ``wait_others_share`` from :class:`mxlarge.breakdown.BreakdownHook`);
* after training, ``loop.artifacts`` (declared keys: ``final_params``, the path of the final
  parameters with the ``bn_stats`` statistics, and ``model``, the directory of a hybridized
  net's ``net.export`` (symbol + those parameters), both written by the final-parameters
  hook).

Metric names are MLflow's: the part before the first ``/`` is the section the MLflow UI
groups a run's charts in (``train``, ``val``, ``perf``, ``gns``; MLflow's own
``system``). Stores written before these names used
:data:`mxlarge.reporting.runs.LEGACY_METRICS`.

The order is stated once, as each hook class's :attr:`Hook.stage`; the loop runs hooks
sorted by stage (stable for equal stages), so producers always run before consumers:
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MEASURE = 10    # read the step's loss, time the epoch: the metrics everything else reads
EVALUATE = 20   # validation metrics into the epoch's metrics
CHECK = 30      # replica checks (collective, every rank)
PERSIST = 40    # final parameters and checkpoints: files exist before anything reports them
REPORT = 50     # progress lines, MLflow, per-rank throughput: read all of the above
STAGES = {"MEASURE": MEASURE, "EVALUATE": EVALUATE, "CHECK": CHECK, "PERSIST": PERSIST,
          "REPORT": REPORT}
__doc__ += "\n".join(f"``{name}`` = {value}" for name, value in STAGES.items()) + "\n"


class Hook:
    """Base class: override what you need. ``loop`` is the
    :class:`mxlarge.loop.TrainLoop`; ``loop.step`` is the number of updates applied."""

    stage: int = REPORT

    def before_train(self, loop: Any) -> None: ...

    def after_step(self, loop: Any, out: StepOutput) -> None: ...

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None: ...

    def after_train(self, loop: Any, error: BaseException | None) -> None: ...


@dataclass
class StepOutput:
    step: int               # the update just applied (0-based)
    epoch: int
    lr: float
    loss: Any               # per-sample losses of this worker's batch (an NDArray, read lazily)
    images: int             # images this worker processed
    metrics: dict[str, float] = field(default_factory=dict)  # declared keys: module docstring
    skipped: bool = False   # AMP found the summed gradients overflowed: no update was applied
    sample: Any = None      # a timed step's mxlarge.breakdown.Sample, else None
