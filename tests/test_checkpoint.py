"""The one search for complete checkpoints (``latest``, retention, a restarted job's resume)."""
import os

from mxlarge import checkpoint


def _make(root, epoch, meta=True, mtime=None):
    d = checkpoint.epoch_dir(root, epoch)
    d.mkdir(parents=True)
    if meta:
        (d / "meta.json").write_text("{}")
        if mtime is not None:
            os.utime(d / "meta.json", (mtime, mtime))
    return d


def test_complete_checkpoints_are_those_with_meta_json_oldest_first(tmp_path):
    one = _make(tmp_path, 1, mtime=1000.0)
    _make(tmp_path, 2, meta=False)  # a rank died before rank 0 wrote meta.json last
    (tmp_path / ".epoch-0004.tmp").mkdir()  # an unfinished write
    three = _make(tmp_path, 3, mtime=2000.0)
    assert checkpoint.complete(tmp_path) == [one, three]
    assert checkpoint.find_latest(tmp_path) == three
    assert checkpoint.resolve("latest", tmp_path) == three


def test_since_keeps_only_this_jobs_checkpoints(tmp_path):
    old = _make(tmp_path, 5, mtime=1000.0)  # an earlier job's, in the same directory
    new = _make(tmp_path, 1, mtime=2000.0)
    assert checkpoint.complete(tmp_path, since=1500.0) == [new]
    assert checkpoint.find_latest(tmp_path, since=1500.0) == new
    assert checkpoint.find_latest(tmp_path) == old  # by epoch, without `since`
    assert checkpoint.find_latest(tmp_path, since=3000.0) is None


def test_no_directory_means_no_checkpoint(tmp_path):
    assert checkpoint.complete(tmp_path / "absent") == []
    assert checkpoint.find_latest(tmp_path / "absent") is None


def test_retention_keeps_the_newest_complete_ones(tmp_path):
    for e in (1, 2, 3):
        _make(tmp_path, e)
    partial = _make(tmp_path, 4, meta=False)
    checkpoint._retain(tmp_path, keep_last=2)
    assert [p.name for p in checkpoint.complete(tmp_path)] == ["epoch-0002", "epoch-0003"]
    assert partial.is_dir()  # not complete: not retention's to count or remove
