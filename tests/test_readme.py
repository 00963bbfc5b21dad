"""The README stays true: every metric definition and CSV column is documented."""

from __future__ import annotations

from pathlib import Path

from bench.metrics.records import METRIC_DEFINITIONS
from bench.store import REQUEST_CSV_COLUMNS, SUMMARY_CSV_COLUMNS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_readme_quick_start_is_the_two_make_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.startswith("make ")]
    assert commands == ["make run", "make test"]


def test_every_metric_definition_is_in_the_readme() -> None:
    for name, definition in METRIC_DEFINITIONS.items():
        assert f"| `{name}` | {definition} |" in README, name


def test_every_csv_column_is_in_the_readme() -> None:
    for col in REQUEST_CSV_COLUMNS:
        assert f"`{col}`" in README, col
    expanded = README.replace("\n", " ")
    for col in SUMMARY_CSV_COLUMNS:
        stem, _, stat = col.rpartition("_")
        assert col in expanded or (
            stat in {"mean", "p50", "p90", "p99"} and f"{stem}_{{mean,p50,p90,p99}}" in expanded
        ), col
