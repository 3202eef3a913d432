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


@pytest.mark.slow
def test_the_engine_floor_is_measured_in_mxlarge_launches(tmp_path: Path) -> None:
    """Phase 3 on a real 2-worker job: every layout's bare exchanges are timed, in mxlarge's
    launches only, and the report puts their medians next to the target step time."""
    import json

    out = tmp_path / "peers.json"
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "--part", "loopback", "--nets", "demo",
         "--peers", "mxlarge,gluon", "--rounds", "1", "--blocks", "1", "--check-steps", "1",
         "--no-findings", "--quick", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    net = json.loads(out.read_text())["loopback"]["nets"]["demo"]
    steps = 5  # --quick: half of the demo net's 10 steps per block, one launch
    assert set(net["floor"]) == {"per_tensor", "buckets", "even"}
    assert all(len(v) == steps and min(v) > 0 for v in net["floor"].values()), net["floor"]
    line = next(x for x in out.with_suffix(".md").read_text().splitlines()
                if x.startswith("The engine's exchange alone"))
    assert "one key per tensor" in line and "Target step time of `mxlarge` (`gluon` ÷ 1): " in line


def test_even_sizes_keeps_every_float_and_every_key_sliced() -> None:
    from benchmarks.pushpull_worker import BIGARRAY_BOUND, even_sizes

    for total in (25_557_032, 3 * BIGARRAY_BOUND + 7, BIGARRAY_BOUND - 1, 10):
        sizes = [s for (s,) in even_sizes(total)]
        assert sum(sizes) == total and len(sizes) <= 64
        assert len(sizes) == 1 or min(sizes) >= BIGARRAY_BOUND, sizes


def test_floor_lines_say_whether_the_target_is_below_the_floor() -> None:
    from benchmarks.peers import floor_lines
    from benchmarks.peers_jobs import Target

    targets = [Target(p, "mxlarge", 1 / 0.95, "") for p in ("gluon", "horovod")]

    def net(floor_s: float) -> dict:
        peers = {"mxlarge": {"sec_per_step": [1.3]}, "gluon": {"sec_per_step": [1.32, 1.2]},
                 "horovod": {"sec_per_step": [1.5]}}
        return {"peers": peers, "floor": {"per_tensor": [floor_s, 9.0, floor_s],
                                          "buckets": [9.0]}}

    # the tightest target: gluon's 1.26 s (median of its rounds) ÷ (1/0.95): 1197 ms
    assert "1197.0 ms, below the engine's exchange floor" in floor_lines(net(1.2), targets)[0]
    assert "above the engine's exchange floor" in floor_lines(net(1.1), targets)[0]
    assert floor_lines({"peers": {}, "floor": {}}, targets) == []
