"""Where a run is shown: its page, its experiment's runs list and its artifacts in the MLflow UI."""
from __future__ import annotations

from urllib.parse import urlencode

from mxlarge.tracking.store import RUNS_VIEW, client

# where `mlflow ui` / `mlflow server` listen unless told otherwise
UI_ADDRESS = "http://127.0.0.1:5000"


def _base(uri: str) -> str:
    """A tracking server's own address, else :data:`UI_ADDRESS`."""
    return uri.rstrip("/") if uri.startswith(("http://", "https://")) else UI_ADDRESS


def run_url(uri: str, run_id: str) -> str:
    """The run's page in the MLflow UI's training view (``workflowType=machine_learning``,
    which MLflow 3 otherwise opens as a GenAI experiment): at ``uri`` itself for a tracking
    server, else at the address ``mlflow ui --backend-store-uri URI`` serves (:data:`UI_ADDRESS`).
    """
    exp = client(uri).get_run(run_id).info.experiment_id
    return f"{_base(uri)}/#/experiments/{exp}/runs/{run_id}?workflowType=machine_learning"


def runs_url(uri: str, experiment_id: str) -> str:
    """The experiment's runs list in the training view with
    :data:`~mxlarge.tracking.store.RUNS_VIEW`'s columns
    (:func:`~mxlarge.tracking.store.share_runs_view`)."""
    return (f"{_base(uri)}/#/experiments/{experiment_id}/runs?viewStateShareKey={RUNS_VIEW}"
            "&workflowType=machine_learning")


def ui_hint(uri: str, run_id: str) -> str:
    """``URL`` and, for a local store, the command that serves it; then the runs list's URL."""
    url = run_url(uri, run_id)
    listed = runs_url(uri, client(uri).get_run(run_id).info.experiment_id)
    if uri.startswith(("http://", "https://")):
        return f"{url} (runs list: {listed})"
    return f"{url} (serve it with: mlflow ui --backend-store-uri {uri}; runs list: {listed})"


def artifact_src(run_id: str, path: str) -> str:
    """The address of the run's artifact ``path`` relative to the MLflow UI's page (the UI's own
    ``get-artifact`` route), so that a run's description shows an artifact image wherever the
    UI is served (``![plot](artifact_src(...))``)."""
    return "get-artifact?" + urlencode({"path": path, "run_uuid": run_id})
