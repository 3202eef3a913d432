"""The picture of a job's timeline (:mod:`mxlarge.timeline.trace`): what MLflow shows beside
``timeline/trace.json``, which it cannot open."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mxlarge.reporting.plots import pyplot, save

#: Colours of the spans, by name (other names, e.g. a skipped update: grey).
COLOURS = {"data": "#bbbbbb", "forward": "#4c72b0", "backward": "#55a868",
           "forward+backward": "#4c9a8a", "push": "#dd8452", "pull": "#c44e52",
           "update": "#8172b3"}
#: More buckets than this share one ``exchange`` row per rank (drawn translucent).
ROWS = 8


def rows_of(trace: Mapping[str, Any]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """(rank, row label, its spans) from the top: per rank its ``data``, ``compute``,
    ``update`` tracks and its buckets (one ``exchange`` row beyond :data:`ROWS`)."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for (pid, _tid), track in sorted(names.items()):
        rows[(pid, track)] = []
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            rows[(e["pid"], names[(e["pid"], e["tid"])])].append(e)
    out = []
    for rank in sorted({pid for pid, _ in rows}):
        tracks = [(t, s) for (pid, t), s in rows.items() if pid == rank]
        buckets = [(t, s) for t, s in tracks if t.startswith("bucket")]
        out += [(rank, t, s) for t, s in tracks if not t.startswith("bucket")]
        if len(buckets) > ROWS:
            out.append((rank, f"exchange ({len(buckets)} buckets)",
                        [e for _, s in buckets for e in s]))
        else:
            out += [(rank, t, s) for t, s in buckets]
    return out


def plot_timeline(trace: Mapping[str, Any], path: str | Path) -> None:
    """PNG: a row per rank and track, each span a bar from its start to its end (ms from the
    earliest span), coloured by name, each step's number above its forward."""
    plt = pyplot()
    rows = rows_of(trace)
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.32 * len(rows)))
    seen: set[str] = set()
    for y, (_rank, label, spans) in enumerate(rows):
        shared = label.startswith("exchange")
        for e in spans:
            name = e["name"]
            ax.barh(-y, e["dur"] / 1e3, left=e["ts"] / 1e3, height=0.7,
                    color=COLOURS.get(name, "#999999"), alpha=0.5 if shared else 1.0,
                    label=None if name in seen else name, edgecolor="none")
            seen.add(name)
            if name in ("forward", "forward+backward") and not e["args"].get("micro"):
                ax.text(e["ts"] / 1e3, -y + 0.45, f"step {e['args']['step']}", fontsize=6)
    ax.set_yticks([-y for y in range(len(rows))],
                  [f"rank {rank}: {label}" for rank, label, _ in rows], fontsize=7)
    ax.set_xlabel("ms")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    other = trace.get("otherData", {})
    save(fig, path, f"timeline of steps {other.get('steps', '?')}: where each worker's "
                    "steps went (open timeline/trace.json in Perfetto for the details)")
