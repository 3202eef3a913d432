"""The per-rank step breakdown as a user sees it in MLflow (`make test-ui`, not part of
`make test`): one launched digits job (2 workers + 1 server, 3 epochs), its store served by
`mlflow server` on 127.0.0.1 and rendered by headless Chromium (tests/ui/browser.py): the run's
``breakdown`` tag naming the slowest rank and its host, the metric sections of the summary and of
each rank's parts, and the picture ``breakdown/ranks.png`` loaded as an image."""
from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import cli, mlflow_server
from tests.ui.browser import PICTURE_LOADED, evaluate

ROOT = Path(__file__).resolve().parents[2]
LARGEBATCH = str(ROOT / "experiments/proxy/digits-largebatch.yaml")
VIEW = "workflowType=machine_learning"
SHORT = ["train.progress=false", "train.epochs=3", "optim.decay_epochs=[1]",
         "optim.warmup_epochs=1"]

# the page's text once it shows ``want`` (MLflow renders late), else null
TEXT_WITH = """(() => {{
  const t = document.body ? document.body.innerText : '';
  return t.includes({want!r}) ? t : null;
}})()"""


def _text(port: int, route: str, want: str) -> str:
    shown = evaluate(f"http://127.0.0.1:{port}/#/{route}?{VIEW}",
                     TEXT_WITH.format(want=want), 120)
    assert shown, f"{route} never showed {want!r}"
    return re.sub(r"\s+", " ", shown)


@pytest.mark.timeout(600)
def test_a_launched_run_shows_each_ranks_breakdown_its_summary_and_picture(tmp_path):
    uri = f"sqlite:///{tmp_path}/ui.db"
    r = cli(["launch", LARGEBATCH, "-n", "2", "-s", "1", *SHORT], tmp_path,
            env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c = MlflowClient(tracking_uri=uri)
    (run,) = c.search_runs([c.get_experiment_by_name("mxlarge").experiment_id])
    slowest = int(run.data.metrics["breakdown/slowest_rank"])
    route = f"experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
    with mlflow_server(uri, tmp_path) as port:
        # the run's page: the summary tag, whole
        page = _text(port, route, "is the slowest")
        assert run.data.tags["breakdown"] in page, page[-3000:]
        assert f"worker rank {slowest} on {socket.gethostname()} is the slowest" in page
        # its charts: MLflow groups them by the part before the last '/', with their counts:
        # the summary's four, each rank's five parts
        charts = _text(port, f"{route}/model-metrics", "breakdown/rank1")
        for section in ("breakdown (4)", "breakdown/rank0 (5)", "breakdown/rank1 (5)"):
            assert section in charts, charts[-3000:]
        # the picture, an image that loads in the run's artifacts at its own size (750 x 420)
        shown = evaluate(f"http://127.0.0.1:{port}/#/{route}/artifacts/breakdown/ranks.png"
                         f"?{VIEW}", PICTURE_LOADED, 120)
        assert shown == [750, 420], shown
