"""The docs read for a reader: short sentences, no issue numbers, no commit ids in prose.

The measure (the same as ``prose_stats.py`` of the issue that asked for it):

* prose only: fenced code blocks, table rows, headings and image lines are left out;
* paragraphs, list items and headings end a unit; a sentence ends at ``.``, ``!`` or ``?``
  followed by a space and a capital, a backtick, an opening bracket, ``*`` or a digit;
  fragments of fewer than 3 words are not sentences;
* a commit id is 7 to 40 hex digits with at least one letter and one digit, in prose (tables
  may carry a "measured at" column);
* "issue N" anywhere on the page: a reader cannot open the tracker.

The limits are for the reader: the median sentence at most 20 words and the 90th percentile at
most 40, on every page. A page over them needs its long sentences split, its figures moved into
a table or its history deleted, not words trimmed to fit.
"""
from __future__ import annotations

import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEDIAN_MAX = 20
P90_MAX = 40
# Every page a reader opens. The sweep reports under docs/results/<sweep>/ are left out: they
# are results files, written by `mxlarge report`, and carry the commits they were measured at.
PAGES = sorted({"README.md", "CHANGELOG.md", "launch/README.md", "benchmarks/README.md",
                *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")
                  if p.name != "report.md")})
FENCE = re.compile(r"```.*?```", re.S)
ITEM = re.compile(r"^([-*+]|\d+\.)\s+")
SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(\[*0-9])")
HASH = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{7,40}(?![0-9a-zA-Z])")
ISSUE = re.compile(r"\bissues? #?\d+", re.I)


@dataclass(frozen=True)
class Prose:
    """What a page's prose measures: words a sentence, commit ids, issue numbers."""

    lengths: list[int]
    hashes: list[str]
    issues: list[str]

    @property
    def median(self) -> float:
        return statistics.median(self.lengths) if self.lengths else 0

    @property
    def p90(self) -> int:
        """The sentence at 90% of the sorted lengths: lengths[int(0.9 (n - 1))]."""
        return self.lengths[int(0.9 * (len(self.lengths) - 1))] if self.lengths else 0


def _units(text: str) -> Iterator[str]:
    block: list[str] = []
    for line in FENCE.sub("\n\n", text).splitlines():
        s = line.strip()
        if not s or s.startswith(("|", "#", "![")):
            if block:
                yield " ".join(block)
            block = []
        elif ITEM.match(s):
            if block:
                yield " ".join(block)
            block = [ITEM.sub("", s)]
        else:
            block.append(s)
    if block:
        yield " ".join(block)


def measure(text: str) -> Prose:
    sentences = [s for u in _units(text) for s in SPLIT.split(u) if len(s.split()) >= 3]
    prose = "\n".join(line for line in FENCE.sub("", text).splitlines()
                      if not line.strip().startswith("|"))
    hashes = [h for h in HASH.findall(prose) if re.search("[a-f]", h) and re.search("[0-9]", h)]
    return Prose(sorted(len(s.split()) for s in sentences), hashes, ISSUE.findall(text))


def test_the_measure_counts_prose_only():
    text = ("# A heading of many words that is not a sentence at all\n\n"
            "One two three four. Five six seven `x` eight.\n"
            "Nine ten eleven.\n\n"
            "- an item of five words\n"
            "| a | table row with many words that do not count |\n\n"
            "```bash\nthe code block is not prose at all either\n```\n"
            "Hi. No.\n")
    p = measure(text)
    assert p.lengths == [3, 4, 5, 5]  # "Hi." and "No." are too short to be sentences
    assert (p.median, p.p90) == (4.5, 5)


def test_the_measure_finds_commit_ids_in_prose_and_issue_numbers_anywhere():
    text = ("Measured at a5baf5e on the testbed. The value 1234567 is a number.\n\n"
            "| measured at | a5baf5e0 |\n\n"
            "As issue 57 asked, and issues #3.\n")
    p = measure(text)
    assert p.hashes == ["a5baf5e"]  # not the digits-only number, not the table's column
    assert p.issues == ["issue 57", "issues #3"]


def test_every_page_is_measured():
    assert {"README.md", "docs/README.md", "docs/performance.md",
            "docs/design/launcher.md"} <= set(PAGES)
    assert not [p for p in PAGES if p.endswith("report.md")]


@pytest.mark.parametrize("page", PAGES)
def test_a_page_reads_in_short_sentences(page):
    p = measure((ROOT / page).read_text())
    assert p.median <= MEDIAN_MAX and p.p90 <= P90_MAX, (
        f"{page}: median {p.median:g} and 90th percentile {p.p90} words a sentence; "
        f"at most {MEDIAN_MAX} and {P90_MAX}")


@pytest.mark.parametrize("page", PAGES)
def test_a_page_cites_no_issue_and_no_commit_in_prose(page):
    p = measure((ROOT / page).read_text())
    assert not p.issues and not p.hashes, f"{page}: {p.issues + p.hashes}"
