"""Live progress where users look: a launched job's output (a pipe) gets a line every
``train.log_every`` steps, and no carriage-return frames."""
import re
from pathlib import Path

import pytest

from tests.helpers import EQ_CONFIG, cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_launched_job_prints_a_progress_line_every_log_every_steps(tmp_path):
    cfg = tmp_path / "eq.yaml"
    cfg.write_text(EQ_CONFIG)
    r = cli(["launch", str(cfg), "-n", "2", "-s", "1", "train.max_steps=30",
             "train.log_every=10", "train.progress=true"], tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # every process exited by itself: no worker had to be ended after it finished
    assert "job finished: 2 worker(s), 1 server(s) and the scheduler exited 0" in r.stdout
    assert "[launcher] warning" not in r.stdout
    lines = re.findall(r"step (\d+)/(\d+) epoch 1/1 loss=(\S+) lr=(\S+) images/s=(\S+) "
                       r"eta=(\S+)", r.stdout)
    assert [int(s) for s, *_ in lines] == [10, 20, 30]
    assert {int(t) for _, t, *_ in lines} == {30}
    assert all(float(ips) > 0 and float(loss) > 0 for _, _, loss, _, ips, _ in lines)
    assert "\r" not in r.stdout + r.stderr


def _agreement(r, uri):
    """(progress line's images/s, perf/images_per_sec) at each epoch's last step."""
    from mlflow.tracking import MlflowClient

    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    shown = {int(s): float(ips) for s, ips in re.findall(
        r"step (\d+)/\d+ epoch \d+/\d+ loss=\S+ lr=\S+ images/s=(\S+) eta=", r.stdout)}
    c = MlflowClient(tracking_uri=uri)
    (run,) = c.search_runs([c.get_experiment_by_name("mxlarge").experiment_id])
    logged = {m.step: m.value for m in c.get_metric_history(run.info.run_id,
                                                            "perf/images_per_sec")}
    assert logged and set(logged) <= set(shown), (sorted(shown), sorted(logged))
    return [(shown[s], logged[s]) for s in sorted(logged)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["train", "launch"])
def test_the_progress_lines_images_per_sec_is_perf_images_per_sec(tmp_path, mlflow_uri, how):
    """One images/s: at an epoch's last step the progress line shows that epoch's
    `perf/images_per_sec` (training steps only), within 5%, on one process and on 2 workers."""
    cfg = ("experiments/proxy/digits-baseline.yaml" if how == "train"
           else "experiments/proxy/digits-largebatch.yaml")
    # 1,400 images: 43 steps of 32 (one process, or 2 workers x 16) per epoch, a line at each
    # end (epochs long enough that a few ms of one worker's clock are not 5%)
    batch = 32 if how == "train" else 16
    args = [how, f"{ROOT}/{cfg}", f"data.batch_size={batch}", "model.width=32",
            "train.epochs=3", "train.log_every=43", "train.progress=false",
            "optim.decay_epochs=[2]", "optim.warmup=none",
            *(["-n", "2", "-s", "1"] if how == "launch" else [])]
    pairs = _agreement(cli(args, tmp_path, env={"MLFLOW_TRACKING_URI": mlflow_uri}),
                       mlflow_uri)
    assert len(pairs) == 3
    for shown, logged in pairs:
        assert shown == pytest.approx(logged, rel=0.05), pairs
