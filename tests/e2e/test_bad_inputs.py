"""A catalogue of bad inputs: one clear message each, a non-zero exit, nothing created or changed,
no process left behind."""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mxlarge.data.tiny import make_imagenet
from tests.helpers import dmlc_processes

GOOD = """
name: bad
data: {dataset: digits, batch_size: 64}
model: {name: small_plain, width: 4}
optim: {base_lr: 0.05, reference_batch: 16, warmup: none, decay: none}
train: {epochs: 1, max_steps: 2, progress: false, checkpoint_every: 1}
dist: {kvstore: local}
"""


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*")}


def _check(tmp_path, args, fragments, code=2, prepare=None):
    """Runs the CLI in tmp_path and asserts exit code, message, unchanged files, no processes."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    if not (work / "exp.yaml").exists():
        (work / "exp.yaml").write_text(GOOD)
    if prepare:
        prepare(work)
    before = _snapshot(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MXLARGE_TEST_MARKER"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", *args], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stdout[-1500:] + r.stderr[-1500:]
    for frag in fragments:
        assert frag in r.stderr, r.stderr[-1500:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert _snapshot(tmp_path) == before
    assert dmlc_processes(str(tmp_path)) == []
    return r


def test_malformed_yaml(tmp_path):
    _check(tmp_path, ["train", "exp.yaml"], ["exp.yaml: malformed YAML at line"],
           prepare=lambda w: (w / "exp.yaml").write_text("data: {dataset: digits\n"))


def test_unknown_key(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "optim.lerning_rate=0.1"],
           ["unknown key 'optim.lerning_rate'"])


def test_wrong_type(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "train.epochs=ten"],
           ["train.epochs = 'ten': expected an integer >= 1"])


@pytest.mark.parametrize("override,frag", [
    ("data.batch_size=0", "data.batch_size = 0: expected an integer >= 1"),
    ("data.batch_size=-8", "data.batch_size = -8: expected an integer >= 1"),
    ("train.epochs=0", "train.epochs = 0: expected an integer >= 1"),
    ("optim.base_lr=0", "optim.base_lr = 0: expected a number > 0"),
    ("optim.base_lr=-0.1", "optim.base_lr = -0.1: expected a number > 0"),
])
def test_zero_or_negative_numbers(tmp_path, override, frag):
    _check(tmp_path, ["train", "exp.yaml", override], [frag])


def test_unknown_model(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "model.name=resnet50_v1x"],
           ["resnet50_v1x", "unknown model", "did you mean"])


def test_unknown_dataset(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "data.dataset=mnist"],
           ["data.dataset = 'mnist': expected one of digits, synthetic, imagenet, cifar10"])


def test_unknown_store_type(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "dist.kvstore=horovod"],
           ["dist.kvstore = 'horovod': expected one of local, device, dist_sync"])


def test_missing_data_directory(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "data.dataset=cifar10", f"data.root={tmp_path}/nope"],
           [f"{tmp_path}/nope"])


def test_empty_data_directory(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", "data.dataset=cifar10", f"data.root={tmp_path}/empty"],
           [f"{tmp_path}/empty", "data_batch_1.bin"],
           prepare=lambda w: (tmp_path / "empty").mkdir(exist_ok=True))


def _imagenet_args(paths):
    return ["data.dataset=imagenet", f"data.train_rec={paths['train_rec']}",
            f"data.val_rec={paths['val_rec']}", "data.num_classes=4", "data.batch_size=4",
            "data.image_size=32", "data.threads=1"]


def test_truncated_rec(tmp_path):
    paths = make_imagenet(tmp_path / "rec", num_train=12, num_val=4, num_classes=4)
    rec = Path(paths["train_rec"])
    rec.write_bytes(rec.read_bytes()[:-100])
    _check(tmp_path, ["train", "exp.yaml", *_imagenet_args(paths)],
           [str(rec), "truncated"])


def test_corrupt_idx(tmp_path):
    paths = make_imagenet(tmp_path / "rec", num_train=12, num_val=4, num_classes=4)
    idx = Path(paths["train_rec"]).with_suffix(".idx")
    lines = idx.read_text().splitlines()
    key, offset = lines[3].split("\t")
    lines[3] = f"{key}\t{int(offset) + 3}"
    idx.write_text("\n".join(lines) + "\n")
    _check(tmp_path, ["train", "exp.yaml", *_imagenet_args(paths)],
           [str(Path(paths["train_rec"])), "no RecordIO record at byte"])


def test_hostfile_missing(tmp_path):
    _check(tmp_path, ["launch", "exp.yaml", "-n", "2", "--launcher", "ssh", "-H",
                      str(tmp_path / "hosts")], [str(tmp_path / "hosts")])


def test_hostfile_empty(tmp_path):
    _check(tmp_path, ["launch", "exp.yaml", "-n", "2", "--launcher", "ssh", "-H",
                      str(tmp_path / "hosts")], [str(tmp_path / "hosts"), "lists no hosts"],
           prepare=lambda w: (tmp_path / "hosts").write_text("# nothing\n"))


def test_hostfile_too_few_hosts(tmp_path):
    _check(tmp_path, ["launch", "exp.yaml", "-n", "2", "-s", "2", "--launcher", "mpi", "-H",
                      str(tmp_path / "hosts")], [str(tmp_path / "hosts")],
           prepare=lambda w: (tmp_path / "hosts").write_text("127.0.0.1 slots=1\n"))


def test_zero_workers(tmp_path):
    _check(tmp_path, ["launch", "exp.yaml", "-n", "0"],
           ["-n/--workers = 0: expected an integer >= 1"])


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        _check(tmp_path, ["launch", "exp.yaml", "-n", "1", "--port", str(port),
                          "tracking.enabled=false"], [str(port), "in use"])


def _checkpoint(tmp_path, *extra):
    """A real checkpoint written by a short run (outside the checked tree)."""
    src = tmp_path.parent / (tmp_path.name + "-ck")
    src.mkdir(exist_ok=True)
    (src / "exp.yaml").write_text(GOOD)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    r = subprocess.run([sys.executable, "-m", "mxlarge.cli", "train", "exp.yaml",
                        "tracking.enabled=false", f"train.checkpoint_dir={src}/ck", *extra],
                       cwd=src, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return src / "ck/epoch-0001"


def _copy_checkpoint(ck, work_root):
    dst = work_root / "ck/epoch-0001"
    shutil.copytree(ck, dst)
    return dst


def test_checkpoint_truncated(tmp_path):
    ck = _checkpoint(tmp_path)

    def prepare(work):
        dst = _copy_checkpoint(ck, tmp_path)
        f = dst / "model.params"
        f.write_bytes(f.read_bytes()[:-64])
    _check(tmp_path, ["train", "exp.yaml", f"train.checkpoint_dir={tmp_path}/ck", "--resume"],
           ["model.params: checksum mismatch (truncated or corrupted)"], prepare=prepare)


def test_checkpoint_checksum_fails(tmp_path):
    ck = _checkpoint(tmp_path)

    def prepare(work):
        dst = _copy_checkpoint(ck, tmp_path)
        f = dst / "momentum.nd"
        data = bytearray(f.read_bytes())
        data[-5] ^= 0xFF
        f.write_bytes(bytes(data))
    _check(tmp_path, ["train", "exp.yaml", f"train.checkpoint_dir={tmp_path}/ck", "--resume"],
           ["momentum.nd: checksum mismatch"], prepare=prepare)


def test_checkpoint_of_another_model(tmp_path):
    ck = _checkpoint(tmp_path, "model.width=8")
    _check(tmp_path, ["train", "exp.yaml", f"train.checkpoint_dir={tmp_path}/ck", "--resume"],
           ["model.params", "another model"], prepare=lambda w: _copy_checkpoint(ck, tmp_path))


def test_resume_with_another_world_size_is_refused(tmp_path):
    ck = _checkpoint(tmp_path)
    _check(tmp_path, ["launch", "exp.yaml", "-n", "2", f"train.checkpoint_dir={tmp_path}/ck",
                      "--resume"],
           ["written by 1 worker(s) x 64 images = global batch 64, resuming with 2 worker(s)",
            "refused"], prepare=lambda w: _copy_checkpoint(ck, tmp_path))


def test_resume_with_another_simulated_layout_is_refused(tmp_path):
    ck = _checkpoint(tmp_path)
    _check(tmp_path, ["train", "exp.yaml", "dist.simulate_workers=2",
                      f"train.checkpoint_dir={tmp_path}/ck", "--resume"],
           ["resuming with 1 worker(s) x 2 simulated worker(s) x 64 images = global batch 128: "
            "refused"], prepare=lambda w: _copy_checkpoint(ck, tmp_path))


def test_resume_without_checkpoint(tmp_path):
    _check(tmp_path, ["train", "exp.yaml", f"train.checkpoint_dir={tmp_path}/none", "--resume"],
           ["--resume latest: no complete checkpoint"])


def test_unreachable_tracking_uri(tmp_path):
    r = _check(tmp_path, ["train", "exp.yaml", "tracking.uri=postgresql://u@127.0.0.1:9/x"],
               ["MLflow tracking URI 'postgresql://u@127.0.0.1:9/x' is not usable"])
    assert "epoch 1" not in r.stdout
