"""The README and the docs stay true.

- The README's quick start is the two make commands, and the README stays a README (CONVENTIONS rule 21).
- docs/metrics.md carries every metric definition word for word, and documents every CSV column in the
  order the CSV writes them (a column renamed, added or dropped without its doc fails here: rule 8).
- docs/reports.md documents the sweep CSV's lead columns in order.
- Every relative link (and its #anchor) in the README, docs/ and studies/ points at something that exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.metrics.records import METRIC_DEFINITIONS
from bench.report.csv_export import SWEEP_CSV_LEAD_COLUMNS
from bench.store.rows import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
METRICS_DOC = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
REPORTS_DOC = (ROOT / "docs" / "reports.md").read_text(encoding="utf-8")
STATS = ("mean", "p50", "p90", "p99")


def _section(text: str, heading: str) -> str:
    """The text under ``heading`` (a whole line, e.g. ``## Metric definitions``) up to the next heading of any level."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def _first_cells(table_text: str) -> list[str]:
    """The backticked name in the first cell of each body row of the markdown table(s) in ``table_text``."""
    names = []
    for line in table_text.splitlines():
        cell = line.split("|")[1].strip() if line.startswith("|") else ""
        match = re.fullmatch(r"`([^`]+)`", cell)
        if match:
            names.append(match.group(1))
    return names


def _expand(name: str) -> list[str]:
    """``ttft_ms_{mean,p50,p90,p99}`` -> its four columns; any other name -> itself."""
    stem, brace, rest = name.partition("_{")
    if not brace:
        return [name]
    assert rest == ",".join(STATS) + "}", name
    return [f"{stem}_{stat}" for stat in STATS]


def test_readme_quick_start_is_the_two_make_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.startswith("make ")]
    assert commands == ["make run", "make test"]


def test_readme_is_a_readme_that_points_at_the_docs() -> None:
    assert len(README.splitlines()) <= 300
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name})" in README, f"the README's Docs index does not link docs/{doc.name}"
    assert "](studies/README.md)" in README


def test_every_metric_definition_is_in_the_metric_docs() -> None:
    for name, definition in METRIC_DEFINITIONS.items():
        assert f"| `{name}` | {definition} |" in METRICS_DOC, name
    documented = _first_cells(_section(METRICS_DOC, "## Metric definitions"))
    assert sorted(documented) == sorted(METRIC_DEFINITIONS), "a documented metric that no longer exists, or a repeat"


def test_every_request_csv_column_is_documented_in_order() -> None:
    documented = _first_cells(_section(METRICS_DOC, "### Per-request CSV columns"))
    assert documented == list(REQUEST_CSV_COLUMNS)


def test_every_summary_csv_column_is_documented_in_order() -> None:
    names = _first_cells(_section(METRICS_DOC, "### Summary CSV columns"))
    documented = [col for name in names for col in _expand(name)]
    assert documented == list(SUMMARY_CSV_COLUMNS)


def test_sweep_csv_lead_columns_are_documented_in_order() -> None:
    documented = _first_cells(_section(REPORTS_DOC, "## Sweep CSV"))
    assert "engine.<option>" in documented  # the swept engine options' columns, between request_rate and repeat
    assert [c for c in documented if c != "engine.<option>"] == list(SWEEP_CSV_LEAD_COLUMNS)


def _anchors(md: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file (code blocks skipped, repeats numbered)."""
    anchors: set[str] = set()
    fenced = False
    for line in md.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = 0
        while (slug if n == 0 else f"{slug}-{n}") in anchors:
            n += 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def test_every_relative_link_in_the_docs_resolves() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "studies").glob("*.md"))]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
