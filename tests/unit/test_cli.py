"""The ``inferq`` command: it dispatches to the benchmark harness with its own arguments; the commands
``inferq up`` suggests run as printed; errors are one line, with documented exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from inferq.cli import wsclient
from inferq.cli.launcher import cli_command, ready_banner
from inferq.cli.main import EXIT_CODES, main
from inferq.shared.settings import get_settings
from tests.procs import free_port


@pytest.mark.parametrize("argv, expect", [
    (["bench", "--help"], "{run,report,gateway,worker,intake,churn,dashboard,console-shot}"),
    (["bench", "gateway", "--help"], "--tokens-per-event"),
    (["bench", "worker", "--help"], "--step-ms"),
    (["bench", "intake", "--help"], "--chat"),
])
def test_inferq_bench_is_the_harness(argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    assert expect in capsys.readouterr().out


def test_raw_events_are_one_line_each_for_any_reader(capsys: pytest.CaptureFixture[str]) -> None:
    """``--raw`` prints each event as it came, with the line breaks JSON may hold raw (U+2028, U+2029,
    U+0085) escaped: str.splitlines gives one event a line, the same JSON."""
    ev = {"type": "token", "seq": 1, "text": "a\u2028b\u2029c\x85d", "n_tokens": 1}
    wsclient._show(json.dumps(ev, ensure_ascii=False), ev, raw=True)
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == ev


def test_error_events_print_type_code_and_message() -> None:
    from inferq.cli.wsclient import error_line
    from inferq.shared.schemas import ErrorEvent

    new = {"type": "error", "seq": 0, "error": {"type": "rate_limit_error", "code": "rate_limit_exceeded",
                                                "message": "slow down", "param": None}}
    old = {"type": "error", "seq": 3, "error": {"type": "worker_lost", "message": "gone"}}  # an older gateway
    assert error_line(ErrorEvent.model_validate(new)) == "rate_limit_error (rate_limit_exceeded): slow down"
    assert error_line(ErrorEvent.model_validate(old)) == "service_unavailable (worker_lost): gone"


ROOT = Path(__file__).resolve().parents[2]
WITHOUT_VENV = os.pathsep.join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
                               if Path(p).resolve() != Path(sys.executable).parent.resolve())


def banner_commands(banner: str) -> list[str]:
    """The banner's inferq command lines, less their comments."""
    return [line.split(" # ")[0].strip() for line in banner.splitlines()
            if re.search(r" (stream|generate) ", line)]


@pytest.mark.parametrize("own_url", [False, True])
def test_the_ready_banner_commands_run_as_printed(own_url: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the checkout, in a shell whose PATH does not hold the venv (as after ``make run``)."""
    monkeypatch.setenv("PATH", WITHOUT_VENV)
    monkeypatch.chdir(ROOT)
    banner = ready_banner("http://127.0.0.1:9", "inferq-tiny", own_url=own_url)
    commands = banner_commands(banner)
    assert len(commands) == 2, banner
    for command in commands:
        done = subprocess.run(["bash", "-c", command.replace("<id>", "job-0") + " --help"], cwd=ROOT,
                              env={**os.environ, "PATH": WITHOUT_VENV}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage: inferq" in done.stdout, (command, done.stderr)
        assert ("--url http://127.0.0.1:9" in command) == own_url


def test_cli_command_is_inferq_when_that_is_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), WITHOUT_VENV]))
    assert cli_command() == "inferq"
    monkeypatch.setenv("PATH", WITHOUT_VENV)
    assert cli_command(Path(sys.executable).parent) == "./inferq"  # a bare name would be looked up on PATH
    assert cli_command(Path("/nonexistent")) == str(Path(sys.executable).parent / "inferq")


def test_cli_command_without_a_script_runs_the_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "my python" / "python3"))
    assert cli_command() == f"'{tmp_path}/my python/python3' -m inferq.cli"


@pytest.mark.parametrize("command", [["generate", "Hello"], ["stream", "job-0"], ["stream", "job-0", "--after", "7"]])
@pytest.mark.parametrize("scheme", ["http", "ws"])
def test_a_closed_port_is_one_line_and_exit_3(command: list[str], scheme: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{scheme}://127.0.0.1:{free_port()}"  # nothing listens there
    assert main([*command, "--url", url]) == wsclient.UNREACHABLE == 3
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: cannot reach the gateway at {url}: connection refused\n"


def test_the_default_gateway_is_named_as_http(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    monkeypatch.setenv("INFERQ_PORT", str(port))
    monkeypatch.setenv("INFERQ_HOST", "0.0.0.0")  # the gateway listens everywhere: reached on loopback
    get_settings.cache_clear()
    try:
        assert main(["generate", "Hello"]) == 3
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err == f"error: cannot reach the gateway at http://127.0.0.1:{port}: connection refused\n"


@pytest.mark.parametrize("argv, line", [
    (["stream", "job-0", "--url", "ftp://x"], "error: --url 'ftp://x': give the gateway as ws://, wss://, "
                                              "http:// or https://HOST:PORT\n"),
])
def test_a_bad_url_is_a_usage_error(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == wsclient.USAGE == 2
    assert capsys.readouterr().err == line


def settings_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], **env: str) -> str:
    """The one line ``inferq stream`` prints, exiting 2, with these settings in the environment."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    get_settings.cache_clear()
    try:
        assert main(["stream", "job-0"]) == 2
    finally:
        get_settings.cache_clear()
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_bad_settings_are_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    line = settings_error(monkeypatch, capsys, INFERQ_PORT="eighty")
    assert line.startswith("error: invalid settings: INFERQ_PORT: ") and "eighty" not in line


def test_bad_settings_never_show_secrets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A check of the whole settings (here: job records shorter-lived than a job's timeout) sees
    every variable: the line names the problem, never their values (API keys among them)."""
    line = settings_error(monkeypatch, capsys, INFERQ_JOB_TTL_S="60", INFERQ_API_KEYS="sk-secret-123")
    assert "INFERQ_JOB_TTL_S" in line and "sk-secret-123" not in line


def test_exit_codes_are_documented() -> None:
    """In ``inferq stream --help`` and ``generate --help``, and in the README's command-line section."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Command line"):]
    section = section[:section.index("\n## ", 1)]
    for code in (wsclient.OK, wsclient.JOB_DID_NOT_SUCCEED, wsclient.USAGE, wsclient.UNREACHABLE,
                 wsclient.INTERRUPTED):
        assert re.search(rf"^  {code} ", EXIT_CODES, re.M), code
        assert re.search(rf"^\| `{code}` \|", section, re.M), code
