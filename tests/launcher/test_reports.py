"""WorkerReports keeps each rank's last step breakdown from the heartbeats: the picture of a
job however it ends (what an own script's run shows as breakdown/ranks.png)."""
from __future__ import annotations

from pathlib import Path

from mxlarge.launcher.reports import WorkerReports
from mxlarge.protocol.heartbeat import Record, path_for


def _beat(directory: Path, rank: int, step: float | None, tick: int = 1) -> None:
    parts = None if step is None else {"data": 1.0, "compute": 2.0, "exchange": 3.0,
                                       "update": 0.5, "step": step, "n": 3, "at": 20}
    path_for(directory, rank).write_bytes(
        Record(rank, f"host{rank}", 100 + rank, 21, 20, 21, "train", tick, parts).encode())


def test_each_ranks_last_parts_by_rank_and_none_while_a_rank_has_none(tmp_path):
    reports = WorkerReports(tmp_path, None, emit=lambda line: None)
    _beat(tmp_path, 0, 7.0)
    _beat(tmp_path, 1, None)
    assert reports.breakdown() == ()  # rank 1 has sampled no step yet
    _beat(tmp_path, 1, 9.0)
    assert [(h, p["step"]) for h, p in reports.breakdown()] == [("host0", 7.0), ("host1", 9.0)]
    _beat(tmp_path, 1, None, tick=2)  # a record without parts keeps the last parts seen
    assert [p["step"] for _, p in reports.breakdown()] == [7.0, 9.0]


def test_the_outcome_carries_it(tmp_path):
    from mxlarge.launcher.outcome import Outcome
    reports = WorkerReports(tmp_path, None, emit=lambda line: None)
    _beat(tmp_path, 0, 7.0)
    out = reports.conclude(Outcome(130, "stopped"))
    assert [h for h, _ in out.breakdown] == ["host0"]
