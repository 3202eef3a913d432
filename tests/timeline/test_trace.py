"""The ranks' timeline files merged into one Chrome trace (mxlarge.timeline.trace), and the
window of the Trainer's keywords or the environment (mxlarge.timeline.TimelineWindow)."""
from __future__ import annotations

import json

import pytest

from mxlarge.timeline import ENV, PREFIX, TimelineWindow
from mxlarge.timeline import trace as T


def _record(rank: int, host: str, ref: float, spans: list) -> dict:
    return {"rank": rank, "host": host, "pid": 100 + rank, "ref": ref, "start": 5, "steps": 2,
            "spans": spans}


def test_ranks_on_one_host_keep_their_clock_and_another_host_is_shifted_by_its_barrier(tmp_path):
    """Ranks 0, 1 on h1, rank 2 on h2 whose clock runs 2.5 s ahead (its barrier ref 2.5 s
    later): h2's spans move back by 2.5 s; times are µs from the earliest span."""
    records = [
        _record(0, "h1", 1000.0, [["forward", "compute", 5, 990.0, 990.010, {}],
                                  ["push", "bucket 150001", 5, 990.012, 990.020, {"key": 150001}],
                                  ["push", "bucket 150000", 5, 990.011, 990.019, {"key": 150000}]]),
        _record(1, "h1", 1000.0004, [["forward", "compute", 5, 990.001, 990.011, {}]]),
        _record(2, "h2", 1002.5002, [["forward", "compute", 5, 992.5005, 992.5105, {}]]),
    ]
    for r in reversed(records):
        (tmp_path / f"{PREFIX}{r['rank']}.json").write_text(json.dumps(r))
    read = T.read(tmp_path)
    assert [r["rank"] for r in read] == [0, 1, 2]
    assert T.shifts(read) == {"h1": 0.0, "h2": pytest.approx(2.5)}
    trace = T.merge(read)
    json.dumps(trace)  # serialisable as is
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    by_pid = {p: [e for e in spans if e["pid"] == p] for p in (0, 1, 2)}
    assert by_pid[0][0]["ts"] == 0.0 and by_pid[0][0]["dur"] == pytest.approx(10_000, abs=0.2)
    assert by_pid[1][0]["ts"] == pytest.approx(1_000, abs=0.2)  # same host: unshifted
    assert by_pid[2][0]["ts"] == pytest.approx(500, abs=1)  # 992.5005 - 2.5 - 990.0
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert names == {0: "worker rank 0 on h1 (pid 100)", 1: "worker rank 1 on h1 (pid 101)",
                     2: "worker rank 2 on h2 (pid 102)"}
    threads = [e["args"]["name"] for e in trace["traceEvents"]
               if e["name"] == "thread_name" and e["pid"] == 0]
    assert threads == ["data", "compute", "update", "bucket 150000", "bucket 150001"]
    push = next(e for e in by_pid[0] if e["args"].get("key") == 150000)
    assert push["tid"] == 4 and push["cat"] == "bucket" and push["args"]["step"] == 5
    assert T.describe(trace) == "timeline of steps 5-6: 3 worker rank(s), 5 spans"


def test_no_files_is_no_timeline(tmp_path):
    assert T.read(tmp_path) == []


def test_the_window_comes_from_the_keywords_else_the_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert TimelineWindow.of(None, None) is None
    assert TimelineWindow.of(4, None) == TimelineWindow(4, 3)
    w = TimelineWindow.of(4, 2)
    assert (w.last, w.covers(3), w.covers(4), w.covers(5), w.covers(6)) == (5, False, True,
                                                                              True, False)
    monkeypatch.setenv(ENV, "7:1")
    assert TimelineWindow.of(None, None) == TimelineWindow(7, 1)
    monkeypatch.setenv(ENV, "seven")
    with pytest.raises(ValueError, match=r"MXLARGE_TIMELINE='seven': expected START:STEPS"):
        TimelineWindow.of(None, None)
    with pytest.raises(ValueError, match="timeline_steps 2: needs timeline_start"):
        TimelineWindow.of(None, 2)
    with pytest.raises(ValueError, match="expected start >= 0 and steps >= 1"):
        TimelineWindow(0, 0)
