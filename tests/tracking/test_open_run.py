"""Which MLflow run a process logs into: decided by tracking.open_run, ended by OpenRun.close."""
import dataclasses

import pytest

from mxlarge import tracking
from mxlarge.config import Config
from mxlarge.errors import InputError
from mxlarge.plan import plan_for


def _cfg(enabled=True):
    cfg = Config()
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, enabled=enabled))


def _open(cfg, **kw):
    kw.setdefault("given", None)
    kw.setdefault("resumed", None)
    return tracking.open_run(cfg, plan=plan_for(cfg), source=None, **kw)


def test_tracking_off_means_no_run_and_a_given_one_is_refused(monkeypatch):
    monkeypatch.setenv("MLFLOW_RUN_ID", "ignored-when-off")
    assert _open(_cfg(False)) is None
    with pytest.raises(InputError, match="--run-id abc: tracking.enabled is false"):
        _open(_cfg(False), given="abc")


def test_a_new_run_is_owned_and_closed_finished(mlflow_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    opened = _open(_cfg())
    assert opened.owned and opened.run.uri == mlflow_uri
    assert opened.run.status() == "RUNNING"
    opened.close(True, {"hosts": "h1"})
    assert opened.run.status() == "FINISHED"
    assert tracking.client(mlflow_uri).get_run(opened.run.run_id).data.tags["hosts"] == "h1"


def test_a_callers_run_is_joined_and_left_to_the_caller(mlflow_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    callers = _open(_cfg())
    for given, env in ((callers.run.run_id, None), (None, callers.run.run_id)):
        if env:
            monkeypatch.setenv("MLFLOW_RUN_ID", env)  # MLflow's convention, as --run-id
        joined = _open(_cfg(), given=given, may_open=False)  # even a rank > 0 joins it
        assert joined == tracking.OpenRun(callers.run, owned=False)
        joined.close(False, {"failure": "x"})
        assert callers.run.status() == "RUNNING"  # tags only: the caller ends it
    monkeypatch.delenv("MLFLOW_RUN_ID")
    assert _open(_cfg(), may_open=False) is None  # rank > 0 without a job's run: rank 0 opens


def test_a_resumed_checkpoints_run_is_reopened_and_owned(mlflow_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    first = _open(_cfg())
    first.close(False)
    again = _open(_cfg(), resumed=first.run.run_id)
    assert again == tracking.OpenRun(first.run, owned=True)
    assert first.run.status() == "RUNNING"
    with pytest.raises(InputError, match="MLflow run 'nope' cannot be opened"):
        _open(_cfg(), resumed="nope")


def test_params_are_the_keys_that_take_effect_and_models_are_named_after_runs():
    from mxlarge.config import load_config

    plain = load_config("experiments/proxy/digits-largebatch.yaml", [])
    params = tracking.run_params(plain, "sqlite:///x.db", plan_for(plain))
    for key in ("optim.lars_eta", "optim.lars_lr", "optim.poly_power", "train.gns_decay",
                "dist.compression_threshold", "train.keep_last", "train.max_steps",
                "optim.warmup_lr"):
        assert key not in params, key
    assert "" not in params.values() and params["optim.decay_epochs"] == "[15.0, 22.5]"
    on = load_config("experiments/proxy/digits-largebatch.yaml", [
        "optim.lars=true", "optim.lars_lr=5", "optim.decay=poly", "train.gns_every=5",
        "dist.compression=2bit", "train.max_steps=9"])
    params = tracking.run_params(on, "sqlite:///x.db", plan_for(on))
    for key in ("optim.lars_eta", "optim.lars_lr", "optim.poly_power", "train.gns_decay",
                "dist.compression_threshold", "train.max_steps"):
        assert key in params, key
    assert "optim.decay_epochs" not in params  # poly decay, not step
    assert tracking.model_name("s0 · 16x recipe (LARS) · 2×128") == "s0-16x-recipe-LARS-2x128"
