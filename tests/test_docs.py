"""docs/: every measured report under docs/reports/ is cited by the performance or reliability page,
the documentation's links and report paths name files that exist, no JSON lies loose in docs/, and
no page speaks of development sessions or issues by number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "docs" / "reports"
CITING = (ROOT / "docs" / "performance.md", ROOT / "docs" / "reliability.md")
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
REPORT_PATH = re.compile(r"docs/[\w./{},-]+\.(?:json|png)")
HISTORY = re.compile(r"(session|issue) [0-9]+", re.IGNORECASE)


def expand(pattern: str) -> list[str]:
    """`a-{x,y}.json` -> `a-x.json`, `a-y.json` (the brace lists the docs use for repeated runs)."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [name for choice in match.group(1).split(",") for name in expand(head + choice + tail)]


def test_every_report_is_cited_by_the_performance_or_reliability_page():
    cited = set()
    for page in CITING:
        text = page.read_text()
        cited |= {Path(name).name for path in REPORT_PATH.findall(text) for name in expand(path)}
        cited |= {Path(target).name for target in LINK.findall(text)}
    reports = sorted(path.name for path in REPORTS.iterdir())
    assert reports, "no reports under docs/reports"
    assert not [name for name in reports if name not in cited], "reports nothing cites"


def test_links_and_report_paths_name_existing_files():
    missing = []
    for document in DOCUMENTS:
        text = document.read_text()
        targets = [document.parent / t for t in LINK.findall(text) if "://" not in t]
        targets += [ROOT / name for path in REPORT_PATH.findall(text) for name in expand(path)]
        missing += [f"{document.name}: {t.relative_to(ROOT)}" for t in targets if not t.exists()]
    assert not missing, "\n".join(missing)


def test_the_pages_exist():
    pages = {path.name for path in DOCUMENTS}
    for name in (
        "architecture.md",
        "serving-api.md",
        "speculative-methods.md",
        "correctness.md",
        "adapters.md",
        "performance.md",
        "reliability.md",
        "deployment.md",
        "configuration.md",
    ):
        assert name in pages, name


def test_no_json_directly_in_docs():
    assert not list((ROOT / "docs").glob("*.json"))


def test_no_session_or_issue_numbers_in_the_docs():
    found = [f"{d.name}: {m.group(0)}" for d in DOCUMENTS for m in HISTORY.finditer(d.read_text())]
    assert not found, "\n".join(found)


def test_expand():
    assert expand("r-{a,b}-{1,2}.json") == ["r-a-1.json", "r-a-2.json", "r-b-1.json", "r-b-2.json"]
    assert expand("r.json") == ["r.json"]
