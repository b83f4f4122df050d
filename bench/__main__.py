"""``python -m bench run --config FILE [--out DIR] [--base-url URL]``, ``python -m bench report`` and
``python -m bench gateway`` (the gateway alone, see bench/gateway.py), ``python -m bench worker``
(the worker alone, see bench/worker.py), ``python -m bench intake`` (a worker taking in waves
of jobs, see bench/intake.py), ``python -m bench churn`` (a gateway taking in new requests while
it streams others, see bench/churn.py), ``python -m bench console-shot`` (docs/img/console.png)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from bench.stack import ROOT


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt  # so that every started process is stopped on SIGTERM too


def cmd_run(a: argparse.Namespace) -> int:
    from bench.config import load_workload
    from bench.report import write_report
    from bench.runner import run

    w = load_workload(a.config)
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / f"{w.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    signal.signal(signal.SIGTERM, _interrupt)
    only = set(a.targets.split(",")) if a.targets else None
    doc = run(w, out, a.base_url, a.api_key or os.environ.get("INFERQ_BENCH_API_KEY"), only)
    md = write_report(doc, out / "results.md", out)
    print("\n" + md)
    print(f"results: {out / 'results.json'}  table: {out / 'results.md'}  plots: {out}/*.png")
    failed = [r for r in doc["summary"] if r.get("failed") or r.get("level") == "-"]
    return 1 if failed and a.strict else 0


def cmd_report(a: argparse.Namespace) -> int:
    from bench.report import write_report

    doc = json.loads(Path(a.results).read_text())
    md = write_report(doc, Path(a.md) if a.md else None, Path(a.png_dir) if a.png_dir else None, a.prefix)
    print(md)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description="inferq benchmark harness")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a workload against every target in its config")
    r.add_argument("--config", required=True, help="workload JSON (bench/configs/*.json)")
    r.add_argument("--out", help="output folder (default bench/results/NAME-TIMESTAMP)")
    r.add_argument("--base-url", help="use this running gateway instead of starting a stack")
    r.add_argument("--api-key", help="API key for --base-url (default: $INFERQ_BENCH_API_KEY)")
    r.add_argument("--strict", action="store_true", help="exit 1 if any request or target failed")
    r.add_argument("--targets", help="run only these targets (comma-separated names); join runs with bench.merge")
    r.set_defaults(func=cmd_run)
    r = sub.add_parser("report", help="markdown table and PNG plots from a results.json")
    r.add_argument("results")
    r.add_argument("--md", help="write the markdown here")
    r.add_argument("--png-dir", help="write throughput.png and ttft.png here")
    r.add_argument("--prefix", default="", help="file name prefix of the plots")
    r.set_defaults(func=cmd_report)
    sub.add_parser("gateway", help="gateway alone: streamed tokens/s of one gateway process", add_help=False)
    sub.add_parser("worker", help="worker alone: CPU per streamed token of one worker process", add_help=False)
    sub.add_parser("intake", help="worker intake: how fast one worker takes in a wave of jobs", add_help=False)
    sub.add_parser("churn", help="gateway churn: its intake while it streams, SSE or WebSocket", add_help=False)
    sub.add_parser("dashboard", help="draw the Grafana dashboard's panels from a Prometheus", add_help=False)
    sub.add_parser("console-shot", help="screenshot the browser console of a running gateway", add_help=False)
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["gateway"]:  # its own argument parser
        from bench.gateway import main as gateway_main

        return gateway_main(argv[1:])
    if argv[:1] == ["worker"]:
        from bench.worker import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["intake"]:
        from bench.intake import main as intake_main

        return intake_main(argv[1:])
    if argv[:1] == ["churn"]:
        from bench.churn import main as churn_main

        return churn_main(argv[1:])
    if argv[:1] == ["dashboard"]:
        from bench.dashboard import main as dashboard_main

        return dashboard_main(argv[1:])
    if argv[:1] == ["console-shot"]:
        from bench.console_shot import main as console_shot_main

        return console_shot_main(argv[1:])
    a = p.parse_args(argv)
    try:
        return int(a.func(a))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
