"""The quickstart's commands as a user runs them: ``inferq up``, then ``inferq generate`` and
``inferq stream`` against it, then Ctrl-C.

One ``inferq up`` serves the whole module (an engine start is the slow part). It uses the
session's redis-server, on a database of its own: its worker is not one of the session stack's
(queues, job records and the worker registry are per database).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from tests.conftest import ahead, inferq_env, quiet_port, take
from tests.helpers import submit, wait_status
from tests.wait import eventually

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "inferq.cli"]
READY = "inferq is ready"


@dataclass
class Up:
    """A running ``inferq up`` and everything it has printed so far."""

    proc: subprocess.Popen[bytes]
    base: str
    ws: str
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def stop(self) -> None:
        """Ctrl-C, as a user would (unless a test stopped it already); SIGKILL after a minute."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.reader is not None:
            self.reader.join(10)

    def wait_until(self, condition, what: str, timeout: float) -> None:
        """:func:`eventually` ``condition``, failing at once if ``inferq up`` exits; a failure
        shows what it printed."""
        try:
            eventually(condition, timeout, what, procs=[self.proc], interval=0.2)
        except (AssertionError, RuntimeError) as e:
            raise AssertionError(f"{e}; inferq up printed:\n{self.output}") from e


def readyz(base: str) -> bool:
    try:
        return httpx.get(f"{base}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@ahead("up")
def start_up(request: pytest.FixtureRequest) -> Up:
    """``inferq up`` on a database of the session's redis-server (not waited for)."""
    url = f"redis://127.0.0.1:{request.getfixturevalue('redis_server').port}/1"
    redis.Redis.from_url(url).flushdb()
    port = quiet_port()  # its process starts for a while (quiet_port)
    env = inferq_env(url, PYTHONIOENCODING="utf-8")
    # started as from a script's background (`inferq up &`): SIGINT ignored, which a process keeps
    # unless it says otherwise; Ctrl-C must stop it all the same (test_ctrl_c_stops_everything_it_started)
    proc = subprocess.Popen([*CLI, "up", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT, process_group=0,  # see cli.procs.Proc
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    u = Up(proc, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", env)
    u.reader = threading.Thread(target=u._read, daemon=True)
    u.reader.start()
    return u


@pytest.fixture(scope="module")
def up(request: pytest.FixtureRequest) -> Iterator[Up]:
    u = take("up", request)
    try:
        u.wait_until(lambda: READY in u.output and readyz(u.base), "it to say it is ready", 300)
        yield u
    finally:
        u.stop()


def cli(up: Up, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CLI, *args], env=up.env, cwd=ROOT, capture_output=True, timeout=120)


def test_up_serves_a_job_over_rest(up: Up) -> None:
    assert f"inferq is ready at {up.base}" in up.output
    with httpx.Client(base_url=up.base, timeout=30) as http:
        job_id = submit(http, prompt="def fibonacci(n):", max_tokens=16)
        view = wait_status(http, job_id, timeout=120)
        workers = http.get("/v1/workers").json()
    assert view["status"] == "succeeded", view
    assert view["usage"]["completion_tokens"] > 0
    assert [w["id"] for w in workers] == [view["worker"]]  # the one worker `up` started


def test_generate_prints_the_text_and_the_end(up: Up) -> None:
    done = cli(up, "generate", "Hello", "--max-tokens", "8", "--url", up.ws)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    job_id = re.search(r"^\[job (job-[0-9a-f]+)\]$", err, re.M)
    assert job_id, err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert re.match(r"\[succeeded: (length|stop), ", last), err
    with httpx.Client(base_url=up.base, timeout=30) as http:
        view = http.get(f"/v1/jobs/{job_id.group(1)}").json()
    assert view["status"] == "succeeded" and view["usage"]["completion_tokens"] <= 8
    assert out == view["text"] and out  # the tokens, exactly; the status lines go to stderr


def test_stream_replays_a_finished_job_exactly(up: Up) -> None:
    with httpx.Client(base_url=up.base, timeout=30) as http:
        job_id = submit(http, prompt="def quicksort(xs):", max_tokens=24)
        view = wait_status(http, job_id, timeout=120)
    assert view["status"] == "succeeded", view
    done = cli(up, "stream", job_id, "--url", up.ws)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == view["text"]
    assert done.stderr.decode().strip().splitlines()[-1].startswith("[succeeded: ")


def test_stream_after_the_last_event_ends_cleanly(up: Up) -> None:
    """``--after`` the job's last event: nothing more to print; the final status, and the exit code
    of a succeeded job. After the last token: the final status alone, from its ``done`` event."""
    with httpx.Client(base_url=up.base, timeout=30) as http:
        job_id = submit(http, prompt="def last(xs):", max_tokens=6)
        view = wait_status(http, job_id, timeout=120)
    assert view["status"] == "succeeded", view
    raw = cli(up, "stream", job_id, "--raw", "--url", up.ws)
    events = [json.loads(line) for line in raw.stdout.decode().splitlines()]
    assert raw.returncode == 0 and events[-1]["type"] == "done", raw
    final = f"[succeeded: {view['finish_reason']}, "
    for after in (events[-1]["seq"], events[-2]["seq"]):
        done = cli(up, "stream", job_id, "--after", str(after), "--url", up.base)  # http:// works too
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.decode() == ""
        assert done.stderr.decode().strip().splitlines()[-1].startswith(final), done.stderr.decode()


def test_an_unknown_job_is_one_error_line_and_exit_1(up: Up) -> None:
    done = cli(up, "stream", "job-" + "0" * 32, "--url", up.ws)
    assert done.returncode == 1
    assert done.stdout == b""
    (line,) = done.stderr.decode().strip().splitlines()
    assert line.startswith("[not_found_error") and "Traceback" not in line, line


def test_the_banner_commands_run_as_printed(up: Up) -> None:
    """In the shell ``inferq up`` ran in, from the checkout (a bare ``inferq`` only if that is on its PATH)."""
    lines = [line.split(" # ")[0].strip() for line in up.lines if re.search(r" (stream|generate) ", line)]
    assert len(lines) == 2, up.output
    for line in lines:
        done = subprocess.run(["bash", "-c", line.replace("<id>", "job-0") + " --help"], cwd=ROOT,
                              capture_output=True, timeout=60, env=up.env)
        assert done.returncode == 0 and b"usage: inferq" in done.stdout, (line, done.stderr)


def test_ctrl_c_stops_everything_it_started(up: Up) -> None:
    """Runs last: it stops the module's ``inferq up``."""
    children = psutil.Process(up.proc.pid).children(recursive=True)
    assert len(children) >= 2, children  # a worker (with its engine) and the gateway
    os.kill(up.proc.pid, signal.SIGINT)
    # an upper bound, not a speed: each process has 20 s to stop before it is killed, and on a busy
    # 2-core machine the whole stop took 33 s (six CPU hogs beside it) and once over 90 s (load 16)
    rc = up.proc.wait(180)
    assert up.reader is not None
    up.reader.join(10)  # everything it printed has been read
    assert rc == 0, up.output
    assert up.lines[-1].strip() == "stopped.", up.output
    _, alive = psutil.wait_procs(children, timeout=15)
    assert [(p.pid, p.cmdline()) for p in alive if running(p)] == []
    assert not readyz(up.base)


def running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie holds nothing but its pid, until its new parent reaps it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
