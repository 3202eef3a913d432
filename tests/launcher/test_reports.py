"""WorkerReports keeps each rank's last step breakdown from the heartbeats: the picture of a
job however it ends (what an own script's run shows as breakdown/ranks.png), and hands it to
``drawn`` while the job runs (at most every DRAW_EVERY s, when it changed)."""
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


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drawing(tmp_path, drawn):
    clock = _Clock()
    lines: list[str] = []
    return WorkerReports(tmp_path, None, emit=lines.append, clock=clock, drawn=drawn), clock, lines


def test_the_picture_is_drawn_once_every_rank_has_parts_then_at_most_every_minute_if_changed(
        tmp_path):
    from mxlarge.launcher.reports import DRAW_EVERY
    calls = []
    reports, clock, _ = _drawing(tmp_path, calls.append)
    _beat(tmp_path, 0, 7.0)
    _beat(tmp_path, 1, None)
    reports.poll()
    assert calls == []  # rank 1 has no parts yet
    clock.now = 1.0
    _beat(tmp_path, 1, 9.0)
    reports.poll()
    assert [[p["step"] for _, p in c] for c in calls] == [[7.0, 9.0]]  # at once
    clock.now = DRAW_EVERY  # 59 s after: not yet, though the parts changed
    _beat(tmp_path, 1, 10.0, tick=2)
    reports.poll()
    assert len(calls) == 1
    clock.now = 1.0 + DRAW_EVERY
    reports.poll()
    assert [[p["step"] for _, p in c] for c in calls] == [[7.0, 9.0], [7.0, 10.0]]
    clock.now = 1.0 + 3 * DRAW_EVERY  # unchanged: nothing to draw
    _beat(tmp_path, 1, None, tick=3)
    reports.poll()
    assert len(calls) == 2
    assert [h for h, _ in calls[-1]] == ["host0", "host1"]


def test_a_picture_not_logged_is_said_once_and_the_job_goes_on(tmp_path):
    from mxlarge.launcher.reports import DRAW_EVERY
    calls = []

    def drawn(ranks):
        calls.append(ranks)
        raise OSError("store unreachable")
    reports, clock, lines = _drawing(tmp_path, drawn)
    for n in range(3):
        clock.now = n * DRAW_EVERY
        _beat(tmp_path, 0, 7.0 + n, tick=n + 1)
        reports.poll()
    assert len(calls) == 3
    assert lines == ["breakdown picture not logged: store unreachable"]
    assert [p["step"] for _, p in reports.breakdown()] == [9.0]
