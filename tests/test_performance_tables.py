"""docs/performance.md's measured tables are what ``benchmarks/tables.py`` renders from the
committed results (``benchmarks/results/``), so a re-run whose tables were not rewritten fails
here; and the page stays short, its prose free of commit ids and issue numbers."""
from __future__ import annotations

import copy
import re

import pytest

from benchmarks import choices, tables

TEXT = tables.PAGE.read_text()


def test_the_generated_tables_are_those_of_the_committed_results():
    problems = tables.stale(TEXT, tables.render(tables.load()))
    assert problems == [], f"{problems}: run `python -m benchmarks.tables --write`"


def test_every_table_has_one_region_and_every_marker_a_pair():
    names = [m.group(2) for m in tables.REGION.finditer(TEXT)]
    assert sorted(names) == sorted(tables.TABLES)
    assert TEXT.count("<!-- generated:") == TEXT.count("<!-- end generated -->") == len(names)


def test_a_changed_result_makes_its_table_stale():
    data = copy.deepcopy(tables.load())
    data["peers"]["loopback"]["nets"]["demo"]["peers"]["gluon"]["ratio"]["median"] += 0.01
    assert tables.stale(TEXT, tables.render(data)) == ["peers-loopback: out of date"]
    data = copy.deepcopy(tables.load())
    next(r for r in data["bench"]["benchmarks"]["update_kernels"]["ratios"]
         if r["key"] == "update_kernels")["status"] = "MISS"
    assert tables.stale(TEXT, tables.render(data)) == ["bench: out of date"]


@pytest.mark.parametrize("part,name", [("compression", "choices-compression"),
                                       ("lars", "choices-lars")])
def test_a_changed_accuracy_run_makes_its_table_stale(part, name):
    data = copy.deepcopy(tables.load())
    data["choices"][part]["runs"][-1]["accuracy"] += 0.01
    assert tables.stale(TEXT, tables.render(data)) == [f"{name}: out of date"]
    data = copy.deepcopy(tables.load())
    data["choices"][part]["commit"] = "0" * 40 + "+dirty"
    assert tables.stale(TEXT, tables.render(data)) == [f"{name}: out of date"]


def test_the_accuracy_tables_quote_every_run_of_choices_json():
    data = tables.load()["choices"]
    for part, name in (("compression", "choices-compression"), ("lars", "choices-lars")):
        rows = [ln for ln in tables.regions(TEXT)[name].splitlines() if ln.startswith("| ")]
        cells = rows[-1].strip("| ").split(" | ")
        quoted = [float(x) for c in cells[1:-1] for x in c.strip("*").split(" / ")]
        assert sorted(quoted) == sorted(round(r["accuracy"], 3) for r in data[part]["runs"])
        assert cells[-1] == tables.short(data[part]["commit"])


def test_choices_json_holds_the_runs_benchmarks_choices_makes():
    """Each part's results are the commands benchmarks/choices.py runs today, every one."""
    data = tables.load()["choices"]
    for part, runs in (("compression", choices.compression_runs()),
                       ("lars", choices.lars_runs())):
        assert [r["command"] for r in data[part]["runs"]] == \
            ["mxlarge " + " ".join(r["argv"]) for r in runs]


def test_write_restores_a_stale_page_and_check_says_so(tmp_path, capsys):
    page = tmp_path / "performance.md"
    body = tables.regions(TEXT)["bounds"]
    page.write_text(TEXT.replace(body, "| stale |\n"))
    assert tables.main(["--check", "--page", str(page)]) == 1
    assert "bounds: out of date" in capsys.readouterr().err
    assert tables.main(["--write", "--page", str(page)]) == 0
    assert page.read_text() == TEXT
    assert tables.main(["--check", "--page", str(page)]) == 0


def test_check_names_a_missing_or_unknown_region(tmp_path):
    page = tmp_path / "performance.md"
    page.write_text(TEXT.replace("generated: bounds -->", "generated: bound -->"))
    assert sorted(tables.stale(page.read_text(), tables.render(tables.load()))) == \
        ["bound: no such table", "bounds: no such region in the page"]
    assert tables.main(["--check", "--page", str(page)]) == 1


def test_ratios_keep_the_forms_the_docs_quote():
    r = {"median": 1.3698, "min": 0.75207, "max": 1.47696, "rounds": 3}
    assert tables.ratio(r) == "1.370 (0.75–1.48)"
    assert tables.ratio({**r, "rounds": 2}) == "1.370"
    assert tables.ratio({"median": 0.9647, "min": 0.8483, "max": 1.0372, "rounds": 9,
                         "unit": "%"}) == "96.5% (85–104%)"
    assert tables.ratio({"median": 68.448, "min": 65.96, "max": 71.15, "rounds": 5}) == \
        "68.4 (66–71)"
    assert tables.target({"target": 1.05, "higher_is_better": False}) == "≤ 1.05"
    assert tables.target({"target": None}) == "—"
    assert tables.short("a5baf5ecf3450f9a3b1c4305a914b50d42f3845e+dirty") == "a5baf5e+dirty"


def test_the_page_is_at_most_200_lines():
    assert len(TEXT.splitlines()) <= 200


def _prose(text: str) -> str:
    """The page without code blocks and table lines (a table may name the commit it was
    measured at)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("|"))


def test_the_prose_names_no_commit_and_no_issue_number():
    prose = _prose(TEXT)
    commits = [h for h in re.findall(r"(?<![0-9a-zA-Z])[0-9a-f]{7,40}(?![0-9a-zA-Z])", prose)
               if re.search(r"[a-f]", h) and re.search(r"[0-9]", h)]
    assert commits == []
    assert re.findall(r"\bissues? #?\d+", prose, flags=re.I) == []
