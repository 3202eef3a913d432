"""A run's model: logged as an MLflow logged model, loaded back as a ``gluon.SymbolBlock``.

The ``python_function`` flavour over ``net.export``'s files (:mod:`mxlarge.gluon_pyfunc`),
named after the run, with a signature and an input example.
"""
from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow

from mxlarge.config import Config
from mxlarge.errors import InputError
from mxlarge.tracking.store import client, tracking_uri


def model_name(run_name: str) -> str:
    """The logged model's name: the run's (``s0 · digits · 2×128`` → ``s0-digits-2x128``), in
    the characters MLflow allows in one (no ``/ : . % " '``)."""
    words = re.sub(r"[^A-Za-z0-9_-]+", "-", run_name.replace("×", "x")).strip("-")
    return words or "model"


def unique_model_name(c: Any, experiment_id: str, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``, ... if a logged model of the experiment has it."""
    taken = {m.name for m in c.search_logged_models(
        [experiment_id], filter_string=f"name LIKE '{name}%'", max_results=1000)}
    n = 1
    while (candidate := name if n == 1 else f"{name}-{n}") in taken:
        n += 1
    return candidate


# MLflow 3.17's pyfunc ``save_model`` says this at INFO on every run that logs a model; the check
# itself stays (a mismatch raises), only the line goes
CHECKING_EXAMPLE = "Validating input example against model signature"


class _DropLine(logging.Filter):
    """Drops the records whose message is exactly ``line``; every other record passes."""

    def __init__(self, line: str):
        super().__init__()
        self.line = line

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.line


@contextmanager
def without_line(logger: str, line: str) -> Iterator[None]:
    """While inside, logger ``logger`` (not its children) emits no record whose message is
    ``line``; its warnings, errors and other lines pass."""
    drop = _DropLine(line)
    logging.getLogger(logger).addFilter(drop)
    try:
        yield
    finally:
        logging.getLogger(logger).removeFilter(drop)


def _final_metrics(c: Any, run: Any, model: str) -> list[Any]:
    """The run's metrics as they stand (the last point of each, ``system/`` left out: the
    sampler is still running), as points of the logged model ``model`` (MLflow records a point
    that is already the run's only once in the run)."""
    from mlflow.entities import Metric

    out = []
    for key in sorted(run.data.metrics):
        if key.startswith("system/"):
            continue
        history = c.get_metric_history(run.info.run_id, key)
        if history:
            last = max(history, key=lambda m: (m.step, m.timestamp))
            out.append(Metric(key, last.value, last.timestamp, last.step, model_id=model,
                              run_id=run.info.run_id))
    return out


def log_model(uri: str, run_id: str, export_dir: str | Path, example: Any, step: int) -> str:
    """``net.export``'s files in ``export_dir`` as run ``run_id``'s logged model: the
    ``python_function`` flavour of :mod:`mxlarge.gluon_pyfunc`, with the signature inferred
    from ``example`` (a float32 batch) and the net's output on it, named after the run (unique
    in the experiment, :func:`unique_model_name`), with the run's params, description and final
    metrics (:func:`_final_metrics`). Returns its model id.

    Saved locally, then logged through this store's client: MLflow's ``log_model`` would
    read (and its URI switch rewrite) the process-wide tracking URI and experiment."""
    import mlflow.models
    import mlflow.pyfunc
    import mxnet as mx
    import numpy as np
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    from mxlarge import gluon_pyfunc

    output = gluon_pyfunc.GluonModel(export_dir).predict(example)
    c = client(uri)
    run = c.get_run(run_id)
    name = unique_model_name(c, run.info.experiment_id,
                             model_name(run.data.tags.get("mlflow.runName", "")))
    note = run.data.tags.get("mlflow.note.content")
    model = c.create_logged_model(run.info.experiment_id, name=name, source_run_id=run_id,
                                  params=dict(run.data.params),
                                  tags={"mlflow.note.content": note} if note else None)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "model"
        with without_line("mlflow.pyfunc", CHECKING_EXAMPLE):
            mlflow.pyfunc.save_model(
                str(local), loader_module="gluon_pyfunc", data_path=str(export_dir),
                code_paths=[gluon_pyfunc.__file__],
                pip_requirements=[f"mxnet=={mx.__version__}", f"numpy=={np.__version__}"],
                signature=mlflow.models.infer_signature(example, output),
                input_example=example)
        c.log_model_artifacts(model.model_id, str(local))
    metrics = _final_metrics(c, run, model.model_id)
    for lo in range(0, len(metrics), 100):
        c.log_batch(run_id, metrics=metrics[lo:lo + 100])
    c.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    c.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
    return model.model_id


def model_id(uri: str, run_id: str) -> str | None:
    """The id of the run's newest logged model (its URI is ``models:/ID``), None if it
    has none."""
    outputs = client(uri).get_run(run_id).outputs
    models = outputs.model_outputs if outputs is not None else []
    return models[-1].model_id if models else None


def load(run_id: str, uri: str | None = None, ctx: Any = None) -> Any:
    """The model a run logged, as a ``gluon.SymbolBlock`` ready for inference: its logged
    model (``models:/ID``), or in runs made before logged models its artifact ``model/``.

    ``uri`` defaults to :func:`~mxlarge.tracking.store.tracking_uri` of a default config.
    Raises ``InputError`` if the run has no model (a run of a non-hybridized net, or one that
    failed).
    """
    from mlflow.artifacts import download_artifacts

    from mxlarge.gluon_pyfunc import import_net

    uri = uri or tracking_uri(Config())
    dst = tempfile.mkdtemp(prefix="mxlarge-model-")
    try:
        model = model_id(uri, run_id)
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
