"""docs/benchmarks.md's tables are what docs/results/current.json and the run summaries say."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("bench_page_tables", ROOT / "docs" / "results" / "tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_tables_are_up_to_date() -> None:
    tables = _tables()
    specs = json.loads((ROOT / "docs" / "results" / "current.json").read_text())["tables"]
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert tables.render(page, specs) == page, (
        "docs/benchmarks.md's tables differ from docs/results/current.json: regenerate them with "
        "`.venv/bin/python docs/results/tables.py`")


def test_every_summary_the_tables_name_is_in_the_tree() -> None:
    specs = json.loads((ROOT / "docs" / "results" / "current.json").read_text())["tables"]
    sources = [s for t in specs for r in t["rows"] if "from" in r
               for s in (r["from"] if isinstance(r["from"], list) else [r["from"]])]
    missing = [s["file"] for s in sources if not (ROOT / "docs" / "results" / s["file"]).is_file()]
    assert sources and not missing, missing
