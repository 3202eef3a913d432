"""The docs cite files and tests; every citation must resolve, so that a claim pinned "by
`tests/x.py::test_y`" points at a test that exists (renaming a test breaks this, not the doc)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "docs/launching.md", "benchmarks/README.md"]
# `path` in backticks: a repository file or directory (with or without ::test_name)
PATH = re.compile(r"`((?:mxlarge|tests|benchmarks|experiments|launch|docs)/[\w./*-]+)"
                  r"(?:::([\w\[\]*-]+))?`")
# `F::test_x` / `FD::test_x`: README's short forms for the two MXNet-facts files
SHORT = {"F": "tests/test_mxnet_facts.py", "FD": "tests/e2e/test_mxnet_facts_dist.py"}
SHORT_REF = re.compile(r"`(FD?)::(test_\w+)`")
# a bare `test_name` or `test_name[param]` cited in prose
BARE = re.compile(r"`(test_\w+)(?:\[[^\]]*\])?`")


def _test_names() -> set[str]:
    return {m.group(1) for p in (ROOT / "tests").rglob("test_*.py")
            for m in re.finditer(r"^def (test_\w+)", p.read_text(), re.M)}


def _defined(path: Path, name: str) -> bool:
    base = name.split("[")[0]
    if "*" in base:
        pattern = re.compile("^def " + base.replace("*", r"\w*") + r"\(", re.M)
        return bool(pattern.search(path.read_text()))
    return re.search(rf"^def {re.escape(base)}\(", path.read_text(), re.M) is not None


@pytest.mark.parametrize("doc", DOCS)
def test_cited_files_and_tests_exist(doc):
    text = (ROOT / doc).read_text()
    missing = []
    for m in PATH.finditer(text):
        rel, name = m.group(1).rstrip("."), m.group(2)
        hits = list(ROOT.glob(rel)) if "*" in rel else [ROOT / rel] if (ROOT / rel).exists() else []
        if not hits:
            missing.append(rel)
        elif name and not any(_defined(h, name) for h in hits if h.is_file()):
            missing.append(f"{rel}::{name}")
    for m in SHORT_REF.finditer(text):
        if not _defined(ROOT / SHORT[m.group(1)], m.group(2)):
            missing.append(m.group(0))
    names = _test_names()
    missing += [m.group(1) for m in BARE.finditer(text) if m.group(1) not in names]
    assert missing == [], f"{doc} cites what does not exist: {missing}"
