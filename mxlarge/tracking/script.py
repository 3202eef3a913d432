"""Your own script's run: what its Trainer logs into the run its launcher opened.

``python -m mxlarge.launcher -- CMD`` opens one run and gives every process MLflow's own
``MLFLOW_TRACKING_URI`` and ``MLFLOW_RUN_ID``
(:func:`mxlarge.tracking.open_command_run`). Once the Trainer knows its kvstore rank:

* rank 0 adds a :class:`ScriptRun` observer: the Trainer's resolved settings as params at
  its first update, ``train/lr``, ``train/samples``, ``perf/images_per_sec`` and its own
  step breakdown (``breakdown/rank0/{part}_ms``, when its step timer runs) every
  :data:`EVERY` updates (and :data:`MIN_SECONDS` apart) and at exit, with the names and
  units a config run uses; a thread writes them, so that a step never waits for the
  store;
* every other rank points MLflow's fluent API at a store of its own that is deleted at exit
  (:func:`quiet`): a script's ``mlflow.log_metric`` there creates nothing in the job's store
  and duplicates nothing.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import Any

import mlflow

from mxlarge.breakdown import PARTS
from mxlarge.observers import REPORT, Step, StepObserver
from mxlarge.tracking.run import RunHandle

#: Updates between two logged points of ``train/lr`` and ``perf/images_per_sec``.
EVERY = 10
#: Seconds at least between two points: a fast loop logs less often than every
#: :data:`EVERY` updates, so that the writer's share of the CPU (and of the GIL) stays small.
MIN_SECONDS = 2.0
#: Seconds the process waits at exit for the points still queued.
FLUSH_SECONDS = 10.0


class ScriptRun(StepObserver):
    """Logs a script's steps into ``run`` (module docstring), reading ``trainer`` (its LR,
    batch and settings) when an update is done."""

    stage = REPORT

    def __init__(self, run: RunHandle, trainer: Any) -> None:
        self.run = run
        self.trainer = trainer
        self.updates = 0
        self.last_t = 0  # the step of the last update
        self.since: tuple[int, float] | None = None  # (updates, time) of the last point
        self.parts: dict[str, float] = {}  # the step timer's latest medians (ms), if any
        self.points: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self.writer = threading.Thread(target=self._write, name="mxlarge-script-run",
                                       daemon=True)
        self.writer.start()
        atexit.register(self.close)

    def update_done(self, step: Step, applied: bool, weights: Any) -> None:
        """At update 1 the settings; every :data:`EVERY` updates the LR and the rate."""
        self.updates += 1
        self.last_t = step.t
        now = time.perf_counter()
        if step.parts:
            self.parts = step.parts
        if self.updates == 1:
            self.points.put(("params", settings_of(self.trainer)))
            self.since = (self.updates, now)
            return
        if self.updates % EVERY or self.since is None:
            return
        if self.updates > EVERY and now - self.since[1] < MIN_SECONDS:
            return
        self._point(now)

    def _point(self, now: float) -> None:
        """Queues the LR, the samples, the rate since the last point and the breakdown at
        the current update."""
        assert self.since is not None
        batch = global_batch(self.trainer)
        done, then = self.since
        metrics = {"train/lr": self.trainer.lr_at(self.last_t),
                   "train/samples": self.updates * batch}
        if now > then:
            metrics["perf/images_per_sec"] = (self.updates - done) * batch / (now - then)
        metrics.update({f"breakdown/rank0/{p}_ms": self.parts[p] for p in (*PARTS, "step")
                        if p in self.parts})
        self.since = (self.updates, now)
        self.points.put(("metrics", (metrics, self.updates)))

    def close(self) -> None:
        """At exit: a last point for the updates since the last one (a short script has
        one at least), then writes what is queued (at most :data:`FLUSH_SECONDS`) and stops
        the writer."""
        if self.since is not None and self.since[0] < self.updates:
            self._point(time.perf_counter())
        if self.writer.is_alive():
            self.points.put(None)
            self.writer.join(FLUSH_SECONDS)

    def _write(self) -> None:
        while (item := self.points.get()) is not None:
            kind, value = item
            try:
                if kind == "params":
                    self.run.log_params(value)
                else:
                    self.run.log_metrics(*value)
            except mlflow.exceptions.MlflowException as exc:  # say it; never stop training
                print(f"mxlarge.Trainer: warning: MLflow: {str(exc).splitlines()[0][:300]}",
                      flush=True)


def launched_run() -> RunHandle | None:
    """The run a launcher gave this process, or None: ``MLFLOW_TRACKING_URI`` and
    ``MLFLOW_RUN_ID`` (MLflow's convention), or, once the script's own MLflow call attached
    to it (MLflow then deletes ``MLFLOW_RUN_ID``), MLflow's active run."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if uri and run_id:
        return RunHandle(uri, run_id)
    active = mlflow.active_run()
    return RunHandle(mlflow.get_tracking_uri(), active.info.run_id) if active else None


def quiet() -> None:
    """A worker of rank > 0: MLflow's fluent API logs into a store of this process's own
    (a SQLite file, deleted at exit), and no longer attaches to the job's run."""
    own = tempfile.mkdtemp(prefix="mxlarge-mlflow-rank-")
    atexit.register(_drop, own)
    os.environ.pop("MLFLOW_RUN_ID", None)  # else start_run() attaches to the job's run
    # A run the script's own call attached to before the Trainer existed is let go without
    # ending it (mlflow.end_run() would mark the job's run FINISHED): MLflow has no public
    # call for that, so its stack of active runs is emptied here.
    with contextlib.suppress(AttributeError):
        mlflow.tracking.fluent._active_run_stack.get().clear()
    mlflow.set_tracking_uri(f"sqlite:///{own}/mlruns.db")  # made only if the script logs


def log_model(trainer: Any, net: Any, example: Any) -> str | None:
    """``mxlarge.log_model(trainer, net, example)``: the trained ``net`` (hybridized, run
    once) as the job's model, the one a config run logs (:func:`mxlarge.tracking.log_model`:
    the ``python_function`` flavour, the signature from ``example``, a float32 batch), at the
    Trainer's update count; on kvstore rank 0, whose Trainer logs into the launcher's run.
    Returns the model id there, None on the other ranks.

    Raises:
        ValueError: rank 0 has no run of a launcher's (a job not started by ``python -m
            mxlarge.launcher``, or started with ``--no-mlflow``).
    """
    if trainer.rank != 0:
        return None
    observer = trainer.observers.find(ScriptRun)
    if observer is None:
        raise ValueError("mxlarge.log_model: this process logs into no run: launch the script "
                         "with python -m mxlarge.launcher (without --no-mlflow)")
    batch = example.asnumpy() if hasattr(example, "asnumpy") else example
    with tempfile.TemporaryDirectory(prefix="mxlarge-model-") as tmp:
        net.export(os.path.join(tmp, "model"))
        return observer.run.log_model(tmp, batch.astype("float32"), trainer.num_update)


def _drop(own: str) -> None:
    """Ends the script's run in this rank's own store (before MLflow's own exit handler,
    which would find the store gone), then deletes the store."""
    with contextlib.suppress(mlflow.exceptions.MlflowException):
        mlflow.end_run()
    shutil.rmtree(own, ignore_errors=True)


def global_batch(trainer: Any) -> int:
    """The images of one update: the world's global batch for the batch the schedule was
    fixed for (0 before the first update)."""
    return trainer.world(trainer.lr.batch).global_batch if trainer.lr.batch else 0


def settings_of(trainer: Any) -> dict[str, Any]:
    """The Trainer's resolved settings as params, under a config run's names."""
    s = trainer.settings
    optimizer = type(s.mxnet_optimizer).__name__.lower() if s.mxnet_optimizer else "sgd"
    world = trainer.world(trainer.lr.batch or 1)
    return {"optim.optimizer": optimizer, "optim.base_lr": s.base(0),
            "optim.reference_batch": s.reference_batch, "optim.scaling": s.scaling,
            "optim.warmup_steps": s.warmup_steps, "optim.warmup_lr": s.warmup_lr,
            "optim.momentum": s.momentum, "optim.nesterov": s.nesterov,
            "optim.weight_decay": s.wd, "optim.lars": s.lars,
            "optim.momentum_correction": s.momentum_correction,
            "optim.decay_bn_bias": s.decay_bn_bias, "dist.wire_dtype": s.wire_dtype,
            "dist.fusion_bytes": s.fusion_bytes, "dist.bn_stats": s.bn_stats,
            "dist.compression": (s.compression or {}).get("type", "none"),
            "plan.workers": world.processes, "plan.devices_per_worker": world.devices,
            "plan.simulated_workers": world.simulated, "plan.per_device_batch": world.batch,
            "plan.global_batch": global_batch(trainer)}
