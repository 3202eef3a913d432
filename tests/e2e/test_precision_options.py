"""``train.amp`` and ``dist.wire_dtype`` end to end: ``mxlarge launch`` as 2 workers + 1 server
with bfloat16 AMP and the 16-bit wire, the replicas checked every step, both settings in MLflow;
and their refusals."""
import re

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import BN_CONFIG, cli


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_launch_with_bfloat16_amp_and_the_16_bit_wire(tmp_path, mlflow_uri):
    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG.replace("tracking: {enabled: false}", ""))
    r = cli(["launch", cfg, "-n", "2", "-s", "1", "train.amp=bfloat16",
             "dist.wire_dtype=float16"], tmp_path, timeout=380,
            env={"MLFLOW_TRACKING_URI": mlflow_uri})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "done: 12 steps" in r.stdout + r.stderr  # and 12 bitwise replica checks passed
    client = MlflowClient(tracking_uri=mlflow_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mxlarge").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["train.amp"] == "bfloat16"
    assert run.data.params["dist.wire_dtype"] == "float16"
    note = run.data.tags["mlflow.note.content"]
    assert "| precision (compute) | bfloat16 (MXNet AMP, dynamic loss scaling) |" in note
    assert "| precision (wire) | float16 (summed in float32 by the servers) |" in note


def test_show_prints_what_runs_in_which_precision(tmp_path):
    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG)
    r = cli(["show", cfg, "train.amp=bfloat16", "dist.wire_dtype=float16"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "precision compute: bfloat16 (MXNet AMP, dynamic loss scaling)" in r.stdout
    assert "precision weights: float32" in r.stdout
    assert "precision wire: float16 (summed in float32 by the servers)" in r.stdout


@pytest.mark.parametrize("overrides, message", [
    (["dist.kvstore=local", "dist.workers=1", "dist.wire_dtype=float16"],
     "dist.wire_dtype = 'float16': expected 'float32' with dist.kvstore = 'local'"),
    (["dist.compression=2bit", "dist.wire_dtype=float16"],
     "dist.wire_dtype = 'float16': expected 'float32' with dist.compression = '2bit'"),
    (["train.amp=float16"], "train.amp = 'float16': expected 'bfloat16' or 'none' with "
                            "dist.device_type = 'cpu'"),
    (["train.amp=bfloat16", "train.gns_every=2"],
     "train.gns_every = 2: expected 0 with train.amp = 'bfloat16'"),
    (["train.amp=bfloat16", "dist.simulate_workers=2"],
     "dist.simulate_workers = 2: expected 1 with train.amp = 'bfloat16'"),
])
def test_precision_settings_that_cannot_work_are_refused(tmp_path, overrides, message):
    from mxlarge.config import ConfigError, load_config

    cfg = tmp_path / "bn.yaml"
    cfg.write_text(BN_CONFIG)
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(cfg, overrides)


def test_the_128_gpu_setting_takes_float16_amp_and_the_16_bit_wire():
    """What its comment says to add on GPUs is accepted (and refused on CPU, above)."""
    from pathlib import Path

    from mxlarge.config import load_config
    from mxlarge.plan import precision

    path = Path(__file__).resolve().parents[2] / "experiments/imagenet/mxnet-128gpu-4k.yaml"
    cfg = load_config(path, ["train.amp=float16", "dist.wire_dtype=float16"])
    assert precision(cfg)["compute"] == "float16 (MXNet AMP, dynamic loss scaling)"
    assert "train.amp=float16" in path.read_text()


def test_launch_judges_the_wire_with_the_store_launching_adds():
    """A local-store config launched with the 16-bit wire: launching makes the store dist_sync,
    so the wire is accepted (it was refused against the file's local store)."""
    from pathlib import Path

    from mxlarge.launch_cli import launch_config

    path = Path(__file__).resolve().parents[2] / "experiments/proxy/mnist1d-recipe.yaml"
    cfg, world, overrides = launch_config(path, ["dist.wire_dtype=float16"], 2, None)
    assert (cfg.dist.kvstore, cfg.dist.wire_dtype, world.processes) == ("dist_sync", "float16", 2)
    assert overrides == ["dist.wire_dtype=float16", "dist.kvstore=dist_sync"]
