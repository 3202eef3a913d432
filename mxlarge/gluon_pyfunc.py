"""The ``python_function`` loader of a logged mxlarge model: a standalone file, copied into each
logged model (``code/gluon_pyfunc.py``), so the model loads with MXNet and NumPy alone.

A logged model's ``data/`` is ``net.export``'s ``model-symbol.json`` + ``model-0000.params``
(MLflow 3 has no Gluon flavour). ``mlflow.pyfunc.load_model(uri).predict(x)`` with a float32
batch ``x`` of shape ``(N, *input_shape)`` returns the net's output ``(N, classes)``, the same
numbers as ``mxlarge.load(run_id)(mx.nd.array(x))``. No mxlarge or MLflow import here.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any


def import_net(directory: str | Path, ctx: Any = None) -> Any:
    """The exported net in ``directory`` as a ``gluon.SymbolBlock`` (input ``data``).

    Raises:
        FileNotFoundError: no ``*-symbol.json`` with ``*.params`` in ``directory``.
    """
    import mxnet as mx

    directory = Path(directory)
    symbols = sorted(directory.glob("*-symbol.json"))
    params = sorted(directory.glob("*.params"))
    if not symbols or not params:
        raise FileNotFoundError(f"{directory}: no exported symbol (*-symbol.json) and "
                                "parameters (*.params)")
    with warnings.catch_warnings():
        # imports() cannot infer the input's dtype from the symbol and warns; it is float32,
        # the default it then uses
        warnings.filterwarnings("ignore", message="Cannot decide type")
        return mx.gluon.SymbolBlock.imports(str(symbols[0]), ["data"], str(params[0]),
                                            ctx=ctx or mx.cpu())


class GluonModel:
    """``predict(x)``: the exported net's output for a float32 batch, as a NumPy array."""

    def __init__(self, directory: str | Path):
        self.net = import_net(directory)

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        import mxnet as mx
        import numpy as np

        x = np.asarray(model_input, dtype=np.float32)
        return self.net(mx.nd.array(x)).asnumpy()


def _load_pyfunc(path: str) -> GluonModel:
    """MLflow's ``loader_module`` entry point: ``path`` is the model's ``data/``."""
    return GluonModel(path)
