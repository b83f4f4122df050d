"""``python -m bench dashboard``: draw deploy/grafana/dashboards/inferq.json's panels from a real
Prometheus (each panel's PromQL over a time range, with matplotlib), for docs where Grafana
itself cannot run. The figure is what the dashboard would show for the same range.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import httpx

from bench.stack import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "inferq.json"


def _legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    r = httpx.get(f"{prometheus}/api/v1/query_range", timeout=30,
                  params={"query": expr, "start": start, "end": end, "step": step})
    r.raise_for_status()
    return list(r.json()["data"]["result"])


def draw(prometheus: str, minutes: float, out: Path, end: float | None = None) -> int:
    """Write the figure; returns how many series had data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = json.loads(DASHBOARD.read_text())["panels"]
    end = end or time.time()
    start, step = end - minutes * 60, max(1.0, minutes * 60 / 240)
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 3.0), squeeze=False)
    drawn = 0
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            for series in query_range(prometheus, target["expr"], start, end, step):
                xs = [(float(t) - start) / 60 for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                if not any(math.isfinite(y) for y in ys):
                    continue
                ax.plot(xs, ys, label=_legend(target.get("legendFormat", ""), series["metric"]), linewidth=1.2)
                drawn += 1
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        ax.set_title(panel["title"] + (f" ({unit})" if unit in ("s", "percentunit") else ""), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("minutes", fontsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"inferq dashboard: {len(panels)} panels, {minutes:g} minutes, from Prometheus", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    return drawn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench dashboard", description=__doc__)
    p.add_argument("--prometheus", default="http://127.0.0.1:9090")
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "dashboard.png"))
    a = p.parse_args(argv)
    n = draw(a.prometheus, a.minutes, Path(a.out))
    print(f"{a.out}: {n} series")
    return 0 if n else 1
