"""The ranks' timeline files merged into one Chrome trace (Perfetto,
``chrome://tracing``).

One process row per worker rank, named ``worker rank R on HOST (pid P)``; in it a track each
for ``data``, ``compute`` (forward, backward), ``update`` and every bucket (its push and pull).
Clocks: ranks on one host share one; another host's times are shifted by d_h = median of its
ranks' ``ref`` − the median of rank 0's host's, ``ref`` being each rank's clock right after
the barrier every rank leaves at once (so hosts agree to within the barrier release's skew).
Times are µs from the earliest span. Imports nothing of MXNet (the launcher merges).
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mxlarge.timeline import PREFIX

#: Tracks in the order a row shows them; buckets follow, by key.
TRACKS = ("data", "compute", "update")


def read(directory: str | Path) -> list[dict[str, Any]]:
    """The ranks' files in ``directory``, by rank (none: [])."""
    records = [json.loads(p.read_text()) for p in Path(directory).glob(f"{PREFIX}*.json")]
    return sorted(records, key=lambda r: r["rank"])


def shifts(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds to subtract from each host's times (module docstring): d_h."""
    refs: dict[str, list[float]] = {}
    for r in records:
        refs.setdefault(r["host"], []).append(r["ref"])
    base = statistics.median(refs[records[0]["host"]])
    return {h: statistics.median(v) - base for h, v in refs.items()}


def merge(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Chrome-trace JSON (the object form) of ``records`` (:func:`read`)."""
    d = shifts(records)
    spans = [(r, s) for r in records for s in r["spans"]]
    origin = min((s[3] - d[r["host"]] for r, s in spans), default=0.0)
    events: list[dict[str, Any]] = []
    for r in records:
        pid = r["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"worker rank {pid} on {r['host']} (pid {r['pid']})"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                       "args": {"sort_index": pid}})
        buckets = sorted({s[1] for s in r["spans"] if s[1] not in TRACKS},
                         key=lambda t: int(t.split()[-1]))
        tids = {t: i + 1 for i, t in enumerate((*TRACKS, *buckets))}
        for track, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                           "args": {"name": track}})
        for name, track, step, t0, t1, args in r["spans"]:
            t0 = t0 - d[r["host"]]
            t1 = t1 - d[r["host"]]
            events.append({"ph": "X", "name": name, "cat": track.split()[0], "pid": pid,
                           "tid": tids[track], "ts": round(1e6 * (t0 - origin), 1),
                           "dur": round(1e6 * (t1 - t0), 1), "args": {"step": step, **args}})
    first = records[0] if records else {"start": 0, "steps": 0}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"steps": f"{first['start']}-{first['start'] + first['steps'] - 1}",
                          "ranks": len(records),
                          "clock_shift_s": {h: round(v, 6) for h, v in d.items()}}}


def describe(trace: dict[str, Any]) -> str:
    """One line: what the trace holds."""
    other = trace["otherData"]
    spans = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    return (f"timeline of steps {other['steps']}: {other['ranks']} worker rank(s), "
            f"{spans} spans")
