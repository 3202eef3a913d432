"""The timeline's picture (mxlarge.reporting.timeline_plot) of a merged trace."""
from __future__ import annotations

from mxlarge.reporting.timeline_plot import ROWS, plot_timeline, rows_of
from mxlarge.timeline.trace import merge


def _trace(buckets: int) -> dict:
    spans = [["forward", "compute", 5, 10.0, 10.01, {}], ["update", "update", 5, 10.03, 10.04, {}]]
    for k in range(buckets):
        spans += [["push", f"bucket {150000 + k}", 5, 10.02, 10.025, {"key": 150000 + k}],
                  ["pull", f"bucket {150000 + k}", 5, 10.025, 10.03, {"key": 150000 + k}]]
    return merge([{"rank": r, "host": "h1", "pid": r, "ref": 0.0, "start": 5, "steps": 1,
                   "spans": spans} for r in (0, 1)])


def test_a_row_per_rank_and_track_and_one_exchange_row_past_the_limit(tmp_path):
    rows = rows_of(_trace(2))
    assert [(r, label, len(s)) for r, label, s in rows] == [
        (r, label, n) for r in (0, 1) for label, n in (
            ("data", 0), ("compute", 1), ("update", 1), ("bucket 150000", 2),
            ("bucket 150001", 2))]
    many = rows_of(_trace(ROWS + 1))
    assert [label for r, label, _ in many if r == 0] == [
        "data", "compute", "update", f"exchange ({ROWS + 1} buckets)"]
    assert len(many[3][2]) == 2 * (ROWS + 1)
    plot_timeline(_trace(2), tmp_path / "trace.png")
    assert (tmp_path / "trace.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
