"""The docs cite files and tests; every citation must resolve, so that a claim pinned "by
`tests/x.py::test_y`" points at a test that exists (renaming a test breaks this, not the doc).
Every relative link `[x](path#anchor)` must reach a file and, for an anchor into a markdown
file, one of its headings (GitHub's slugs); and a message of the code that sends the reader to
"'Section' in docs/page.md" must name a heading of that page."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The README, every page under docs/ (the generated reports under docs/results/<sweep>/ too:
# `mxlarge report` writes them, and they cite nothing that can go stale but their own plots),
# and the two READMEs that stay beside their code.
DOCS = sorted({"README.md", "launch/README.md", "benchmarks/README.md",
               *(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))})
# `path` in backticks: a repository file or directory (with or without ::test_name)
PATH = re.compile(r"`((?:mxlarge|tests|benchmarks|experiments|launch|docs)/[\w./*-]+)"
                  r"(?:::([\w\[\]*-]+))?`")
# `F::test_x` / `FD::test_x`: the short forms for the two MXNet-facts files
SHORT = {"F": "tests/test_mxnet_facts.py", "FD": "tests/e2e/test_mxnet_facts_dist.py"}
SHORT_REF = re.compile(r"`(FD?)::(test_\w+)`")
# a bare `test_name` or `test_name[param]` cited in prose
BARE = re.compile(r"`(test_\w+)(?:\[[^\]]*\])?`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
# Links of generated reports that do not resolve, and why; such a report is `mxlarge report`'s
# output, not edited by hand, and remaking it needs the sweep's MLflow store. A link that starts
# to resolve must leave this list.
KNOWN_BROKEN: dict[str, list[str]] = {}
# what the code tells a reader to read: "see 'Who can reach a job' in docs/security.md"
SEE = re.compile(r"'([^']+)' in (docs/[\w./-]+\.md)")


def _test_names() -> set[str]:
    return {m.group(1) for p in (ROOT / "tests").rglob("test_*.py")
            for m in re.finditer(r"^def (test_\w+)", p.read_text(), re.M)}


def _defined(path: Path, name: str) -> bool:
    base = name.split("[")[0]
    if "*" in base:
        pattern = re.compile("^def " + base.replace("*", r"\w*") + r"\(", re.M)
        return bool(pattern.search(path.read_text()))
    return re.search(rf"^def {re.escape(base)}\(", path.read_text(), re.M) is not None


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where `[x](y)` is not a link and
    `# comment` is not a heading."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (link targets and markup dropped),
    lower case, every character but letters, digits, `_`, `-` and spaces removed, spaces as
    `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the headings of a markdown file (a repeated heading gets
    `-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for m in HEADING.finditer(FENCE.sub("", path.read_text())):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slugs_follow_githubs_rules():
    assert slug("A cluster on one box: `make test-cluster`") == \
        "a-cluster-on-one-box-make-test-cluster"
    assert slug("Cluster jobs (dmlc_tracker)") == "cluster-jobs-dmlc_tracker"
    assert slug('What "faithful" means here') == "what-faithful-means-here"
    assert slug("The packet filter: `--firewall`") == "the-packet-filter---firewall"
    assert slug("Against [the peers](x.md) γ/β") == "against-the-peers-γβ"


def test_the_docs_are_found():
    assert {"README.md", "docs/README.md", "docs/launching.md", "docs/trainer.md",
            "docs/troubleshooting.md", "docs/mxnet-facts.md"} <= set(DOCS)


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


@pytest.mark.parametrize("doc", DOCS)
def test_relative_links_resolve_to_files_and_headings(doc):
    path = ROOT / doc
    broken = []
    for m in LINK.finditer(_prose(path.read_text())):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(target)
        elif ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert broken == KNOWN_BROKEN.get(doc, []), f"{doc} links to what does not exist: {broken}"


def test_sections_the_code_points_readers_to_exist():
    cited = [(p, m.group(1), m.group(2)) for p in sorted((ROOT / "mxlarge").rglob("*.py"))
             for m in SEE.finditer(re.sub(r'"\s*\n\s*f?"', "", p.read_text()))]
    assert cited, "expected the firewall's 'Who can reach a job' pointer at least"
    missing = [f"{p.relative_to(ROOT)}: '{title}' in {doc}" for p, title, doc in cited
               if not (ROOT / doc).exists() or slug(title) not in anchors(ROOT / doc)]
    assert missing == [], missing
