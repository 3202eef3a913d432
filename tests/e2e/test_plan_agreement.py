"""`mxlarge show` prints exactly what `train`/`launch` run: for every experiment YAML, with and
without simulated workers, devices and `-n`, the plan of `show --json` equals the plan a 1-step
run logs to MLflow (tags) and its first logged LR."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mxlarge.cli import main
from mxlarge.data.tiny import make_imagenet

ROOT = Path(__file__).resolve().parents[2]
PROXY = sorted((ROOT / "experiments/proxy").glob("*.yaml"))
IMAGENET = sorted((ROOT / "experiments/imagenet").glob("*.yaml"))
ONE_STEP = ["train.max_steps=1", "train.log_every=1", "train.progress=false"]
PLAN_KEYS = ("workers", "devices_per_worker", "simulated_workers", "per_device_batch",
             "world_size", "global_batch", "train_samples", "train_samples_from",
             "steps_per_epoch", "total_steps", "peak_lr", "warmup_lr", "warmup_steps",
             "decay_steps")
LOCAL = ["dist.kvstore=local", "dist.workers=1"]


def _variants() -> list[tuple[str, Path, str, list[str]]]:
    """(id, config, verb, overrides): every file as written (train or launch by its store), and
    the same with simulated workers, devices, and -n."""
    out = []
    for path in PROXY:
        dist = "dist_sync" in path.read_text()
        out.append((f"{path.stem}", path, "launch" if dist else "train", []))
        out.append((f"{path.stem}-sim3", path, "train", [*LOCAL, "dist.simulate_workers=3"]))
        out.append((f"{path.stem}-dev2", path, "train", [*LOCAL, "dist.devices=2"]))
    out.append(("largebatch-n3", ROOT / "experiments/proxy/digits-largebatch.yaml", "launch",
                ["-n", "3", "data.batch_size=64"]))
    tiny = ["data.train_samples=null", "data.num_classes=4", "data.batch_size=2",
            "data.image_size=32", "data.resize=36", "data.threads=1", "dist.device_type=cpu"]
    for path in IMAGENET:
        out.append((f"{path.stem}-sim4", path, "train",
                    [*tiny, *LOCAL, "dist.devices=1", "dist.simulate_workers=4"]))
        out.append((f"{path.stem}-dev2", path, "train", [*tiny, *LOCAL, "dist.devices=2"]))
    out.append(("mxnet-128gpu-4k-launch-n2", ROOT / "experiments/imagenet/mxnet-128gpu-4k.yaml",
                "launch", [*tiny, "-n", "2", "-s", "1", "dist.devices=2"]))
    return out


def _as_show_overrides(args: list[str]) -> list[str]:
    """`launch -n K -s S` is `dist.workers=K dist.servers=S` (mxlarge/launch_cli.py)."""
    out, it = [], iter(args)
    for a in it:
        if a == "-n":
            out.append(f"dist.workers={next(it)}")
        elif a == "-s":
            out.append(f"dist.servers={next(it)}")
        else:
            out.append(a)
    return out


@pytest.fixture(scope="module")
def recordio(tmp_path_factory) -> dict[str, str]:
    return make_imagenet(tmp_path_factory.mktemp("rec"), num_train=48, num_val=8, num_classes=4)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", _variants(), ids=lambda c: c[0])
def test_show_agrees_with_what_runs(case, tmp_path, mlflow_uri, recordio, capsys, monkeypatch):
    name, path, verb, args = case
    if "imagenet" in str(path):
        args = [f"data.train_rec={recordio['train_rec']}", f"data.val_rec={recordio['val_rec']}",
                *args]
    monkeypatch.chdir(tmp_path)
    assert main(["show", str(path), *_as_show_overrides(args), "--json", "--lr-at", "0"]) == 0
    shown = json.loads(capsys.readouterr().out)["plan"]

    assert main([verb, str(path), *args, *ONE_STEP]) == 0, capsys.readouterr().err[-3000:]
    c = MlflowClient(tracking_uri=mlflow_uri)
    runs = c.search_runs([c.get_experiment_by_name("mxlarge").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    params = runs[0].data.params
    assert {k: params.get(f"plan.{k}") for k in PLAN_KEYS} == {k: str(shown[k]) for k in PLAN_KEYS}
    first = [m.value for m in c.get_metric_history(runs[0].info.run_id, "train/lr")
             if m.step == 0]
    assert first and all(v == pytest.approx(shown["lr_at"]["0"]) for v in first)
