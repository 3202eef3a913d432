"""MLflowHook draws the training curves with the plot function it is given (tracking imports
nothing of reporting), and without one logs no curves."""
from types import SimpleNamespace

from mxlarge import tracking
from mxlarge.config import Config


def _after_train(uri, plot):
    run = tracking.RunHandle.create_plain(uri, "mxlarge", {"mlflow.runName": "t"})
    hook = tracking.MLflowHook(Config(), run, {}, log_every=1, global_batch=1, plot=plot)
    loop = SimpleNamespace(step=3, artifacts={}, history=[{"epoch": 0, "train/loss": 1.0}])
    hook.after_train(loop, None)
    return [f.path for f in tracking.client(uri).list_artifacts(run.run_id)]


def test_the_given_plot_draws_the_training_curves(mlflow_uri):
    drawn = []

    def plot(history, path, title=""):
        drawn.append((history, title))
        path.write_bytes(b"png")

    assert _after_train(mlflow_uri, plot) == ["training_curves.png"]
    assert drawn == [([{"epoch": 0, "train/loss": 1.0}], Config().name)]


def test_no_plot_no_curves(mlflow_uri):
    assert _after_train(mlflow_uri, None) == []
