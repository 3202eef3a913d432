"""Fixtures every test folder shares: run the CLI, and a fresh MLflow store per test.

* ``run_cli(args, cwd, env=None, timeout=240)``: ``python -m mxlarge.cli ARGS`` in a
  subprocess; ``MLFLOW_TRACKING_URI`` is dropped unless ``env`` sets it, so a run without a store
  of its own writes ``cwd/mlruns.db``.
* ``mlflow_uri``: an empty sqlite store in ``tmp_path`` (a copy of one made once per session:
  creating the schema takes 5-20 s, copying it does not), also exported as
  ``MLFLOW_TRACKING_URI`` for in-process code and children.
* every test under ``tests/e2e``, ``tests/launcher`` and ``tests/cluster`` has ``mlflow_uri``:
  a job launched by ``python -m mxlarge.launcher`` is an MLflow run, and a store made by
  each launch would add its 5-20 s to every test that launches one.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import cli


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess]:
    return cli


@pytest.fixture(scope="session")
def _empty_mlflow_db(tmp_path_factory) -> Path:
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-schema") / "mlruns.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments(max_results=1)
    return path


@pytest.fixture
def mlflow_uri(tmp_path, _empty_mlflow_db, monkeypatch) -> str:
    shutil.copy(_empty_mlflow_db, tmp_path / "mlruns.db")
    uri = f"sqlite:///{tmp_path}/mlruns.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


LAUNCHING = ("e2e", "launcher", "cluster")


@pytest.fixture(autouse=True)
def _launches_log_into_a_made_store(request, tmp_path_factory, _empty_mlflow_db,
                                    monkeypatch) -> None:
    """Beside ``tmp_path``, not in it: a test may check that nothing was written there."""
    if any(part in LAUNCHING for part in request.node.path.parts[-3:-1]):
        store = tmp_path_factory.mktemp("launch-store") / "mlruns.db"
        shutil.copy(_empty_mlflow_db, store)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
