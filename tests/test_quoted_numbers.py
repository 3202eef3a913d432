"""The numbers the README and docs/performance.md quote are the results files' (issue 57).

A benchmark's table in the docs is typed by hand after a run; these tests read the committed
results (``benchmarks/results/``) and check every ratio a table quotes: its median (to the
decimals written) and, where a range is written, its min and max. A re-run whose numbers are not
copied into the docs, or a docs number that matches no results file, fails here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text()
README = (ROOT / "README.md").read_text()

# "0.993 (0.97–1.02)", "96.1% (87–101%)", or a bare "1.036" / "89.9%"
QUOTED = re.compile(r"(?<![\d.(–])(\d+\.\d+)(%?)(?: \((\d+(?:\.\d+)?)%?–(\d+(?:\.\d+)?)%?\))?")


def ratios(path: Path) -> list[dict[str, Any]]:
    """Every ratio record (a dict with ``median``, ``min``, ``max``) in a results file."""
    out: list[dict[str, Any]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("median"), (int, float)):
                out.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(json.loads(path.read_text()))
    return out


def _same(written: str, value: float, percent: bool) -> bool:
    decimals = len(written.split(".")[1]) if "." in written else 0
    return f"{(100 * value if percent else value):.{decimals}f}" == written


def matches(quote: re.Match[str], records: list[dict[str, Any]]) -> bool:
    """Some record has the quoted median (and, if written, min and max) as written."""
    mid, pct, lo, hi = quote.group(1), bool(quote.group(2)), quote.group(3), quote.group(4)
    return any(_same(mid, r["median"], pct)
               and (lo is None or (_same(lo, r["min"], pct) and _same(hi, r["max"], pct)))
               for r in records)


def table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table under ``heading``, header row excluded."""
    section = text.split(heading, 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    start = section.splitlines().index(lines[0])
    rows = []
    for ln in section.splitlines()[start:]:
        if not ln.startswith("|"):
            break
        if not ln.startswith("|---"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return rows[1:]


def unmatched(cells: list[str], records: list[dict[str, Any]]) -> list[str]:
    return [q.group(0) for cell in cells for q in QUOTED.finditer(cell)
            if not matches(q, records)]


def test_the_benchmarks_table_quotes_make_bench():
    records = ratios(RESULTS / "latest.json")
    rows = table(PERFORMANCE, "\n## Benchmarks")
    assert len(rows) >= 15
    bad = {row[0][:70]: miss for row in rows if (miss := unmatched(row[1:2], records))}
    assert not bad, ("docs/performance.md quotes numbers benchmarks/results/latest.json lacks: "
                     f"{bad}")


def test_the_link_table_quotes_make_bench_cluster():
    records = ratios(RESULTS / "cluster" / "latest.json")
    rows = table(PERFORMANCE, "### Against the link")
    # the first column may hold earlier runs' figures for comparison ("1.888 at 04d8625")
    bad = {row[0][:70]: miss for row in rows if (miss := unmatched(row[1:2], records))}
    assert not bad, ("docs/performance.md quotes numbers benchmarks/results/cluster/latest.json "
                     f"lacks: {bad}")


def _loopback() -> dict[str, Any]:
    return json.loads((RESULTS / "peers.json").read_text())["loopback"]["nets"]


NETS = {"demo net": "demo", "`cifar_resnet20_v1`": "resnet20", "ResNet-50": "resnet50"}
PEERS = ["gluon_kv", "gluon", "horovod"]


def test_the_loopback_peers_table_quotes_peers_json():
    nets = _loopback()
    rows = table(PERFORMANCE, "### Loopback")
    assert len(rows) == 3
    for row in rows:
        net = nets[next(v for k, v in NETS.items() if row[0].startswith(k))]
        ms = 1e3 * median(net["peers"]["mxlarge"]["sec_per_step"])
        assert row[1] == f"{ms:.1f}", (row[0], row[1], ms)
        for peer, cell in zip(["gluon_kv", "gluon", "horovod"], row[2:5]):
            q = QUOTED.match(cell)
            assert q and matches(q, [net["peers"][peer]["ratio"]]), (row[0], peer, cell)


def test_the_readmes_loopback_row_quotes_peers_json():
    nets = _loopback()
    row = next(r for r in table(README, "### Against the peers") if r[0].startswith("loopback"))
    for peer, cell in zip(["gluon_kv", "gluon", "horovod"], row[1:4]):
        written = [c.strip() for c in cell.split("/")]
        assert len(written) == 3, cell
        for name, w in zip(["demo", "resnet20", "resnet50"], written):
            value = nets[name]["peers"][peer]["ratio"]["median"]
            assert _same(w, value, False), (peer, name, w, value)


@pytest.mark.parametrize("part,link", [("testbed-1gbit", "1 Gbit/s"),
                                       ("testbed-200mbit", "200 Mbit/s")])
def test_the_testbed_table_quotes_peers_json(part, link):
    records = ratios(RESULTS / "peers.json")
    nets = json.loads((RESULTS / "peers.json").read_text())[part]["nets"]
    part_records = [p["ratio"] for n in nets.values() for p in n["peers"].values()]
    rows = [r for r in table(PERFORMANCE, "### Testbed") if r[0] == link]
    assert rows
    for row in rows:
        ratio_cells = row[3:6]  # gluon_kv, gluon, horovod
        bad = unmatched(ratio_cells, part_records)
        assert not bad, (row[:2], bad, len(records))


README_TESTBED = {"testbed, 3 hosts at 1 Gbit/s, servers co-located": "testbed-1gbit",
                  "testbed, 3 worker hosts + 3 server hosts, 200 Mbit/s": "testbed-200mbit-servers",
                  "testbed, 3 worker hosts + 3 server hosts, 1 Gbit/s": "testbed-1gbit-servers"}


def test_the_readmes_testbed_rows_quote_peers_json():
    """ResNet-50's ratios (the README's rows are ResNet-50 unless named)."""
    parts = json.loads((RESULTS / "peers.json").read_text())
    rows = {r[0]: r for r in table(README, "### Against the peers")}
    for label, part in README_TESTBED.items():
        peers = parts[part]["nets"]["resnet50"]["peers"]
        for peer, cell in zip(PEERS, rows[label][1:4]):
            written = cell.strip("*")
            if written == "—":
                assert peer not in peers or peer == "mxlarge", (label, peer)
                continue
            assert _same(written, peers[peer]["ratio"]["median"], False), (label, peer, cell)
