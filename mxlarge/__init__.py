"""mxlarge: large-minibatch SGD (Goyal et al. 2017) for MXNet Gluon on dist_sync, tracked in MLflow.

Importing the package does not import MXNet: a process started as a ps-lite scheduler or server
runs its role inside ``import mxnet`` and must not have imported anything else first.
"""
from typing import Any

__version__ = "0.2.0"  # the one place; CHANGELOG.md says what each version changed

__all__ = ["Trainer", "load", "log_model", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Trainer":
        from mxlarge.trainer import Trainer
        return Trainer
    if name == "load":  # mxlarge.load(run_id, uri=None): a run's exported model
        from mxlarge.tracking import load
        return load
    if name == "log_model":  # mxlarge.log_model(trainer, net, example): into the job's run
        from mxlarge.tracking.script import log_model
        return log_model
    raise AttributeError(name)
