"""The experiment a run lands in is of MLflow's classic kind (`mlflow.experimentKind` =
`custom_model_development`: runs, metrics and models, not traces and tokens), which MLflow's
clients read (MLflow 3.17's UI follows its own switch or a link's workflowType instead:
tests/ui), and carries the runs list's shared view."""
import json

from mlflow.tracking import MlflowClient

from mxlarge import tracking


def test_a_new_experiment_is_of_the_classic_kind(mlflow_uri):
    c = tracking.client(mlflow_uri)
    exp = tracking.experiment_id(c, "fresh")
    tags = MlflowClient(tracking_uri=mlflow_uri).get_experiment(exp).tags
    assert tracking.EXPERIMENT_KIND == ("mlflow.experimentKind", "custom_model_development")
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert f"mlflow.sharedViewState.{tracking.RUNS_VIEW}" in tags


def test_an_existing_experiment_without_a_kind_gets_it_and_a_chosen_kind_stays(mlflow_uri):
    plain = MlflowClient(tracking_uri=mlflow_uri)
    old = plain.create_experiment("made-before")  # by MLflow, or by an older mxlarge
    chosen = plain.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    c = tracking.client(mlflow_uri)
    assert tracking.experiment_id(c, "made-before") == old
    assert plain.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    assert tracking.experiment_id(c, "chosen") == chosen
    assert plain.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"


def test_a_run_opens_in_an_experiment_of_the_classic_kind(mlflow_uri):
    run = tracking.RunHandle.create_plain(mlflow_uri, "mxlarge", {"mlflow.runName": "t"})
    plain = MlflowClient(tracking_uri=mlflow_uri)
    exp = plain.get_run(run.run_id).info.experiment_id
    assert plain.get_experiment(exp).tags["mlflow.experimentKind"] == "custom_model_development"


def test_the_runs_view_shows_the_metric_columns_and_whole_names(mlflow_uri):
    plain = MlflowClient(tracking_uri=mlflow_uri)
    old = plain.create_experiment("older-view", tags={
        f"mlflow.sharedViewState.{tracking.RUNS_VIEW}": '{"selectedColumns": []}'})
    tracking.experiment_id(tracking.client(mlflow_uri), "older-view")  # the current view
    view = json.loads(plain.get_experiment(old).tags[
        f"mlflow.sharedViewState.{tracking.RUNS_VIEW}"])
    assert view["selectedColumns"] == [f"metrics.`{k}`" for k in tracking.RUNS_COLUMNS]
    # MLflow applies a width only to a column the view orders; its own 190 px cut
    # `digits-largebatch 2ep s0` after `digits-largebatch` (make test-ui checks the page)
    name = "attributes.`Run Name`"
    assert view["columnOrder"] == [name] and view["columnWidths"] == {name: 300}
