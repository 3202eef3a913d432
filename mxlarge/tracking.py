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
the parent.

What a run holds, as the MLflow UI shows it (:func:`run_url` is its page in the training view):

* name (``mlflow.runName``): what tells runs apart first, ``sS · label · K×n`` (label: the
  sweep label, else the config's ``name``; K×n: gradient contributors × images each); the
  experiment's shared runs view (:func:`share_runs_view`) opens the list with metric columns;
  description (``mlflow.note.content``): the plan as a table (:func:`describe_run`);
* params: the config keys that take effect (:func:`takes_effect`; ``name`` is the run name
  instead), ``tracking.uri`` as resolved, paths inside the repository relative to
  it, the plan's derived numbers as ``plan.*`` and the built net's facts as ``net.*``;
* metrics in sections by prefix (``train/``, ``val/``, ``perf/``, ``gns/``, MLflow's own
  ``system/`` on rank 0 every 2 s with the job's processes as ``system/job_*``
  (:class:`JobMonitor`); the names are :mod:`mxlarge.hooks`'), ``train/lr`` from step 0 and
  ``train/samples`` (images seen) at every logged step, ``val/best_accuracy`` and
  ``val/final_error`` (:func:`mxlarge.stats.final_error`) at every evaluation;
* the model as an MLflow logged model named after the run (:func:`model_name`;
  ``python_function`` flavour over ``net.export``'s files, :mod:`mxlarge.gluon_pyfunc`, with a
  signature and an input example); :func:`load` reads it back as a ``gluon.SymbolBlock``.

A job's run is a :class:`RunHandle` (store URI + run id), passed down as a value: whoever opens
a run ends it. Which run a process logs into is decided in one function, :func:`open_run` (the
caller's, else the resumed checkpoint's, else a new one), called once per process root, and a
run is ended in one, :meth:`OpenRun.close`. ``mxlarge train`` opens one (or reopens the run of
the checkpoint it resumes) and ends it FINISHED or FAILED; ``mxlarge launch`` opens the job's
run before any process starts, hands its id to every worker as ``mxlarge train --run-id ID``
(the workers log into it and do not end it) and ends it by the job's exit status;
``mxlarge sweep`` opens each cell's run and passes its id to ``train`` in-process or to
``mxlarge launch --run-id ID``.

It is over 500 lines because it is the one module that imports ``mlflow``: every MLflow call of
the project (a run's life, its params, metrics, model and failure evidence) is here.
"""
from __future__ import annotations

import fcntl
import getpass
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.system_metrics.metrics.base_metrics_monitor import BaseMetricsMonitor
from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
from mlflow.tracking import MlflowClient

from mxlarge.config import Config, applies, dump_yaml, flatten
from mxlarge.errors import InputError
from mxlarge.hooks import REPORT, Hook, StepOutput
from mxlarge.plan import precision
from mxlarge.stats import final_error

DEFAULT_URI = "sqlite:///mlruns.db"
REPO_ROOT = Path(__file__).resolve().parents[1]
# where `mlflow ui` / `mlflow server` listen unless told otherwise
UI_ADDRESS = "http://127.0.0.1:5000"


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
    """The experiment ``name``'s id, created with the shared runs view if new."""
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if f"mlflow.sharedViewState.{RUNS_VIEW}" not in exp.tags:  # made by MLflow or before
            share_runs_view(c, exp.experiment_id)
        return exp.experiment_id
    made = c.create_experiment(name)
    share_runs_view(c, made)
    return made


def shown_path(path: str | Path) -> str:
    """``path`` relative to the repository when it lies inside it, else as given."""
    p = Path(path)
    if not p.is_absolute():
        return str(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def run_name(cfg: Config, world: Any, label: str | None = None) -> str:
    """``sS · label · K×n``: the seed first (what differs between runs of one config, and the
    runs list shows only a name's first ~20 characters), then the label and the world
    (gradient contributors × images each)."""
    return f"s{cfg.train.seed} · {label or cfg.name} · {world.units}×{world.batch}"


def describe_run(cfg: Config, plan: Any, source: str | None = None,
                 label: str | None = None) -> str:
    """The run's description (``mlflow.note.content``, markdown): what it trains, the plan."""
    shown = shown_path(Path(source).resolve()) if source and Path(source).is_file() else None
    what = f"**{label or cfg.name}**" + (f" (`{shown}`)" if shown else "")
    lines = [f"{what}: {cfg.model.name} on {cfg.data.dataset}, {plan.world.describe()}, "
             f"{cfg.train.epochs} epochs.", "", "| plan | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in plan.summary().items()]
    lines += [f"| precision ({k}) | {v} |" for k, v in precision(cfg).items()]
    return "\n".join(lines)


# Config keys that take effect only when another key says so: no `optim.lars_eta` param on a
# run without LARS. (config.applies handles the dataset- and model-specific keys.)
TAKES_EFFECT: dict[str, Any] = {
    "optim.lars_eta": lambda c: c.optim.lars, "optim.lars_lr": lambda c: c.optim.lars,
    "optim.poly_power": lambda c: c.optim.decay == "poly",
    "optim.decay_epochs": lambda c: c.optim.decay == "step",
    "optim.decay_factor": lambda c: c.optim.decay == "step",
    "optim.warmup_epochs": lambda c: c.optim.warmup != "none",
    "optim.warmup_lr": lambda c: c.optim.warmup != "none",
    "train.gns_decay": lambda c: c.train.gns_every > 0,
    "train.keep_last": lambda c: c.train.checkpoint_every > 0,
    "train.checkpoint_dir": lambda c: c.train.checkpoint_every > 0,
    "dist.compression_threshold": lambda c: c.dist.compression != "none",
}


def takes_effect(key: str, value: Any, cfg: Config) -> bool:
    """Whether config ``key`` = ``value`` is a param of ``cfg``'s run: it applies to the dataset
    and model (:func:`mxlarge.config.applies`), the keys it depends on enable it
    (:data:`TAKES_EFFECT`) and it has a value (no None, no empty string or list)."""
    if key == "name" or value is None or value in ("", (), []):
        return False
    return applies(key, cfg) and TAKES_EFFECT.get(key, lambda c: True)(cfg)


def run_params(cfg: Config, uri: str, plan: Any) -> dict[str, str]:
    """The params of a training run (module docstring)."""
    params: dict[str, Any] = {k: v for k, v in flatten(cfg).items()
                              if takes_effect(k, v, cfg)}
    params["tracking.uri"] = uri
    for k, v in params.items():
        if isinstance(v, str) and v.startswith("/"):
            params[k] = shown_path(v)
    params.update({f"plan.{k}": v for k, v in plan.summary().items()})
    return {k: str(v)[:500] for k, v in params.items()}


def _log_params(c: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    items = [mlflow.entities.Param(k, str(v)[:500]) for k, v in params.items()]
    for lo in range(0, len(items), 100):
        c.log_batch(run_id, params=items[lo:lo + 100])


def run_url(uri: str, run_id: str) -> str:
    """The run's page in the MLflow UI's training view (``workflowType=machine_learning``,
    which MLflow 3 otherwise opens as a GenAI experiment): at ``uri`` itself for a tracking
    server, else at the address ``mlflow ui --backend-store-uri URI`` serves (:data:`UI_ADDRESS`).
    """
    exp = client(uri).get_run(run_id).info.experiment_id
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_ADDRESS
    return f"{base}/#/experiments/{exp}/runs/{run_id}?workflowType=machine_learning"


def runs_url(uri: str, experiment_id: str) -> str:
    """The experiment's runs list in the training view with :data:`RUNS_VIEW`'s columns
    (:func:`share_runs_view`)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_ADDRESS
    return (f"{base}/#/experiments/{experiment_id}/runs?viewStateShareKey={RUNS_VIEW}"
            "&workflowType=machine_learning")


def ui_hint(uri: str, run_id: str) -> str:
    """``URL`` and, for a local store, the command that serves it; then the runs list's URL."""
    url = run_url(uri, run_id)
    listed = runs_url(uri, client(uri).get_run(run_id).info.experiment_id)
    if uri.startswith(("http://", "https://")):
        return f"{url} (runs list: {listed})"
    return f"{url} (serve it with: mlflow ui --backend-store-uri {uri}; runs list: {listed})"


# MLflow's shared view of an experiment's runs list: the experiment tag
# `mlflow.sharedViewState.<key>` holds the view as JSON and the list's URL names it as
# `viewStateShareKey` (the mechanism of the UI's own "Share" of a view; it reads plain JSON
# there, tests/ui shows the columns). The columns a user compares first: quality, throughput.
RUNS_VIEW = "mxlarge"
RUNS_COLUMNS = ("val/final_error", "val/best_accuracy", "perf/images_per_sec_median",
                "train/loss")


def share_runs_view(c: MlflowClient, experiment_id: str) -> None:
    """Tags the experiment with :data:`RUNS_VIEW`: the runs list opening with the metric
    columns :data:`RUNS_COLUMNS` (:func:`runs_url`)."""
    view = {"selectedColumns": [f"metrics.`{k}`" for k in RUNS_COLUMNS]}
    c.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{RUNS_VIEW}", json.dumps(view))


def model_name(run_name: str) -> str:
    """The logged model's name: the run's (``s0 · digits · 2×128`` → ``s0-digits-2x128``), in
    the characters MLflow allows in one (no ``/ : . % " '``)."""
    words = re.sub(r"[^A-Za-z0-9_-]+", "-", run_name.replace("×", "x")).strip("-")
    return words or "model"


@dataclass(frozen=True)
class RunHandle:
    """One MLflow run of a job: where it is stored and its id."""

    uri: str
    run_id: str

    @classmethod
    def create(cls, cfg: Config, uri: str, tags: dict[str, Any] | None = None,
               parent: RunHandle | None = None, plan: Any = None,
               source: str | None = None) -> RunHandle:
        """A RUNNING run named, described and with params as in the module docstring; a child
        of ``parent``. ``plan`` defaults to :func:`mxlarge.plan.plan_for` of ``cfg``;
        ``source`` is the experiment file (for the description); a ``sweep_label`` tag names
        the run instead of ``cfg.name``."""
        from mxlarge.plan import plan_for

        plan = plan or plan_for(cfg)
        label = (tags or {}).get("sweep_label")
        c = client(uri)
        all_tags = {**system_tags(), "mlflow.runName": run_name(cfg, plan.world, label),
                    "mlflow.note.content": describe_run(cfg, plan, source, label),
                    **(tags or {})}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id
        run = c.create_run(_experiment_id(c, experiment_name(cfg)),
                           tags={k: str(v) for k, v in all_tags.items()})
        _log_params(c, run.info.run_id, run_params(cfg, uri, plan))
        return cls(uri, run.info.run_id)

    @classmethod
    def create_plain(cls, uri: str, experiment: str, tags: dict[str, Any],
                     params: dict[str, Any] | None = None) -> RunHandle:
        """A RUNNING run without a training config (e.g. a sweep's parent)."""
        c = client(uri)
        run = c.create_run(_experiment_id(c, experiment),
                           tags={**system_tags(), **{k: str(v) for k, v in tags.items()}})
        if params:
            _log_params(c, run.info.run_id, params)
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

    def tags(self) -> dict[str, str]:
        return dict(client(self.uri).get_run(self.run_id).data.tags)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        ms = [mlflow.entities.Metric(k, float(v), now, int(step)) for k, v in metrics.items()]
        client(self.uri).log_batch(self.run_id, metrics=ms)

    def log_params(self, params: dict[str, Any]) -> None:
        """Params (an existing key may only be logged again with the same value)."""
        _log_params(client(self.uri), self.run_id, params)

    def log_artifacts(self, paths: Sequence[str | Path], under: str | None = None) -> None:
        """Files at the artifact root (or under ``under/``); a directory ``d`` goes under
        ``d.name/``."""
        c = client(self.uri)
        for p in paths:
            if Path(p).is_dir():
                c.log_artifacts(self.run_id, str(p), "/".join(x for x in (under, Path(p).name)
                                                              if x))
            else:
                c.log_artifact(self.run_id, str(p), under)

    def log_images(self, paths: Sequence[str | Path], section: str, step: int = 0) -> None:
        """PNGs as MLflow images (key: ``section/`` + the file's stem, at ``step``), which the
        run's Model metrics tab shows in the section ``section`` beside its charts."""
        from PIL import Image

        c = client(self.uri)
        for p in paths:
            with Image.open(p) as image:
                c.log_image(self.run_id, image.convert("RGB"), key=f"{section}/{Path(p).stem}",
                            step=step, synchronous=True)

    def log_text(self, text: str, path: str) -> None:
        """``text`` as the artifact ``path`` (e.g. ``failure/worker-1.log``)."""
        client(self.uri).log_text(self.run_id, text, path)

    def log_model(self, export_dir: str | Path, example: Any, step: int) -> str:
        """``net.export``'s files in ``export_dir`` as the run's logged model ``model``: the
        ``python_function`` flavour of :mod:`mxlarge.gluon_pyfunc`, with the signature inferred
        from ``example`` (a float32 batch) and the net's output on it. Returns its model id.

        Saved locally, then logged through this store's client: MLflow's ``log_model`` would
        read (and its URI switch rewrite) the process-wide tracking URI and experiment."""
        import mlflow.models
        import mlflow.pyfunc
        import mxnet as mx
        import numpy as np
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        from mxlarge import gluon_pyfunc

        output = gluon_pyfunc.GluonModel(export_dir).predict(example)
        c = client(self.uri)
        run = c.get_run(self.run_id)
        model = c.create_logged_model(run.info.experiment_id, name=model_name(
            run.data.tags.get("mlflow.runName", "")), source_run_id=self.run_id)
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(tmp) / "model"
            mlflow.pyfunc.save_model(
                str(local), loader_module="gluon_pyfunc", data_path=str(export_dir),
                code_paths=[gluon_pyfunc.__file__],
                pip_requirements=[f"mxnet=={mx.__version__}", f"numpy=={np.__version__}"],
                signature=mlflow.models.infer_signature(example, output), input_example=example)
            c.log_model_artifacts(model.model_id, str(local))
        c.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
        c.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, step)])
        return model.model_id

    def last_step(self) -> int | None:
        """The last step of the run's training metrics (``train/loss``, ``train/samples``),
        None before any."""
        steps = [step for key in ("train/loss", "train/samples")
                 for step, _ in metric_history(self.uri, self.run_id, key)]
        return max(steps, default=None)

    def model_id(self) -> str | None:
        """The id of the run's newest logged model (its URI is ``models:/ID``), None if it
        has none."""
        outputs = client(self.uri).get_run(self.run_id).outputs
        models = outputs.model_outputs if outputs is not None else []
        return models[-1].model_id if models else None

    def end(self, ok: bool, tags: dict[str, Any] | None = None) -> None:
        """FINISHED or FAILED, after the given tags (e.g. ``failure``)."""
        self.tag(tags or {})
        client(self.uri).set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")

    def status(self) -> str:
        return client(self.uri).get_run(self.run_id).info.status


@dataclass(frozen=True)
class OpenRun:
    """The run a process logs into, as :func:`open_run` decided it, and whether this process
    ends it (``owned``: it opened or reopened the run; otherwise a caller did and ends it)."""

    run: RunHandle
    owned: bool

    def close(self, ok: bool, tags: dict[str, Any] | None = None) -> None:
        """The one place a process's run is ended: FINISHED or FAILED after ``tags`` when this
        process owns it, else only the tags (the caller ends it)."""
        if self.owned:
            self.run.end(ok, tags)
        elif tags:
            self.run.tag(tags)


def open_run(cfg: Config, *, given: str | None, resumed: str | None, plan: Any,
             source: str | None, may_open: bool = True) -> OpenRun | None:
    """Which MLflow run this process logs into, decided once at its root; the training code
    receives the result.

    In order: the caller's run (``given``, i.e. ``--run-id``, else ``$MLFLOW_RUN_ID``: logged
    into, not ended here); else the run of the checkpoint being resumed (``resumed``, its
    ``run_id``: RUNNING again, so metrics continue at their steps); else a new run (named and
    described from ``plan`` and ``source``, :meth:`RunHandle.create`). ``None`` when tracking
    is off, or when no run is given and this process may not open one (``may_open`` false: a
    worker of rank > 0, whose rank 0 opens the job's run).

    Raises:
        InputError: ``given`` with tracking off; an unreachable store; a ``given`` or
            ``resumed`` run the store does not have (on reopening).
    """
    if not cfg.tracking.enabled:
        if given is not None:
            raise InputError(f"--run-id {given}: tracking.enabled is false")
        return None
    caller = caller_run_id(given, cfg)
    if caller is None and not may_open:
        return None
    uri = tracking_uri(cfg)
    check_reachable(uri)
    if caller is not None:
        return OpenRun(RunHandle(uri, caller), owned=False)
    if resumed:
        return OpenRun(RunHandle.reopen(uri, resumed), owned=True)
    return OpenRun(RunHandle.create(cfg, uri, plan=plan, source=source), owned=True)


def best_and_final(val_errors: Sequence[float]) -> dict[str, float]:
    """``val/best_accuracy`` = 1 − min error and ``val/final_error`` (median of the last 5
    evaluations, :func:`mxlarge.stats.final_error`) of the evaluations so far."""
    return {"val/best_accuracy": 1 - min(val_errors), "val/final_error": final_error(val_errors)}


class MLflowHook(Hook):
    """Rank 0: the config artifact, metrics with their step, the model, system metrics.

    The run's owner opens and ends it (its params and description come with it,
    :meth:`RunHandle.create`); this hook logs the built net's facts as ``net.*`` params, tags
    ``failure`` and ``failed_step`` if training raised. Per-step metrics come in
    ``StepOutput.metrics``, per-epoch ones in the epoch's metrics, files in ``loop.artifacts``
    (:mod:`mxlarge.hooks`). At step s, ``train/lr`` is the LR of update s (0-based; what
    ``mxlarge show --lr-at s`` prints) and ``train/samples`` = s × ``global_batch``; both are
    logged at step 0 and every ``log_every`` steps, and at each epoch's end. ``train/loss`` is
    the per-step series only (its epoch mean would draw the same curve again).
    ``val/best_accuracy`` and ``val/final_error`` cover every evaluation of the run, those
    before a resume included (read back from the store). ``example`` (a float32 batch of
    inputs) is the logged model's input example. The system metrics are sampled here
    (:func:`system_metrics`) unless a local launcher does it for the whole job (tag
    :data:`SAMPLED_BY`); ``launched``: the job's processes are those under this worker's parent.
    """

    stage = REPORT

    def __init__(self, cfg: Config, run: RunHandle, net_facts: dict[str, Any], log_every: int,
                 global_batch: int, example: Any = None, launched: bool = False):
        self.cfg = cfg
        self.run = run
        self.net_facts = net_facts
        self.log_every = log_every
        self.global_batch = global_batch
        self.example = example
        self.launched = launched
        self.val_errors: list[float] = []
        self.throughputs: list[float] = []
        self.monitor: Any = None

    def _axis(self, loop: Any, step: int) -> dict[str, float]:
        return {"train/lr": loop.trainer.lr_at(step), "train/samples": step * self.global_batch}

    def before_train(self, loop: Any) -> None:
        import psutil

        self.run.log_params({f"net.{k}": v for k, v in self.net_facts.items()})
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
            if error is not None:
                self.run.tag({"failure": f"{type(error).__name__}: {error}"[:4000],
                              "failed_step": loop.step})
            with tempfile.TemporaryDirectory() as tmp:
                files: list[str | Path] = [v for k, v in loop.artifacts.items() if k != "model"]
                if loop.history:
                    from mxlarge.reporting.plots import plot_training_curves
                    png = Path(tmp) / "training_curves.png"
                    plot_training_curves(loop.history, png, title=self.cfg.name)
                    files.append(png)
                self.run.log_artifacts(files)
            if "model" in loop.artifacts and self.example is not None:
                self.run.log_model(loop.artifacts["model"], self.example, loop.step)
        finally:
            if self.monitor is not None:
                self.monitor.finish()


# System metrics every 2 s (a 40-s run draws a curve), every 10 s (MLflow's default) once the
# sampler has run 5 minutes; $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL (MLflow's) wins.
SAMPLE_EVERY = (2.0, 10.0, 300.0)
# The run tag saying who samples the system metrics ("launcher": a local launcher, for the whole
# job, from before its processes start; else rank 0's MLflowHook, for its training).
SAMPLED_BY = "system_metrics_by"


class _Sampler(SystemMetricsMonitor):
    """MLflow's sampler (CPU, memory, disk, network, GPUs of this machine), switching from
    every ``SAMPLE_EVERY[0]`` to every ``SAMPLE_EVERY[1]`` seconds after ``SAMPLE_EVERY[2]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = time.monotonic()

    def collect_metrics(self) -> dict[str, Any]:
        if (self.sampling_interval == SAMPLE_EVERY[0]
                and time.monotonic() - self.started > SAMPLE_EVERY[2]):
            self.sampling_interval = SAMPLE_EVERY[1]  # a long run: fewer points
        return super().collect_metrics()


def system_metrics(run: RunHandle, root: int) -> SystemMetricsMonitor:
    """A started sampler of the run's ``system/`` metrics: MLflow's (resuming a resumed run's
    steps) and the job's processes, those of the process tree under ``root``
    (:class:`JobMonitor`); ``.finish()`` stops it."""
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its INFO chatter
    sampler = _Sampler(run.run_id, tracking_uri=run.uri, resume_logging=True,
                       sampling_interval=SAMPLE_EVERY[0])
    sampler.monitors.append(JobMonitor(root))
    sampler.start()
    return sampler


class JobMonitor(BaseMetricsMonitor):
    """The job's own processes on this machine, beside MLflow's machine-wide numbers:
    ``system/job_cpu_utilization_percentage`` (Σ over the processes of their CPU time per
    wall second × 100, so 200 = two cores busy), ``system/job_memory_usage_megabytes`` (Σ
    resident set sizes) and ``system/job_processes``: process ``root`` and every process under
    it (a local launcher: itself, the scheduler, servers and workers; a cluster job's worker:
    the process on its host that started it; ``mxlarge train``: itself)."""

    def __init__(self, root: int) -> None:
        import psutil

        super().__init__()
        self._psutil = psutil
        self.root = psutil.Process(root)
        self._seen: dict[int, Any] = {}  # pid -> psutil.Process (cpu_percent needs the same one)

    def collect_metrics(self) -> None:
        psutil = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return  # the root is gone: the job is ending
        cpu = memory = 0.0
        alive = {}
        for proc in procs:
            mine = self._seen.get(proc.pid, proc)
            try:
                cpu += mine.cpu_percent(None)  # since its previous call; 0.0 at the first
                memory += mine.memory_info().rss / 1e6
            except psutil.Error:
                continue
            alive[proc.pid] = mine
        self._seen = alive
        self._metrics["job_cpu_utilization_percentage"].append(cpu)
        self._metrics["job_memory_usage_megabytes"].append(memory)
        self._metrics["job_processes"].append(float(len(alive)))

    def aggregate_metrics(self) -> dict[str, float]:
        return {k: round(sum(v) / len(v), 1) for k, v in self._metrics.items()}


class RankThroughputHook(Hook):
    """Ranks other than 0 log their own ``perf/images_per_sec_rank{r}`` to the job's run
    (rank 0's comes with its :class:`MLflowHook`)."""

    stage = REPORT

    def __init__(self, run: RunHandle):
        self.run = run

    def after_epoch(self, loop: Any, epoch: int, metrics: dict[str, float]) -> None:
        own = {k: v for k, v in metrics.items() if k.startswith("perf/images_per_sec_rank")}
        if own:
            self.run.log_metrics(own, loop.step)


def load(run_id: str, uri: str | None = None, ctx: Any = None) -> Any:
    """The model a run logged, as a ``gluon.SymbolBlock`` ready for inference: its logged
    model (``models:/ID``), or in runs made before logged models its artifact ``model/``.

    ``uri`` defaults to :func:`tracking_uri` of a default config. Raises ``InputError`` if the
    run has no model (a run of a non-hybridized net, or one that failed).
    """
    from mlflow.artifacts import download_artifacts

    from mxlarge.gluon_pyfunc import import_net

    uri = uri or tracking_uri(Config())
    dst = tempfile.mkdtemp(prefix="mxlarge-model-")
    try:
        model = RunHandle(uri, run_id).model_id()
        if model is not None:
            where = client(uri).get_logged_model(model).artifact_location
            local = Path(download_artifacts(artifact_uri=where, dst_path=dst))
            # the pyfunc's data/ holds the export directory
            local = next((p.parent for p in local.glob("data/*/*-symbol.json")), local)
        else:
            local = Path(client(uri).download_artifacts(run_id, "model", dst))
    except mlflow.exceptions.MlflowException as exc:
        raise InputError(f"run {run_id!r} in {uri!r} has no model: "
                         f"{str(exc).splitlines()[0][:300]}") from None
    try:
        return import_net(local, ctx)
    except FileNotFoundError:
        raise InputError(f"run {run_id!r}: its model holds no exported symbol and "
                         "parameters") from None


def sweep_parent(uri: str, experiment: str, name: str, params: dict[str, Any] | None = None,
                 description: str = "") -> RunHandle:
    """The parent run of sweep ``name`` (tag ``sweep_parent``), reopened if a previous
    invocation made it (a resumed sweep keeps one parent), else created with ``params`` and
    ``description``."""
    found = find_runs(uri, experiment, {"sweep_parent": name})
    if found:
        return RunHandle.reopen(uri, found[0]["run_id"])
    return RunHandle.create_plain(uri, experiment, {"sweep_parent": name,
                                                    "mlflow.runName": f"sweep {name}",
                                                    "mlflow.note.content": description},
                                  params)


def find_sweep_parent(uri: str, experiment: str, name: str) -> RunHandle | None:
    found = find_runs(uri, experiment, {"sweep_parent": name})
    return RunHandle(uri, found[0]["run_id"]) if found else None


# ---------------------------------------------------------------------------------------------
# sweeps and reports (mxlarge.sweep, mxlarge.reporting): plain data in and out, no MLflow objects


def find_runs(uri: str, experiment: str, tags: dict[str, str],
              status: str | None = None) -> list[dict[str, Any]]:
    """Runs of ``experiment`` whose tags equal ``tags`` (and whose status is ``status``).

    Values without quotes go into the MLflow filter (fewer rows read); every condition is also
    checked here, so labels with quotes or spaces still match exactly.

    Returns:
        ``[{"run_id", "status", "start_time" (ms), "tags", "params", "metrics" (latest
        values)}]``, newest first; an
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
                        "params": dict(r.data.params), "metrics": dict(r.data.metrics)})
        token = page.token
        if not token:
            return out


def latest_metrics(uri: str, run_id: str) -> dict[str, float]:
    """``{key: latest value}`` of every metric of one run."""
    return dict(client(uri).get_run(run_id).data.metrics)


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric, ordered by step then logging time."""
    hist = client(uri).get_metric_history(run_id, key)
    return [(m.step, m.value) for m in sorted(hist, key=lambda m: (m.step, m.timestamp))]
