"""The numbers the README and docs/performance.md quote are the results files'.

docs/performance.md's measured tables are rendered from the committed results
(``benchmarks/results/``) by ``benchmarks/tables.py``, and tests/test_performance_tables.py
fails when one is stale; these tests read every ratio those tables quote back from the results
files, its median (to the decimals written) and, where a range is written, its min and max,
and check that the page's prose quotes no ratio the results lack. The README's tables are
typed by hand: a re-run whose numbers are not copied into them fails here.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median
from typing import Any

import pytest

from benchmarks.tables import regions

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


def generated(name: str) -> list[list[str]]:
    """The rows (cells) of docs/performance.md's generated table ``name``, header included."""
    return [[c.strip() for c in ln.strip().strip("|").split("|")]
            for ln in regions(PERFORMANCE)[name].splitlines()
            if ln.startswith("|") and not ln.startswith("|---")]


def test_the_benchmarks_table_quotes_make_bench():
    records = ratios(RESULTS / "latest.json")
    header, *rows = generated("bench")
    assert header[2] == "median (min–max)" and len(rows) >= 8
    bad = {row[1][:70]: miss for row in rows if (miss := unmatched(row[2:3], records))}
    assert not bad, ("docs/performance.md quotes numbers benchmarks/results/latest.json lacks: "
                     f"{bad}")


def test_the_link_table_quotes_make_bench_cluster():
    records = ratios(RESULTS / "cluster" / "latest.json")
    header, *rows = generated("bench-cluster")
    assert header[2] == "median (min–max)" and rows
    bad = {row[1][:70]: miss for row in rows if (miss := unmatched(row[2:3], records))}
    assert not bad, ("docs/performance.md quotes numbers benchmarks/results/cluster/latest.json "
                     f"lacks: {bad}")


def _loopback() -> dict[str, Any]:
    return json.loads((RESULTS / "peers.json").read_text())["loopback"]["nets"]


NETS = {"demo net": "demo", "`cifar_resnet20_v1`": "resnet20", "ResNet-50": "resnet50"}
PEERS = ["gluon_kv", "gluon", "horovod"]


def test_the_loopback_peers_table_quotes_peers_json():
    nets = _loopback()
    header, *rows = generated("peers-loopback")
    assert header[2:5] == [f"`{p}`" for p in PEERS] and len(rows) == 3
    for row in rows:
        net = nets[next(v for k, v in NETS.items() if row[0].startswith(k))]
        ms = 1e3 * median(net["peers"]["mxlarge"]["sec_per_step"])
        assert row[1] == f"{ms:.1f}", (row[0], row[1], ms)
        for peer, cell in zip(PEERS, row[2:5]):
            q = QUOTED.match(cell)
            assert q and matches(q, [net["peers"][peer]["ratio"]]), (row[0], peer, cell)


@pytest.mark.parametrize("name,parts", [
    ("peers-testbed-1gbit", ["testbed-1gbit"]),
    ("peers-testbed-200mbit", ["testbed-200mbit"]),
    ("peers-server-hosts", ["testbed-200mbit-servers", "testbed-1gbit-servers"])])
def test_the_testbed_tables_quote_peers_json(name, parts):
    data = json.loads((RESULTS / "peers.json").read_text())
    nets = [n for part in parts for n in data[part]["nets"].values()]
    part_records = [p["ratio"] for n in nets for p in n["peers"].values()]
    part_records += [t for n in nets for t in n.get("targets", [])]
    header, *rows = generated(name)
    assert rows and header[-1] == "measured at"
    first = header.index("mxlarge ms/step") + 1
    bad = {row[0]: miss for row in rows if (miss := unmatched(row[first:-1], part_records))}
    assert not bad


def test_the_performance_pages_prose_quotes_only_results():
    """A ratio in the page's prose (outside its tables and code; 3 decimals, at least 0.1, as
    1.053) is a median or a target of some results file: prose keeps no old run's numbers."""
    records = [r for path in sorted(RESULTS.rglob("*.json")) for r in ratios(path)]
    records += [{**r, "median": r["target"]} for r in records if r.get("target") is not None]
    prose = re.sub(r"```.*?```", "", PERFORMANCE, flags=re.S)
    prose = "\n".join(ln for ln in prose.splitlines() if not ln.lstrip().startswith("|"))
    quoted = [q for q in QUOTED.finditer(prose)
              if len(q.group(1).split(".")[1]) >= 3 and float(q.group(1)) >= 0.1]
    assert [q.group(0) for q in quoted if not matches(q, records)] == []


def test_the_readmes_loopback_row_quotes_peers_json():
    nets = _loopback()
    row = next(r for r in table(README, "### Against the peers") if r[0].startswith("loopback"))
    for peer, cell in zip(["gluon_kv", "gluon", "horovod"], row[1:4]):
        written = [c.strip() for c in cell.split("/")]
        assert len(written) == 3, cell
        for name, w in zip(["demo", "resnet20", "resnet50"], written):
            value = nets[name]["peers"][peer]["ratio"]["median"]
            assert _same(w, value, False), (peer, name, w, value)


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
