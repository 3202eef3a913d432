"""Where runs are stored: the tracking URI, the experiment, a client of the store.

The store is ``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else :data:`DEFAULT_URI`; the
experiment ``tracking.experiment``, else ``$MLFLOW_EXPERIMENT_NAME``, else ``mxlarge``
(the rules: 'Store and experiment' in docs/design/tracking.md).
"""
from __future__ import annotations

import fcntl
import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from mxlarge.config import Config
from mxlarge.errors import InputError

DEFAULT_URI = "sqlite:///mlruns.db"
REPO_ROOT = Path(__file__).resolve().parents[2]

# MLflow's shared view of an experiment's runs list: the experiment tag
# `mlflow.sharedViewState.<key>` holds the view as JSON and the list's URL names it as
# `viewStateShareKey` (the mechanism of the UI's own "Share" of a view; it reads plain JSON
# there, tests/ui shows the columns). The columns a user compares first: quality, throughput.
RUNS_VIEW = "mxlarge"
RUNS_COLUMNS = ("val/final_error_pct", "val/best_accuracy", "perf/images_per_sec_median",
                "train/loss")
# The Run Name column's width in that view, in pixels: MLflow's own 190 shows 17 characters of a
# name (`digits-largebatch`, then "..."); this shows about 30 (`digits-largebatch 100ep s0`).
RUN_NAME_WIDTH = 300
# The experiment tag MLflow 3's UI reads to choose an experiment's page: without it (or with
# `genai_development`) a link to the experiment opens the GenAI overview (traces, tokens); the
# classic kind opens the training view (runs, metrics, models).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


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
    """A client of ``uri``; a new sqlite store's schema is created under an exclusive ``flock``
    on its directory, once per process (why: 'The sqlite lock' in docs/design/tracking.md)."""
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
    """The commit of the checkout mxlarge runs from, "" outside one."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5, cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def experiment_id(c: MlflowClient, name: str) -> str:
    """The experiment ``name``'s id, created with the shared runs view and the classic kind
    (:data:`EXPERIMENT_KIND`) if new; an existing one without them (made by MLflow, or by an
    older mxlarge) gets them, and an older view the current one."""
    exp = c.get_experiment_by_name(name)
    if exp is None:
        made = c.create_experiment(name, tags=dict([EXPERIMENT_KIND]))
        share_runs_view(c, made)
        return made
    if exp.tags.get(f"mlflow.sharedViewState.{RUNS_VIEW}") != runs_view():
        share_runs_view(c, exp.experiment_id)
    key, kind = EXPERIMENT_KIND
    if key not in exp.tags:  # a kind the user chose stays
        c.set_experiment_tag(exp.experiment_id, key, kind)
    return exp.experiment_id


def runs_view() -> str:
    """:data:`RUNS_VIEW` as MLflow's UI reads it: the metric columns :data:`RUNS_COLUMNS` and
    the Run Name column :data:`RUN_NAME_WIDTH` wide (the UI applies a width only to a column
    the view orders)."""
    name = "attributes.`Run Name`"
    return json.dumps({"selectedColumns": [f"metrics.`{k}`" for k in RUNS_COLUMNS],
                       "columnOrder": [name], "columnWidths": {name: RUN_NAME_WIDTH}})


def share_runs_view(c: MlflowClient, experiment_id: str) -> None:
    """Tags the experiment with :data:`RUNS_VIEW` (:func:`runs_view`), which the runs list's
    link names (:func:`mxlarge.tracking.urls.runs_url`)."""
    c.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{RUNS_VIEW}", runs_view())
