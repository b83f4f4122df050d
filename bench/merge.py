"""Merge the summaries of several runs of one workload into one document (for one table/plot):

    python -m bench.merge OUT.json RUN.json[:SUFFIX] ... [--only TARGET,TARGET]

Raw per-request timings are dropped; each run's environment is kept under ``runs``. Ratios to
``inprocess`` and ``vllm-serve`` are recomputed across runs, so compare only runs of the same
workload and hardware (e.g. ``bench run --targets`` calls on one machine, one after the other).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.metrics import add_ratios, summary_rows


def merge(paths: list[str], only: set[str] | None) -> dict[str, Any]:
    docs, out = [], None
    for spec in paths:
        path, _, suffix = spec.partition(":")
        doc = json.loads(Path(path).read_text())
        docs.append(doc)
        targets = {name + suffix: dict(t, levels={k: _lean(lv) for k, lv in t["levels"].items()})
                   for name, t in doc["targets"].items() if not only or name in only}
        if out is None:
            out = {k: v for k, v in doc.items() if k not in ("summary", "targets")}
            out.update(summary=[], targets={}, runs=[])
        out["targets"].update(targets)
        out["runs"].append({"file": path, "environment": doc.get("environment"), "started_at": doc.get("started_at")})
    assert out is not None
    add_ratios(out["targets"])
    out["summary"] = summary_rows(out["targets"])
    return out


def _lean(level: dict[str, Any]) -> dict[str, Any]:
    """A level without its per-request timings (kept: each repeat's summary)."""
    lv = {k: v for k, v in level.items() if k != "requests"}
    if "runs" in lv:
        lv["runs"] = [{k: v for k, v in r.items() if k != "requests"} for r in lv["runs"]]
    return lv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("runs", nargs="+")
    p.add_argument("--only", help="comma-separated target names to keep")
    a = p.parse_args()
    only = set(a.only.split(",")) if a.only else None
    Path(a.out).write_text(json.dumps(merge(a.runs, only), indent=1))


if __name__ == "__main__":
    main()
