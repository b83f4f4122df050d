"""The ``inferq`` command: ``api``, ``worker``, ``up`` (all in one) and ``bench``."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from inferq.shared import logs
from inferq.shared.settings import get_settings

EXIT_CODES = """exit codes:
  0    the job succeeded (--after its last event too: nothing more to print but its final status)
  1    the job failed or was cancelled, or the gateway refused it (unknown job, invalid request, full queue)
  2    bad arguments or settings
  3    the gateway cannot be reached at the URL, or the connection was lost before the job ended
  130  interrupted (Ctrl-C; generate cancels its job)"""


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from inferq.api import metrics
    from inferq.api.app import create_app
    from inferq.api.connections import uvicorn_options

    s = get_settings()
    workers = args.workers or s.api_workers
    if workers > 1:  # each process creates its metrics after this: their counters add up at a scrape
        metrics.prepare_multiprocess()
    # several processes need the app as an import string; they share nothing but Redis
    app = "inferq.api.app:create_app" if workers > 1 else create_app(s)
    # JSON logs: uvicorn's own loggers go through the root handler (shared/logs.py) too
    log_config = {} if s.log_format == "json" else uvicorn.config.LOGGING_CONFIG
    # http, ws (uvicorn's httptools and sans-I/O protocols with the gateway's limits) and keep-alive:
    # api/connections.py; `inferq up` runs this command for its gateway
    uvicorn.run(app, factory=workers > 1, workers=workers, host=args.host or s.host,
                port=args.port or s.port, log_level=s.log_level.lower(), **uvicorn_options(s),
                log_config=log_config or None,
                ws_max_size=s.max_body_bytes, ws_per_message_deflate=s.ws_compression,
                timeout_graceful_shutdown=5)
    return 0


def cmd_worker(_args: argparse.Namespace) -> int:
    from inferq.worker.main import run_worker

    return run_worker(get_settings().log_level)


def cmd_up(args: argparse.Namespace) -> int:
    from inferq.cli.launcher import up

    return up(get_settings(), host=args.host, port=args.port)


def _gateway(args: argparse.Namespace) -> str:
    """--url, or the gateway that ``inferq api``/``up`` runs with these settings (one listening on
    every address is reached on the loopback one)."""
    s = get_settings()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(s.host, s.host)
    return args.url or f"http://{f'[{host}]' if ':' in host else host}:{s.port}"


def cmd_stream(args: argparse.Namespace) -> int:
    from inferq.cli.wsclient import stream

    return stream(_gateway(args), args.job_id, args.after, args.raw)


def cmd_generate(args: argparse.Namespace) -> int:
    from inferq.cli.wsclient import generate

    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature}
    return generate(_gateway(args), body, args.raw)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # the harness parses its own arguments
        try:
            from bench.__main__ import main as bench_main
        except ImportError:
            print("the benchmark harness runs from a source checkout: `make bench` or `python -m bench`",
                  file=sys.stderr)
            return 2
        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="inferq", description="Queue-based LLM inference on vLLM.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="the benchmark harness, from a source checkout: inferq bench run|report|gateway ...",
                   add_help=False)
    p = sub.add_parser("api", help="run the gateway (FastAPI on uvicorn)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int, help="gateway processes on this port (default INFERQ_API_WORKERS)")
    p.set_defaults(func=cmd_api)
    p = sub.add_parser("worker", help="run a worker: Celery threads pool + one vLLM engine")
    p.set_defaults(func=cmd_worker)
    p = sub.add_parser("up", help="Redis (if needed) + one worker + the gateway; Ctrl-C stops all")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(func=cmd_up)
    p = sub.add_parser("stream", help="print a job's tokens as they arrive")
    p.add_argument("job_id")
    p.add_argument("--after", type=int, default=0, help="resume after this seq")
    p.set_defaults(func=cmd_stream)
    p = sub.add_parser("generate", help="submit a prompt over WebSocket and print its tokens")
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.set_defaults(func=cmd_generate)
    for name in ("stream", "generate"):
        sub.choices[name].add_argument("--url", help="the gateway, e.g. http://127.0.0.1:8000 or ws://... "
                                       "(default: INFERQ_HOST and INFERQ_PORT)")
        sub.choices[name].add_argument("--raw", action="store_true", help="print the JSON events")
        sub.choices[name].epilog = EXIT_CODES
        sub.choices[name].formatter_class = argparse.RawDescriptionHelpFormatter
    args = parser.parse_args(argv)
    try:
        settings = get_settings()
    except ValidationError as e:  # an INFERQ_* variable that does not parse: one line, no traceback
        # never the values: a settings check may see every variable, API keys and passwords too
        print("error: invalid settings: " + "; ".join(
            (f"INFERQ_{'_'.join(map(str, err['loc'])).upper()}: " if err["loc"] else "") + err["msg"]
            for err in e.errors(include_input=False)), file=sys.stderr)
        return 2
    logs.setup(settings, {"api": "gateway", "worker": "worker"}.get(args.command, "inferq"))
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `inferq stream ID | head`: the reader left, which is fine
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
