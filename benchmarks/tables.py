"""The tables of docs/performance.md, rendered from the committed results in ``results/``.

Usage::

    .venv/bin/python -m benchmarks.tables            # print every table
    .venv/bin/python -m benchmarks.tables --write    # rewrite the page's generated tables
    .venv/bin/python -m benchmarks.tables --check    # exit 1 if a table differs from the results

A generated table sits between two marker lines of the page, a blank line on each side of it
(Markdown lint's MD058: a table is surrounded by blank lines)::

    <!-- generated: NAME -->

    | ... |

    <!-- end generated -->

NAME is a key of :data:`TABLES`. ``--write`` replaces what is between the markers and nothing
else; ``--check`` names every table that differs, is missing, or is unknown
(tests/test_performance_tables.py runs the same check). A ratio is written as its median over
rounds with the rounds' min–max in brackets (``1.370 (0.75–1.48)``, ``96.5% (85–104%)``), a
single figure when there were fewer than 3 rounds: the forms tests/test_quoted_numbers.py reads
back from the results. Every row ends with the commit its results were measured at.

Reads JSON only: importing this module imports no MXNet.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import md_table, median

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
REGION = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)

Results = Mapping[str, Any]  # {"bench": latest.json, "cluster": cluster/latest.json, "peers": ...}


def load(root: Path = RESULTS) -> dict[str, Any]:
    """The four committed results files."""
    return {"bench": json.loads((root / "latest.json").read_text()),
            "cluster": json.loads((root / "cluster" / "latest.json").read_text()),
            "peers": json.loads((root / "peers.json").read_text()),
            "choices": json.loads((root / "choices.json").read_text())}



def short(commit: str | None) -> str:
    """``a5baf5e`` (``a5baf5e+dirty``) of a full commit id; ``unknown`` without one."""
    if not commit:
        return "unknown"
    head, _, dirty = commit.partition("+")
    return head[:7] + (f"+{dirty}" if dirty else "")


def ratio(r: Mapping[str, Any]) -> str:
    """A ratio record as the page quotes it: median (min–max over rounds)."""
    m, lo, hi = r["median"], r["min"], r["max"]
    if r.get("unit") == "%":
        out = f"{100 * m:.1f}%"
        return out if r.get("rounds", 3) < 3 else f"{out} ({100 * lo:.0f}–{100 * hi:.0f}%)"
    if abs(m) >= 10:
        out = f"{m:.1f}"
        return out if r.get("rounds", 3) < 3 else f"{out} ({lo:.0f}–{hi:.0f})"
    out = f"{m:.3f}"
    return out if r.get("rounds", 3) < 3 else f"{out} ({lo:.2f}–{hi:.2f})"


def target(r: Mapping[str, Any]) -> str:
    """``≥ 0.97``, ``≤ 1.05``; ``—`` without a target."""
    t = r.get("target")
    if t is None:
        return "—"
    t = 100 * t if r.get("unit") == "%" else t
    return f"{'≥' if r['higher_is_better'] else '≤'} {t:.3g}{'%' if r.get('unit') == '%' else ''}"


def verdict(r: Mapping[str, Any]) -> str:
    return {"PASS": "PASS", "MISS": "**MISS**"}.get(r.get("status", ""), "—")


def ms(seconds: float) -> str:
    """A step time in ms: one decimal below a second, whole ms above."""
    return f"{1e3 * seconds:.1f}" if seconds < 1 else f"{1e3 * seconds:.0f}"



#: Nets in the order of the page's rows, with the label of their rows.
NETS = {"demo": "demo net", "resnet20": "`cifar_resnet20_v1`",
        "resnet50": "ResNet-50 (161 tensors, 32 px)"}
#: Peers that get a column, in order; a column is shown when some net of the part has it.
PEER_COLUMNS = ("gluon_kv", "gluon", "horovod", "horovod_fp16")
#: The 16-bit peers: compared with mxlarge's 16-bit wire (``mxlarge_fp16``), not float32.
FP16 = {"mxlarge_fp16", "horovod_fp16"}


def _measured(part: Mapping[str, Any], net: Mapping[str, Any]) -> str:
    return short((net.get("measured") or {}).get("commit") or part["commit"])


def _peer_cell(r: Mapping[str, Any] | None) -> str:
    if r is None:
        return "—"
    return ratio(r) + (" **MISS**" if r.get("status") == "MISS" else "")


def _nets(part: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    nets = part["nets"]
    return [(k, nets[k]) for k in NETS if k in nets] + \
        [(k, v) for k, v in nets.items() if k not in NETS]


def _peer_rows(part: Mapping[str, Any], lead: Callable[[str], list[str]]
               ) -> tuple[list[str], list[list[str]]]:
    """Peer columns and rows of one part: a row per net with float32 mxlarge as the base, and
    one with the 16-bit wire (``mxlarge_fp16``) as the base where that was run."""
    present = {p for net in part["nets"].values() for p in net["peers"]}
    present |= {t["peer"] for net in part["nets"].values() for t in net.get("targets", [])}
    columns = [p for p in PEER_COLUMNS if p in present]
    rows = []
    for key, net in _nets(part):
        peers = net["peers"]
        cells = [_peer_cell(peers[p]["ratio"] if p in peers and p not in FP16 else None)
                 for p in columns]
        rows.append([*lead(NETS.get(key, key)), ms(median(peers["mxlarge"]["sec_per_step"])),
                     *cells, _measured(part, net)])
        if "mxlarge_fp16" in peers:
            vs16 = {t["peer"]: t for t in net.get("targets", []) if t["base"] == "mxlarge_fp16"}
            rows.append([*lead(NETS.get(key, key) + ", 16-bit wire (`mxlarge_fp16`)"),
                         ms(median(peers["mxlarge_fp16"]["sec_per_step"])),
                         *[_peer_cell(vs16.get(p)) for p in columns], _measured(part, net)])
    return columns, rows


def peers_table(data: Results, part_key: str, link: str | None = None) -> str:
    """One layout and link rate: each net's peer step time ÷ mxlarge's; with ``link``, a first
    column names the link rate."""
    part = data["peers"][part_key]
    lead = (lambda label: [label]) if link is None else (lambda label: [link, label])
    columns, rows = _peer_rows(part, lead)
    return md_table([*([] if link is None else ["link"]), "net", "mxlarge ms/step",
                     *[f"`{p}`" for p in columns], "measured at"], rows)


#: The testbed parts with the servers on hosts of their own, one table.
SERVER_HOSTS = (("testbed-200mbit-servers", "200 Mbit/s"), ("testbed-1gbit-servers", "1 Gbit/s"))


def server_hosts_table(data: Results) -> str:
    rows: list[list[str]] = []
    columns: list[str] = []
    for key, link in SERVER_HOSTS:
        if key not in data["peers"]:
            continue
        cols, part_rows = _peer_rows(data["peers"][key], lambda label, link=link: [link, label])
        columns = columns or cols
        rows += part_rows
    return md_table(["link", "net", "mxlarge ms/step", *[f"`{p}`" for p in columns],
                     "measured at"], rows)


def accuracy_table(data: Results) -> str:
    """The accuracy twin: a column per trainer, its final error (mean ± std over the seeds)
    and Welch's test of its mean against mxlarge's."""
    from mxlarge.stats import welch

    part = data["peers"]["accuracy"]
    runs = part["runs"]
    base = [r["final_error"] for r in runs["mxlarge"]]
    error, versus = [], []
    for peer, rs in runs.items():
        errs = [r["final_error"] for r in rs]
        test = welch(errs, base) if peer != "mxlarge" else None
        error.append(f"{100 * statistics.fmean(errs):.2f} ± {100 * statistics.stdev(errs):.2f}")
        versus.append("—" if test is None else f"{100 * test.diff:+.2f}, p = {test.p:.2f}")
    return md_table(["trainer", *[f"`{p}`" for p in runs], "measured at"],
                    [[f"final error %, mean ± std of {len(part['seeds'])} seeds", *error,
                      short(part["commit"])],
                     ["− mxlarge's (points), Welch's p", *versus, short(part["commit"])]])



#: The parts of the bounds table, in order, and how the table names them.
LAYOUTS = (("loopback", "loopback"), ("testbed-1gbit", "1 Gbit/s"),
           ("testbed-200mbit", "200 Mbit/s"),
           ("testbed-1gbit-servers", "1 Gbit/s, server hosts"),
           ("testbed-200mbit-servers", "200 Mbit/s, server hosts"))


#: The nets of the bounds table: the one whose exchange is a large part of its step.
BOUND_NETS = ("resnet50",)


def bounds_table(data: Results) -> str:
    """mxlarge's step against the engine's exchange alone (the fastest key layout) and the
    perfect-overlap bound with its update (the median of every launch's, as in peers.md; the
    ratio is per round), measured in the same launches (benchmarks.peers_jobs)."""
    rows = []
    for key, layout in LAYOUTS:
        part = data["peers"].get(key)
        if not part:
            continue
        cores = part["versions"]["cores_usable"]
        for net_key, net in _nets(part):
            if net_key not in BOUND_NETS:
                continue
            label = layout if len(BOUND_NETS) == 1 else f"{layout}, {NETS[net_key]}"
            for peer, floor_key in (("mxlarge", "floor"), ("mxlarge_fp16", "floor16")):
                row = net["peers"].get(peer)
                if row is None:
                    continue
                step = median(row["sec_per_step"])
                floor = net.get(floor_key) or {}
                alone = min((median(v) for v in floor.values()), default=None)
                bound = next((t for t in net.get("targets", [])
                              if t["base"] == "bound" and t["peer"] == peer), None)
                rows.append([label + (", 16-bit wire" if peer != "mxlarge" else ""),
                             ms(step), "—" if alone is None else ms(alone),
                             "—" if alone is None else f"{step / alone:.2f}",
                             ms(median(net["overlap_update"]))
                             if bound and net.get("overlap_update") else "—",
                             _peer_cell(bound), "—" if bound is None else target(bound),
                             f"{median(row['machine_busy']):.2f} of {cores}",
                             _measured(part, net)])
    return md_table(["layout", "mxlarge ms/step", "exchange alone ms", "step ÷ exchange",
                     "bound ms", "step ÷ bound", "target", "cores busy", "measured at"], rows)


Row = tuple[str, Sequence[str]]  # what the row measures, the ratio keys it quotes

#: ``make bench``'s rows (benchmarks/results/latest.json), in the page's order: every target,
#: and the context the page cites. A ratio with a target that no row names gets a row of its
#: own, titled as in the results; the rest are in benchmarks/results/latest.md.
BENCH: tuple[Row, ...] = (
    ("mxlarge step ÷ bare `gluon.Trainer` step, images/s (`cifar_resnet20_v1`, batch 32)",
     ["trainer_overhead"]),
    ("forward+backward under mxlarge.Trainer ÷ under gluon.Trainer, same graph: demo net / "
     "`cifar_resnet20_v1`", ["fwd_bwd_demo", "fwd_bwd_resnet20"]),
    ("step time, dist_sync 1 worker + 1 server ÷ local store: `cifar_resnet20_v1` / demo net "
     "(20 tensors, 1 key) / the demo net's floor, its exchange hidden but for the first "
     "layer's round trip", ["dist_cost_1w1s", "dist_cost_demo_1w1s", "dist_floor_demo_1w1s"]),
    ("push+pull of ResNet-50's 25.6 M floats through mxlarge ÷ bare `kv.pushpull`, same "
     "rounds: 1 + 1 / 2 + 2", ["bandwidth_vs_bare_1w1s", "bandwidth_vs_bare_2w2s"]),
    ("the same ÷ raw loopback TCP, 1 + 1: 256 KiB buckets (the default) / one key per tensor / "
     "1 MiB / 4 MiB buckets", ["bandwidth_1w1s", "bandwidth_1w1s_perkey",
                               "bandwidth_1w1s_fusion1m", "bandwidth_1w1s_fusion4m"]),
    ("Gluon's SGD update ÷ mxlarge's, CPU seconds, ResNet-50's 161 tensors",
     ["update_kernels"]),
    ("bytes a worker sends per step ÷ float32's: 2-bit compression / 16-bit wire; receives, "
     "16-bit wire", ["compression_bytes_sent", "wire16_bytes_sent", "wire16_bytes_received"]),
    ("step time with ÷ without it: the stall watchdog's heartbeat / the per-rank breakdown / your "
     "own script's MLflow run (demo net) / the noise-scale estimator every 10 steps",
     ["heartbeat_cost", "breakdown_cost", "own_script_tracking_cost", "gns_cost_10"]),
)

#: ``make bench-cluster``'s rows (benchmarks/results/cluster/latest.json): ResNet-50's
#: gradients on the namespace testbed unless named.
CLUSTER: tuple[Row, ...] = (
    ("push+pull ÷ G/B, W = S = 2, 1 Gbit/s: defaults / one key per tensor / MXNet's "
     "big-array bound (1e6)", ["link_resnet50_w2_1g", "link_resnet50_w2_1g_perkey",
                               "link_resnet50_w2_1g_bound1e6"]),
    ("the same, W = S = 3: defaults / MXNet's big-array bound",
     ["link_resnet50_w3_1g", "link_resnet50_w3_1g_bound1e6"]),
    ("the same, W = S = 2, 5 Gbit/s (2 cores drive every host: CPU-bound)",
     ["link_resnet50_w2_5g"]),
    ("the same, demo net (0.08 MB), W = S = 2, 1 Gbit/s: fused / one key per tensor",
     ["link_demo_w2_1g", "link_demo_w2_1g_perkey"]),
    ("mxlarge's exchange ÷ bare equal keys over every server, W = S = 3: co-located at "
     "200 Mbit/s / at 1 Gbit/s / the servers on hosts of their own at 200 Mbit/s",
     ["floor_resnet50_w3_200m_colocated", "floor_resnet50_w3_1g_colocated",
      "floor_resnet50_w3_200m"]),
    ("mxlarge's exchange, 3 server hosts ÷ co-located, 200 Mbit/s (BytePS's bound: 0.75)",
     ["placement_resnet50_w3_200m"]),
    ("the 16-bit wire's exchange ÷ float32's, W = S = 2, 200 Mbit/s",
     ["wire16_resnet50_w2_200m"]),
)


def _records(results: Mapping[str, Any]) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """key → (benchmark name, its commit, the ratio record)."""
    return {r["key"]: (name, b.get("commit"), r)
            for name, b in results["benchmarks"].items() for r in b["ratios"]}


def _goodput(results: Mapping[str, Any], key: str) -> str:
    """A link row's ratio against the measured TCP goodput of its shaped link."""
    for b in results["benchmarks"].values():
        for c in b.get("details", {}).get("configs", []):
            if c["key"] == key and c.get("goodput_gbit"):
                r = next(r for r in b["ratios"] if r["key"] == key)
                return f"{r['median'] * c['goodput_gbit'] / c['rate_gbit']:.3f}"
    return "—"


def _joined(cells: Sequence[str]) -> str:
    """Cells of one row's ratios, " / " between them; one "—" when none has a value."""
    return "—" if all(c == "—" for c in cells) else " / ".join(cells)


def ratios_table(results: Mapping[str, Any], spec: Sequence[Row],
                 goodput: bool = False) -> str:
    """A row per entry of ``spec`` (its ratios joined by " / "), then a row for every ratio
    with a target that ``spec`` does not name."""
    recs = _records(results)
    named = {k for _, keys in spec for k in keys}
    rows_spec = list(spec) + [(recs[k][2]["title"].replace("|", "\\|"), [k]) for k in recs
                              if k not in named and recs[k][2].get("target") is not None]
    rows = []
    for what, keys in rows_spec:
        found = [recs[k] for k in keys if k in recs]
        if not found:
            continue
        has_target = any(r.get("target") is not None for _, _, r in found)
        rows.append([" / ".join(dict.fromkeys(f"`{name}`" for name, _, _ in found)), what,
                     " / ".join(ratio(r) for _, _, r in found),
                     *([_joined([_goodput(results, r["key"]) for _, _, r in found])]
                       if goodput else []),
                     " / ".join(target(r) for _, _, r in found) if has_target else "—",
                     " / ".join(verdict(r) for _, _, r in found) if has_target else "—",
                     " / ".join(dict.fromkeys(short(c) for _, c, _ in found))])
    return md_table(["benchmark", "what it measures", "median (min–max)",
                     *(["÷ G/(TCP goodput)"] if goodput else []), "target", "verdict",
                     "measured at"], rows)



def _accuracies(runs: Sequence[Mapping[str, Any]]) -> str:
    """The final validation accuracies of some runs (one per seed), " / " between them."""
    return " / ".join(f"{r['accuracy']:.3f}" for r in sorted(runs, key=lambda r: r.get("seed", 0)))


def compression_table(data: Results) -> str:
    """benchmarks/choices.py's compression part: a column per threshold t (no compression
    first), the best compressed one in bold."""
    part = data["choices"]["compression"]
    runs = part["runs"]
    none = [r for r in runs if r["compression"] == "none"]
    thresholds = sorted({r["threshold"] for r in runs if r["compression"] != "none"})
    best = max((r["accuracy"] for r in runs if r["compression"] != "none"), default=None)
    header, cells = ["final validation accuracy, t =", "no compression"], [_accuracies(none)]
    seeds = sorted({r["seed"] for r in runs})
    for t in thresholds:
        at = [r for r in runs if r["compression"] != "none" and r["threshold"] == t]
        header.append(f"{t:g}" + (" (default)" if t == 0.5 else ""))
        cell = _accuracies(at)
        cells.append(f"**{cell}**" if len(at) == 1 and at[0]["accuracy"] == best else cell)
    seeds_label = " / ".join(str(s) for s in seeds)
    return md_table([*header, "measured at"],
                    [[f"seed {seeds_label} (one figure: seed {seeds[0]})", *cells,
                      short(part["commit"])]])


def lars_table(data: Results) -> str:
    """benchmarks/choices.py's LARS part: a column per global LR γ, then the run without LARS."""
    part = data["choices"]["lars"]
    runs = part["runs"]
    lars = sorted((r for r in runs if r["lars_lr"] is not None), key=lambda r: r["lars_lr"])
    header = [f"{r['lars_lr']:g}" + (" (the SGD LR)" if r["lars_lr"] == 0.05 else "")
              for r in lars]
    cells = [_accuracies([r]) for r in lars]
    if plain := [r for r in runs if r["lars_lr"] is None]:
        header.append("no LARS, LR 0.05")
        cells.append(_accuracies(plain))
    return md_table(["digits proxy, batch 16, 4 epochs, γ =", *header, "measured at"],
                    [["final validation accuracy", *cells, short(part["commit"])]])


#: Every generated table of the page: name → renderer.
TABLES: dict[str, Callable[[Results], str]] = {
    "peers-loopback": lambda d: peers_table(d, "loopback"),
    "peers-testbed-1gbit": lambda d: peers_table(d, "testbed-1gbit", "1 Gbit/s"),
    "peers-testbed-200mbit": lambda d: peers_table(d, "testbed-200mbit", "200 Mbit/s"),
    "peers-server-hosts": server_hosts_table,
    "peers-accuracy": accuracy_table,
    "bounds": bounds_table,
    "bench-cluster": lambda d: ratios_table(d["cluster"], CLUSTER, goodput=True),
    "bench": lambda d: ratios_table(d["bench"], BENCH),
    "choices-compression": compression_table,
    "choices-lars": lars_table,
}


def render(data: Results) -> dict[str, str]:
    """Every table, as the page holds it between its markers (a blank line before and after)."""
    return {name: "\n" + fn(data) + "\n\n" for name, fn in TABLES.items()}


def regions(text: str) -> dict[str, str]:
    """The page's generated regions: name → what is between the markers."""
    return {m.group(2): m.group(3) for m in REGION.finditer(text)}


def rewrite(text: str, tables: Mapping[str, str]) -> str:
    """``text`` with every known region replaced by its table."""
    def sub(m: re.Match[str]) -> str:
        body = tables.get(m.group(2), m.group(3))
        return m.group(1) + body + m.group(4)

    return REGION.sub(sub, text)


def stale(text: str, tables: Mapping[str, str]) -> list[str]:
    """What differs between the page and ``tables``: each region out of date, missing from
    the page, or unknown."""
    found = regions(text)
    out = [f"{name}: out of date" for name in tables if name in found
           and found[name] != tables[name]]
    out += [f"{name}: no such region in the page" for name in tables if name not in found]
    out += [f"{name}: no such table" for name in found if name not in tables]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the page's tables")
    mode.add_argument("--check", action="store_true",
                      help="exit 1 if a table of the page differs from the results")
    p.add_argument("--page", type=Path, default=PAGE)
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    tables = render(load(a.results))
    if not (a.write or a.check):
        for name, table in tables.items():
            print(f"<!-- generated: {name} -->\n{table}<!-- end generated -->\n")
        return 0
    text = a.page.read_text()
    if a.write:
        new = rewrite(text, tables)
        if new != text:
            a.page.write_text(new)
        problems = [s for s in stale(new, tables) if not s.endswith("out of date")]
        for s in problems:
            print(f"{a.page}: {s}", file=sys.stderr)
        print(f"{a.page}: {len(set(regions(new)) & set(tables))} tables written")
        return 1 if problems else 0
    problems = stale(text, tables)
    for s in problems:
        print(f"{a.page}: {s}", file=sys.stderr)
    if problems:
        print("run `python -m benchmarks.tables --write`", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
