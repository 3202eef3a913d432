"""MLflow tracking: the only module that imports ``mlflow``, and the owner of a run's life.

Default store: ``sqlite:///mlruns.db`` in the working directory (MLflow 3 refuses a plain file
store unless ``MLFLOW_ALLOW_FILE_STORE=true``). Precedence: ``tracking.uri`` in the config, then
``$MLFLOW_TRACKING_URI`` (read in :func:`tracking_uri` only), then the default.
``mlflow ui --backend-store-uri sqlite:///mlruns.db`` shows the runs.

MLflow's own conventions, read here and nowhere else: ``$MLFLOW_EXPERIMENT_NAME`` names the
experiment unless the config sets ``tracking.experiment`` (:func:`experiment_name`);
``$MLFLOW_RUN_ID`` is a caller's run to attach to, as ``--run-id`` (:func:`caller_run_id`);
every run gets the system tags ``mlflow.user``, ``mlflow.source.name``, ``mlflow.source.type``
and ``mlflow.source.git.commit``; a sweep is a parent run (tag ``sweep_parent``) whose cells are
child runs (tag ``mlflow.parentRunId``, which the MLflow UI nests), and its report is logged to
the parent. Params that do not apply to the run's dataset are left out (``config.applies``).
The trained model is logged as ``model/`` (``net.export``: ``model-symbol.json`` +
``model-0000.params``, MLflow 3 has no Gluon flavour) and :func:`load` reads it back.

A job's run is a :class:`RunHandle` (store URI + run id), passed down as a value: whoever opens
a run ends it. ``mxlarge train`` opens one (or reopens the run of the checkpoint it resumes) and
ends it FINISHED or FAILED; ``mxlarge launch`` opens the job's run before any process starts,
hands its id to every worker as ``mxlarge train --run-id ID`` (the workers log into it and do not
end it) and ends it by the job's exit status; ``mxlarge sweep`` opens each cell's run and passes
it to ``train`` in-process or to ``mxlarge launch --run-id ID``.
"""
from __future__ import annotations

import fcntl
import getpass
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.tracking import MlflowClient

from mxlarge.config import Config, applies, dump_yaml, flatten
from mxlarge.errors import InputError
from mxlarge.hooks import REPORT, Hook, StepOutput

DEFAULT_URI = "sqlite:///mlruns.db"


def tracking_uri(cfg: Config) -> str:
    """The store: ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else :data:`DEFAULT_URI`,
    with a relative sqlite path made absolute (workers may start in another directory)."""
    uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str(Path(uri[len(prefix):]).resolve())
    return uri


def experiment_name(cfg: Config) -> str:
    """``tracking.experiment`` if the config sets it (anything but the default ``mxlarge``),
    else ``$MLFLOW_EXPERIMENT_NAME``, else ``mxlarge``."""
    default = type(cfg.tracking)().experiment
    if cfg.tracking.experiment != default:
        return cfg.tracking.experiment
    return os.environ.get("MLFLOW_EXPERIMENT_NAME") or default


def caller_run_id(given: str | None, cfg: Config) -> str | None:
    """The run a caller opened and will end: ``--run-id``, else ``$MLFLOW_RUN_ID`` (when
    tracking is on), else None (this process opens its own run)."""
    if given is not None or not cfg.tracking.enabled:
        return given
    return os.environ.get("MLFLOW_RUN_ID") or None


def system_tags() -> dict[str, str]:
    """MLflow's standard tags: who ran what from which commit."""
    argv0 = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    source = ("mxlarge " + " ".join(sys.argv[1:2])).strip() if argv0 in (
        "cli.py", "mxlarge", "__main__.py") else (sys.argv[0] if sys.argv else "mxlarge")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return {"mlflow.user": user, "mlflow.source.name": source, "mlflow.source.type": "LOCAL",
            "mlflow.source.git.commit": git_commit()}


_READY: set[str] = set()


def client(uri: str) -> MlflowClient:
    """A client of ``uri``; a sqlite store is created under a lock on its directory.

    MLflow creates and migrates a new sqlite store's schema on first use. Two processes doing
    that at once (the two ``--part``s of a sweep started together) break each other's migration
    ("table _alembic_tmp_... already exists"), so the first use per process holds an exclusive
    ``flock`` on the database's directory.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix) or uri in _READY:
        return MlflowClient(tracking_uri=uri)
    directory = Path(uri[len(prefix):]).parent
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)  # the first store access creates the schema
    finally:
        os.close(fd)  # releases the lock
    _READY.add(uri)
    return c


def check_reachable(uri: str) -> None:
    """Fails before training, not after an hour, if the tracking store cannot be used.

    Raises:
        InputError: naming the URI and the underlying problem.
    """
    try:
        client(uri).search_experiments(max_results=1)
    except Exception as exc:  # noqa: BLE001 - any failure means the store is unusable
        raise InputError(f"MLflow tracking URI {uri!r} is not usable: "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _experiment_id(c: MlflowClient, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    return exp.experiment_id if exp else c.create_experiment(name)


@dataclass(frozen=True)
class RunHandle:
    """One MLflow run of a job: where it is stored and its id."""

    uri: str
    run_id: str

    @classmethod
    def create(cls, cfg: Config, uri: str, tags: dict[str, Any] | None = None,
               parent: RunHandle | None = None) -> RunHandle:
        """A RUNNING run with the config's applicable keys as params; a child of ``parent``."""
        c = client(uri)
        all_tags = {**system_tags(), "mlflow.runName": cfg.name, "git_commit": git_commit(),
                    "dataset": cfg.data.dataset, "model": cfg.model.name, **(tags or {})}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id
        run = c.create_run(_experiment_id(c, experiment_name(cfg)),
                           tags={k: str(v) for k, v in all_tags.items()})
        params = [mlflow.entities.Param(k, str(v)[:500]) for k, v in flatten(cfg).items()
                  if applies(k, cfg)]
        for lo in range(0, len(params), 100):
            c.log_batch(run.info.run_id, params=params[lo:lo + 100])
        return cls(uri, run.info.run_id)

    @classmethod
    def create_plain(cls, uri: str, experiment: str, tags: dict[str, Any],
                     params: dict[str, Any] | None = None) -> RunHandle:
        """A RUNNING run without a training config (e.g. a sweep's summary)."""
        c = client(uri)
        run = c.create_run(_experiment_id(c, experiment),
                           tags={**system_tags(), "git_commit": git_commit(),
                                 **{k: str(v) for k, v in tags.items()}})
        if params:
            c.log_batch(run.info.run_id, params=[mlflow.entities.Param(k, str(v)[:500])
                                                 for k, v in params.items()])
        return cls(uri, run.info.run_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str) -> RunHandle:
        """An existing run, RUNNING again (a resumed job continues its metrics at their steps).

        Raises:
            InputError: no such run in the store.
        """
        try:
            client(uri).update_run(run_id, status="RUNNING")
        except mlflow.exceptions.MlflowException as exc:
            raise InputError(f"MLflow run {run_id!r} cannot be opened in {uri!r}: "
                             f"{str(exc).splitlines()[0][:300]}") from None
        return cls(uri, run_id)

    def tag(self, tags: dict[str, Any]) -> None:
        c = client(self.uri)
        for k, v in tags.items():
            c.set_tag(self.run_id, k, str(v)[:5000])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        ms = [mlflow.entities.Metric(k, float(v), now, int(step)) for k, v in metrics.items()]
        client(self.uri).log_batch(self.run_id, metrics=ms)

    def log_artifacts(self, paths: Sequence[str | Path]) -> None:
        """Files at the artifact root; a directory ``d`` goes under ``d.name/``."""
        c = client(self.uri)
        for p in paths:
            if Path(p).is_dir():
                c.log_artifacts(self.run_id, str(p), Path(p).name)
            else:
                c.log_artifact(self.run_id, str(p))

    def end(self, ok: bool, tags: dict[str, Any] | None = None) -> None:
        """FINISHED or FAILED, after the given tags (e.g. ``failure``)."""
        self.tag(tags or {})
        client(self.uri).set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")

    def status(self) -> str:
        return client(self.uri).get_run(self.run_id).info.status


class MLflowHook(Hook):
    """Rank 0: tags, the config artifact, metrics with their step, and artifacts of the run.

    The run's owner opens and ends it; this hook only logs, and tags ``failure`` if training
    raised. Per-step metrics come in ``StepOutput.metrics`` (the LR every ``log_every`` steps),
    per-epoch ones in the epoch's metrics, files in ``loop.artifacts`` (:mod:`mxlarge.hooks`).
    """

    stage = REPORT

    def __init__(self, cfg: Config, run: RunHandle, tags: dict[str, Any], log_every: int):
        self.cfg = cfg
        self.run = run
        self.tags = tags
        self.log_every = log_every

    def before_train(self, loop: Any) -> None:
        self.run.tag(self.tags)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.yaml"
            path.write_text(dump_yaml(self.cfg))
            self.run.log_artifacts([path])

    def after_step(self, loop: Any, out: StepOutput) -> None:
        metrics = dict(out.metrics)
        if (out.step + 1) % self.log_every == 0:
            metrics["lr"] = out.lr
        if metrics:
            self.run.log_metrics(metrics, out.step + 1)

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        # one lr per step: after_step already logged it when the epoch ends on a logging step
        logged = loop.step % self.log_every == 0
        self.run.log_metrics({k: v for k, v in metrics.items() if not (k == "lr" and logged)},
                             loop.step)

    def after_train(self, loop: Any, error: BaseException | None) -> None:
        if error is not None:
            self.run.tag({"failure": f"{type(error).__name__}: {error}"[:4000]})
        with tempfile.TemporaryDirectory() as tmp:
            files: list[str | Path] = list(loop.artifacts.values())
            if loop.history:
                from mxlarge.plots import plot_training_curves
                png = Path(tmp) / "training_curves.png"
                plot_training_curves(loop.history, png, title=self.cfg.name)
                files.append(png)
            self.run.log_artifacts(files)


class RankThroughputHook(Hook):
    """Every rank logs its own images/s as ``images_per_sec_rank{r}`` to the job's run."""

    stage = REPORT

    def __init__(self, run: RunHandle, rank: int):
        self.run, self.rank = run, rank

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        if "images_per_sec" in metrics:
            self.run.log_metrics({f"images_per_sec_rank{self.rank}": metrics["images_per_sec"]},
                                 loop.step)


def load(run_id: str, uri: str | None = None, ctx: Any = None) -> Any:
    """The model a run logged (``model/``), as a ``gluon.SymbolBlock`` ready for inference.

    ``uri`` defaults to :func:`tracking_uri` of a default config. Raises ``InputError`` if the
    run has no model (a run of a non-hybridized net, or one that failed).
    """
    import mxnet as mx

    uri = uri or tracking_uri(Config())
    dst = tempfile.mkdtemp(prefix="mxlarge-model-")
    try:
        local = Path(client(uri).download_artifacts(run_id, "model", dst))
    except mlflow.exceptions.MlflowException as exc:
        raise InputError(f"run {run_id!r} in {uri!r} has no model artifact: "
                         f"{str(exc).splitlines()[0][:300]}") from None
    symbols = sorted(local.glob("*-symbol.json"))
    params = sorted(local.glob("*.params"))
    if not symbols or not params:
        raise InputError(f"run {run_id!r}: model/ holds no exported symbol and parameters")
    with warnings.catch_warnings():
        # imports() cannot infer the input's dtype from the symbol and warns; it is float32,
        # the default it then uses
        warnings.filterwarnings("ignore", message="Cannot decide type")
        return mx.gluon.SymbolBlock.imports(str(symbols[0]), ["data"], str(params[0]),
                                            ctx=ctx or mx.cpu())


def sweep_parent(uri: str, experiment: str, name: str) -> RunHandle:
    """The parent run of sweep ``name`` (tag ``sweep_parent``), reopened if a previous
    invocation made it (a resumed sweep keeps one parent), else created."""
    found = find_runs(uri, experiment, {"sweep_parent": name})
    if found:
        return RunHandle.reopen(uri, found[0]["run_id"])
    return RunHandle.create_plain(uri, experiment, {"sweep_parent": name,
                                                    "mlflow.runName": f"sweep {name}"})


def find_sweep_parent(uri: str, experiment: str, name: str) -> RunHandle | None:
    found = find_runs(uri, experiment, {"sweep_parent": name})
    return RunHandle(uri, found[0]["run_id"]) if found else None


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


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric, ordered by step then logging time."""
    hist = client(uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
