"""docs/benchmarks.md's tables are what docs/results/current.json and the run summaries say."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    from bench import page

    return page


def test_the_benchmark_tables_are_up_to_date() -> None:
    tables = _tables()
    specs = json.loads((ROOT / "docs" / "results" / "current.json").read_text())["tables"]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert tables.render(page, specs) == page, (
        "docs/benchmarks.md's tables differ from docs/results/current.json: regenerate them with "
        "`.venv/bin/python -m bench.page`")


def test_every_summary_the_tables_name_is_in_the_tree() -> None:
    specs = json.loads((ROOT / "docs" / "results" / "current.json").read_text())["tables"]
    sources = [s for t in specs for r in t.get("rows", []) if "from" in r
               for s in (r["from"] if isinstance(r["from"], list) else [r["from"]])]
    files = [s["file"] for s in sources]
    for t in specs:  # bench.sessions and bench.embeddings results: a file, or several runs pooled
        if "file" in t:
            files += t["file"] if isinstance(t["file"], list) else [t["file"]]
    missing = [f for f in files if not (ROOT / "docs" / "results" / f).is_file()]
    assert files and not missing, missing


def test_a_fleet_table_that_names_its_cases_shows_those_only() -> None:
    """A run some of whose cases a later run replaced keeps only the cases it still stands for."""
    tables = _tables()
    spec = next(t for t in json.loads((ROOT / "docs" / "results" / "current.json").read_text())["tables"]
                if t.get("kind") == "fleet" and "cases" not in t)
    names = list(tables.fleet_cases(json.loads((ROOT / "docs" / "results" / spec["file"]).read_text())))
    assert len(names) >= 2
    whole, cut = tables.fleet_table(spec), tables.fleet_table({**spec, "cases": names[-1:]})
    label = tables.CASE_NAMES.get(names[0], names[0])
    assert f"| {label} |" in whole and f"| {label} |" not in cut
    assert f"| {tables.CASE_NAMES.get(names[-1], names[-1])} |" in cut
