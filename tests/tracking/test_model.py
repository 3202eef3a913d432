"""The logged model (mxlarge/tracking/model.py) carries the run's params, description and final
metrics, and its name is unique in the experiment even when two runs' names give the same one."""
import numpy as np

from mxlarge import tracking


def _export(tmp_path):
    import mxnet as mx

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    example = np.ones((2, 4), dtype=np.float32)
    net(mx.nd.array(example))
    (tmp_path / "model").mkdir()
    net.export(str(tmp_path / "model" / "model"))
    return tmp_path / "model", example


def _run(uri, name):
    run = tracking.RunHandle.create_plain(uri, "mxlarge", {
        "mlflow.runName": name, "mlflow.note.content": "**digits** on 2 workers"},
        {"optim.base_lr": 0.8, "dist.workers": 2})
    run.log_metrics({"val/accuracy": 0.5, "train/loss": 2.0}, 5)
    run.log_metrics({"val/accuracy": 0.9, "train/loss": 1.0, "system/cpu": 3.0}, 10)
    return run


def test_the_logged_model_carries_the_runs_params_metrics_and_description(mlflow_uri, tmp_path):
    export, example = _export(tmp_path)
    run = _run(mlflow_uri, "digits-largebatch s0")
    c = tracking.client(mlflow_uri)
    model = c.get_logged_model(run.log_model(export, example, 10))
    assert model.name == "digits-largebatch-s0"
    assert model.params == {"optim.base_lr": "0.8", "dist.workers": "2"}
    assert {m.key: (m.step, m.value) for m in model.metrics} == {
        "val/accuracy": (10, 0.9), "train/loss": (10, 1.0)}  # the final ones, no system/
    assert model.tags["mlflow.note.content"] == "**digits** on 2 workers"
    # the run's own history is unchanged: one point per step
    assert [m.step for m in c.get_metric_history(run.run_id, "val/accuracy")] == [5, 10]


def test_logged_model_names_are_unique_in_the_experiment(mlflow_uri, tmp_path):
    export, example = _export(tmp_path)
    c = tracking.client(mlflow_uri)
    names = [c.get_logged_model(_run(mlflow_uri, "digits · 2×128").log_model(
        export, example, 10)).name for _ in range(3)]
    assert names == ["digits-2x128", "digits-2x128-2", "digits-2x128-3"]


def test_logging_a_model_does_not_say_it_checks_the_input_example(mlflow_uri, tmp_path, capfd,
                                                                  caplog):
    """MLflow's INFO line on checking the example against the signature is not printed; the
    check still runs, and the logger's other records (warnings) still pass."""
    import logging

    from mxlarge.tracking.model import CHECKING_EXAMPLE, without_line

    export, example = _export(tmp_path)
    with caplog.at_level(logging.INFO, logger="mlflow"):
        _run(mlflow_uri, "quiet s0").log_model(export, example, 10)
        with without_line("mlflow.pyfunc", CHECKING_EXAMPLE):
            logging.getLogger("mlflow.pyfunc").warning("a warning passes")
    out, err = capfd.readouterr()
    logged = [r.getMessage() for r in caplog.records]
    assert CHECKING_EXAMPLE not in out + err and CHECKING_EXAMPLE not in logged
    assert "a warning passes" in logged
    assert not logging.getLogger("mlflow.pyfunc").filters  # removed once the model is saved
