"""MLflow tracking: the only module that imports ``mlflow``.

Default store: ``sqlite:///mlruns.db`` in the working directory (MLflow 3 refuses a plain file
store unless ``MLFLOW_ALLOW_FILE_STORE=true``). Precedence: ``tracking.uri`` in the config, then
``$MLFLOW_TRACKING_URI``, then the default. ``mlflow ui --backend-store-uri sqlite:///mlruns.db``
shows the runs.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from mxlarge.config import Config, ConfigError, dump_yaml, flatten
from mxlarge.loop import Hook, StepOutput, TrainLoop

DEFAULT_URI = "sqlite:///mlruns.db"


def tracking_uri(cfg: Config) -> str:
    return cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def client(uri: str) -> MlflowClient:
    return MlflowClient(tracking_uri=uri)


def check_reachable(uri: str) -> None:
    """Fails before training, not after an hour, if the tracking store cannot be used.

    Raises:
        ConfigError: naming the URI and the underlying problem.
    """
    try:
        client(uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure means the store is unusable
        raise ConfigError(f"MLflow tracking URI {uri!r} is not usable: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def create_run(cfg: Config, uri: str, tags: dict[str, str] | None = None) -> str:
    """Creates a RUNNING run with the config as params; returns its id."""
    c = client(uri)
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    exp_id = exp.experiment_id if exp else c.create_experiment(cfg.tracking.experiment)
    all_tags = {"mlflow.runName": cfg.name, "git_commit": git_commit(),
                "dataset": cfg.data.dataset, "model": cfg.model.name, **(tags or {})}
    run = c.create_run(exp_id, tags={k: str(v) for k, v in all_tags.items()})
    params = [mlflow.entities.Param(k, str(v)[:500]) for k, v in flatten(cfg).items()]
    for lo in range(0, len(params), 100):
        c.log_batch(run.info.run_id, params=params[lo:lo + 100])
    return run.info.run_id


def reopen_run(uri: str, run_id: str) -> None:
    """A resumed job continues its run: RUNNING again, metrics continue at their steps."""
    client(uri).update_run(run_id, status="RUNNING")


def end_run(uri: str, run_id: str, ok: bool, tags: dict[str, str] | None = None) -> None:
    c = client(uri)
    for k, v in (tags or {}).items():
        c.set_tag(run_id, k, str(v))
    c.set_terminated(run_id, status="FINISHED" if ok else "FAILED")


def log_metrics(uri: str, run_id: str, metrics: dict[str, float], step: int) -> None:
    ms = [mlflow.entities.Metric(k, float(v), int(_now_ms()), int(step))
          for k, v in metrics.items()]
    client(uri).log_batch(run_id, metrics=ms)


def _now_ms() -> int:
    import time
    return int(time.time() * 1000)


class MLflowHook(Hook):
    """Rank 0: params, tags, metrics with step, and artifacts of one run.

    Creates the run unless ``run_id`` is given (a launched job's run, created by the launcher,
    which also ends it); ends a run it created as FINISHED or FAILED.
    """

    def __init__(self, cfg: Config, uri: str, run_id: str | None, tags: dict[str, Any],
                 log_every: int, final_params: Any = None, owns_run: bool = True):
        self.cfg = cfg
        self.uri = uri
        self.owns_run = owns_run
        self.run_id = run_id
        self.tags = {k: str(v) for k, v in tags.items()}
        self.log_every = log_every
        self.final_params = final_params  # a FinalParamsHook, registered before this hook
        # registered after the LossHook, whose per-step loss arrives in StepOutput.metrics

    def before_train(self, loop: TrainLoop) -> None:
        if self.run_id is None:
            self.run_id = create_run(self.cfg, self.uri, self.tags)
        else:  # a launched job's run, or a resumed one: continue it
            c = client(self.uri)
            c.update_run(self.run_id, status="RUNNING")
            for k, v in self.tags.items():
                c.set_tag(self.run_id, k, v)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(dump_yaml(self.cfg))
            client(self.uri).log_artifact(self.run_id, str(path))

    def after_step(self, loop: TrainLoop, out: StepOutput) -> None:
        metrics = dict(out.metrics)
        if (out.step + 1) % self.log_every == 0:
            metrics["lr"] = out.lr
        if metrics:
            log_metrics(self.uri, self.run_id, metrics, out.step + 1)

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        log_metrics(self.uri, self.run_id, metrics, loop.step)

    def after_train(self, loop: TrainLoop, error: BaseException | None) -> None:
        if self.run_id is None:
            return
        c = client(self.uri)
        try:
            with tempfile.TemporaryDirectory() as tmp:
                if self.final_params is not None and self.final_params.path:
                    c.log_artifact(self.run_id, self.final_params.path)
                if loop.history:
                    from mxlarge.report import plot_training_curves
                    png = Path(tmp) / "training_curves.png"
                    plot_training_curves(loop.history, png, title=self.cfg.name)
                    c.log_artifact(self.run_id, str(png))
        finally:
            if error is not None:
                c.set_tag(self.run_id, "failure", f"{type(error).__name__}: {error}"[:4000])
            if self.owns_run:
                c.set_terminated(self.run_id, status="FAILED" if error else "FINISHED")


class RankThroughputHook(Hook):
    """Every rank logs its own images/s as ``images_per_sec_rank{r}`` to the job's run."""

    def __init__(self, uri: str, run_id: str, rank: int):
        self.uri, self.run_id, self.rank = uri, run_id, rank

    def after_epoch(self, loop: TrainLoop, epoch: int, metrics: dict[str, float]) -> None:
        if "images_per_sec" in metrics:
            log_metrics(self.uri, self.run_id,
                        {f"images_per_sec_rank{self.rank}": metrics["images_per_sec"]}, loop.step)


# ---------------------------------------------------------------------------------------------
# sweeps and reports (mxlarge.sweep, mxlarge.report): plain data in and out, no MLflow objects


def find_runs(uri: str, experiment: str, tags: dict[str, str],
              status: str | None = None) -> list[dict[str, Any]]:
    """Runs of ``experiment`` whose tags equal ``tags`` (and whose status is ``status``).

    Values without quotes go into the MLflow filter (fewer rows read); every condition is also
    checked here, so labels with quotes or spaces still match exactly.

    Returns:
        ``[{"run_id", "status", "start_time" (ms), "tags", "params"}]``, newest first; an
        empty list if the experiment does not exist.
    """
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()
               if "'" not in v and "`" not in k]
    if status is not None:
        clauses.append(f"attributes.status = '{status}'")
    out: list[dict[str, Any]] = []
    token = None
    while True:
        page = c.search_runs([exp.experiment_id], filter_string=" and ".join(clauses),
                             max_results=1000, order_by=["attributes.start_time DESC"],
                             page_token=token)
        for r in page:
            if status is not None and r.info.status != status:
                continue
            if any(r.data.tags.get(k) != v for k, v in tags.items()):
                continue
            out.append({"run_id": r.info.run_id, "status": r.info.status,
                        "start_time": r.info.start_time or 0, "tags": dict(r.data.tags),
                        "params": dict(r.data.params)})
        token = page.token
        if not token:
            return out


def set_tags(uri: str, run_id: str, tags: dict[str, Any]) -> None:
    c = client(uri)
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


def run_status(uri: str, run_id: str) -> str:
    return client(uri).get_run(run_id).info.status


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric, ordered by step then logging time."""
    hist = client(uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]


def create_plain_run(uri: str, experiment: str, tags: dict[str, Any],
                     params: dict[str, Any] | None = None) -> str:
    """A RUNNING run without a training config (e.g. a sweep's summary); returns its id."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else c.create_experiment(experiment)
    run = c.create_run(exp_id, tags={"git_commit": git_commit(),
                                     **{k: str(v) for k, v in tags.items()}})
    if params:
        c.log_batch(run.info.run_id, params=[mlflow.entities.Param(k, str(v)[:500])
                                             for k, v in params.items()])
    return run.info.run_id


def log_artifacts(uri: str, run_id: str, paths: list[str | Path]) -> None:
    c = client(uri)
    for p in paths:
        c.log_artifact(run_id, str(p))
