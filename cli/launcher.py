"""``inferq up``: start Redis (if nothing answers), one worker and the gateway; stop all on Ctrl-C."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

from inferq.cli.procs import Proc, Procs, http_ok, redis_pings, start_redis
from inferq.shared.redis import RedisTarget
from inferq.shared.settings import Settings


def _started(p: Proc) -> None:
    print(f"  {p.name:<8} pid {p.pid:<7} log {p.log}", flush=True)


def cli_command(cwd: Path | None = None) -> str:
    """The ``inferq`` command as a user can type it here: ``inferq`` when that is the one on PATH,
    else this interpreter's script (``.venv/bin/inferq`` from a checkout that ``make run`` set up),
    else ``python -m inferq.cli`` with this interpreter."""
    script = Path(sys.executable).parent / "inferq"  # not resolved: a venv's python is a symlink
    if not (script.is_file() and os.access(script, os.X_OK)):
        return f"{shlex.quote(sys.executable)} -m inferq.cli"
    on_path = shutil.which("inferq")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "inferq"
    try:
        rel = script.relative_to(cwd or Path.cwd())
    except ValueError:
        return shlex.quote(str(script))
    return shlex.quote(str(rel) if rel.parent != Path(".") else f"./{rel}")  # a bare name is looked up on PATH


def ready_banner(base: str, model: str, cli: str | None = None, own_url: bool = False) -> str:
    """What ``inferq up`` prints once the gateway is ready: commands that work as printed (with
    ``own_url``, the gateway is not where the CLI looks by default, so they name it)."""
    cli = cli or cli_command()
    url = f" --url {base}" if own_url else ""
    stream, generate = f"stream <id>{url}", f"generate 'Hello'{url}"
    return (f"\ninferq is ready at {base} serving model {model!r}. Try:\n"
            f"  curl -s {base}/v1/jobs -H 'content-type: application/json' "
            f"-d '{{\"prompt\": \"Hello\", \"max_tokens\": 32}}'\n"
            f"  curl -s {base}/v1/jobs/<id>\n"
            f"  {cli} {stream:<19} # tokens over WebSocket\n"
            f"  {cli} {generate:<19} # submit + stream on one socket\n"
            f"Browser console: {base}/console   API docs: {base}/docs   Ctrl-C stops everything.")


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def up(settings: Settings, host: str | None = None, port: int | None = None) -> int:
    host, port = host or settings.host, port or settings.port
    logs = settings.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Ctrl-C and SIGTERM stop everything, however this was started: a process started in the
    # background of a script (or by one that was) inherits SIGINT ignored, and Python keeps it so
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    print("inferq up: starting", flush=True)
    with Procs(logs) as procs:
        where = RedisTarget.of(settings)  # printed without its password
        if not redis_pings(settings):
            u = urlparse(settings.redis_url)
            if where.sentinels or u.hostname not in ("127.0.0.1", "localhost", "::1"):
                print(f"Redis at {where} does not answer, and it is not a local one I can start.")
                return 1
            try:
                _started(procs.add(start_redis(u.port or 6379, logs, env=env)))
            except (RuntimeError, TimeoutError) as e:
                print(f"could not start Redis: {e}")
                return 1
        else:
            print(f"  redis    using {where}")
        py = [sys.executable, "-m", "inferq.cli"]
        _started(procs.start("worker", [*py, "worker"], env))
        _started(procs.start("gateway", [*py, "api", "--host", host, "--port", str(port)], env))
        base = f"http://{host}:{port}"
        try:
            announced = False
            while True:
                for p in procs.procs:
                    if not p.alive():
                        print(f"\n{p.name} exited with code {p.returncode}; last lines of {p.log}:\n"
                              f"{p.tail(20)}")
                        return 1
                if not announced and http_ok(f"{base}/readyz"):
                    announced = True
                    own_url = (host, port) != (settings.host, settings.port)  # not where the CLI looks
                    print(ready_banner(base, settings.model_name, own_url=own_url), flush=True)
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping... (Ctrl-C again kills what is left)", flush=True)
            return 0
        finally:
            _stop(procs)


def _stop(procs: Procs) -> None:
    """Stop every process gracefully (a worker finishes or hands back its jobs); a second Ctrl-C
    or SIGTERM meanwhile kills what is left."""
    try:
        procs.stop()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("killing what is left...", flush=True)
        procs.kill()
    print("stopped.", flush=True)
