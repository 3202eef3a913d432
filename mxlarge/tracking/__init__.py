"""MLflow tracking: the only package that imports ``mlflow``, and the owner of a run's life.

A job's run is a :class:`RunHandle` (store URI + run id) passed down as a value; which run a
process logs into is decided once, by :func:`open_run`, and ended by :meth:`OpenRun.close`:
whoever opens a run ends it. The modules, each importing only those before it:

* :mod:`~mxlarge.tracking.store`: the URI, the experiment, a client, the system tags;
* :mod:`~mxlarge.tracking.urls`: a run's page, the runs list and an artifact in the MLflow UI;
* :mod:`~mxlarge.tracking.naming`: a run's name, description and params;
* :mod:`~mxlarge.tracking.queries`: plain-data reads for sweeps and reports;
* :mod:`~mxlarge.tracking.model`: the logged model, and :func:`load` back;
* :mod:`~mxlarge.tracking.run`: :class:`RunHandle`, :func:`open_run`, a sweep's parent run;
* :mod:`~mxlarge.tracking.system`: the ``system/`` metrics sampler;
* :mod:`~mxlarge.tracking.hook`: the loop's hooks (the plot function is passed in: nothing
  here imports :mod:`mxlarge.reporting`).

The conventions and rules (store precedence, what a run holds, who opens and ends it):
docs/design/tracking.md.
"""
from mxlarge.tracking.hook import MLflowHook, Plot, RankThroughputHook, best_and_final
from mxlarge.tracking.model import load, log_model, model_id, model_name, unique_model_name
from mxlarge.tracking.naming import (
    REPO_ROOT,
    TAKES_EFFECT,
    as_written,
    describe_run,
    run_name,
    run_params,
    shown_path,
    takes_effect,
)
from mxlarge.tracking.queries import find_runs, latest_metrics, metric_history
from mxlarge.tracking.run import (
    OpenRun,
    RunHandle,
    find_sweep_parent,
    open_command_run,
    open_run,
    script_of,
    sweep_parent,
    unique_run_name,
)
from mxlarge.tracking.store import (
    DEFAULT_URI,
    EXPERIMENT_KIND,
    RUNS_COLUMNS,
    RUNS_VIEW,
    caller_run_id,
    check_reachable,
    client,
    experiment_id,
    experiment_name,
    git_commit,
    share_runs_view,
    system_tags,
    tracking_uri,
)
from mxlarge.tracking.system import SAMPLE_EVERY, SAMPLED_BY, JobMonitor, system_metrics
from mxlarge.tracking.urls import UI_ADDRESS, artifact_src, run_url, runs_url, ui_hint

__all__ = [
    "DEFAULT_URI", "EXPERIMENT_KIND", "REPO_ROOT", "RUNS_COLUMNS", "RUNS_VIEW", "SAMPLED_BY",
    "SAMPLE_EVERY", "TAKES_EFFECT", "UI_ADDRESS", "JobMonitor", "MLflowHook", "OpenRun", "Plot",
    "RankThroughputHook", "RunHandle", "artifact_src", "as_written", "best_and_final",
    "caller_run_id", "check_reachable", "client", "describe_run", "experiment_id",
    "experiment_name", "find_runs", "find_sweep_parent", "git_commit", "latest_metrics", "load",
    "log_model", "metric_history", "model_id", "model_name", "open_command_run", "open_run",
    "run_name", "run_params", "run_url", "runs_url", "script_of", "share_runs_view",
    "shown_path", "sweep_parent", "system_metrics",
    "system_tags", "takes_effect", "tracking_uri", "ui_hint", "unique_model_name",
    "unique_run_name",
]
