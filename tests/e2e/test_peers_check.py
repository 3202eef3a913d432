"""The peers benchmark's same-math check (benchmarks/peers.py): a peer whose update drifts from
mxlarge's ends the benchmark before anything is timed or written, naming the peer, the net and
max |Δw|. Real 2-worker jobs on 127.0.0.1; the Horovod case only where horovod is installed."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.peer_worker import compare

ROOT = Path(__file__).resolve().parents[2]


def _drifting_run(tmp_path: Path, peer: str) -> subprocess.CompletedProcess[str]:
    """``peer`` with 1.5× the LR on the demo net, checked against mxlarge's reference launch;
    ``peer`` comes first in the round, so nothing is timed before it fails."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "--part", "loopback", "--nets", "demo",
         "--peers", f"{peer},mxlarge", "--lr-scale", f"{peer}=1.5", "--rounds", "1",
         "--blocks", "1", "--check-steps", "2", "--no-findings", "--quick",
         "--out", str(tmp_path / "peers.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=150)


def _assert_fails_loudly(r: subprocess.CompletedProcess[str], peer: str, out: Path) -> None:
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"peers: same-math check failed: {peer} on small_resnet drifts "
                           "from mxlarge after 2 steps: max |Δw| = "), line
    assert "first update 1.5× mxlarge's" in line, line  # the LR factor, seen in the weights
    assert "ms/step" not in r.stdout, r.stdout  # failed before anything was timed
    assert not out.with_suffix(".md").exists()  # nothing written for a drifting run


def test_a_gluon_peer_with_a_wrong_lr_fails_the_check(tmp_path: Path) -> None:
    r = _drifting_run(tmp_path, "gluon")
    _assert_fails_loudly(r, "gluon", tmp_path / "peers.json")


@pytest.mark.skipif(importlib.util.find_spec("horovod") is None,
                    reason="horovod not installed (make bench-peers builds it)")
def test_horovod_with_a_wrong_lr_fails_the_check(tmp_path: Path) -> None:
    r = _drifting_run(tmp_path, "horovod")
    _assert_fails_loudly(r, "horovod", tmp_path / "peers.json")


def test_compare_is_allclose_and_measures_the_first_update() -> None:
    w0 = {"w0_0": np.zeros(3, np.float32), "w1_0": np.full(3, 0.1, np.float32),
          "wS_0": np.full(3, 1.0, np.float32)}
    close = {**w0, "wS_0": w0["wS_0"] + 5e-6}   # within atol 1e-6 + rtol 1e-5 · 1
    far = {**w0, "w1_0": 2 * w0["w1_0"], "wS_0": w0["wS_0"] + 2e-5}
    assert compare(close, w0, 1e-5, 1e-6)["agree"]
    got = compare(far, w0, 1e-5, 1e-6)
    assert not got["agree"] and got["max_abs"] == pytest.approx(2e-5, rel=1e-2)
    assert got["update_ratio"] == pytest.approx(2.0)
    assert not compare({"w0_0": w0["w0_0"]}, w0, 1e-5, 1e-6)["agree"]  # a tensor missing
