"""The Makefile's system packages, run with a PATH of stand-ins: ``make run`` installs what running
needs (redis-server) and nothing the tests alone need; ``make test``'s packages come with sudo when
not root; off Debian (no apt-get) one line says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")
TEST_ONLY = ("prometheus", "chromium", "chromium-driver")


def script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


class Machine:
    """A PATH holding only ``sh``, ``id`` (root or not), and the commands a test gives it; apt-get and
    sudo, when there, log how they were called."""

    def __init__(self, tmp: Path, *, root: bool = True, apt: bool = True, sudo: bool = False,
                 commands: tuple[str, ...] = ()) -> None:
        self.bin, self.log = tmp / "bin", tmp / "calls.log"
        self.bin.mkdir()
        self.log.touch()
        (self.bin / "sh").symlink_to("/bin/sh")
        script(self.bin / "id", f"echo {0 if root else 1000}")
        if apt:
            script(self.bin / "apt-get", f'echo "apt-get $*" >> {self.log}')
        if sudo:
            script(self.bin / "sudo", f'echo "sudo $*" >> {self.log}\nexec "$@"')
        for name in commands:
            script(self.bin / name, "exit 0")
        # a venv that is already set up, whose inferq says how it was called
        self.venv = tmp / "venv"
        (self.venv / "bin").mkdir(parents=True)
        script(self.venv / "bin" / "inferq", f'echo "inferq $*" >> {self.log}')
        (self.venv / ".installed").touch()
        stamp = (ROOT / "pyproject.toml").stat().st_mtime + 60
        os.utime(self.venv / ".installed", (stamp, stamp))

    def make(self, *targets: str) -> subprocess.CompletedProcess[str]:
        assert MAKE is not None
        env = {"PATH": str(self.bin), "HOME": str(self.bin.parent)}
        return subprocess.run([MAKE, "--no-print-directory", "-s", *targets, f"VENV={self.venv}"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=60)

    @property
    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


def test_make_run_installs_redis_alone(tmp_path: Path) -> None:
    m = Machine(tmp_path)
    done = m.make("run")
    assert done.returncode == 0, done.stderr
    installs = [c for c in m.calls if " install " in c]
    assert installs == ["apt-get install -y -qq --no-install-recommends redis-server"], m.calls
    assert m.calls[-1] == "inferq up"


def test_make_run_installs_nothing_when_redis_is_there(tmp_path: Path) -> None:
    m = Machine(tmp_path, commands=("redis-server",))
    done = m.make("run")
    assert done.returncode == 0, done.stderr
    assert m.calls == ["inferq up"]  # chromium, prometheus... are missing, and not wanted


def test_make_run_off_debian_says_what_to_install_and_goes_on(tmp_path: Path) -> None:
    """Without apt-get, one line; ``inferq up`` still runs (a Redis may already answer at
    INFERQ_REDIS_URL; if none does, it says so itself)."""
    m = Machine(tmp_path, apt=False)
    done = m.make("run")
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert "make run" in line and "no apt-get" in line and "install redis-server" in line, line
    assert "INFERQ_REDIS_URL" in line
    assert m.calls == ["inferq up"]


def test_test_packages_with_sudo_when_not_root(tmp_path: Path) -> None:
    m = Machine(tmp_path, root=False, sudo=True, commands=("redis-server",))
    done = m.make("test-packages")
    assert done.returncode == 0, done.stderr
    assert "with sudo" in done.stdout
    install = "install -y -qq --no-install-recommends prometheus chromium chromium-driver"
    assert m.calls == ["sudo apt-get update -qq", "apt-get update -qq", f"sudo apt-get {install}",
                       f"apt-get {install}"]


def test_test_packages_off_debian_fail_with_one_line(tmp_path: Path) -> None:
    m = Machine(tmp_path, apt=False)
    done = m.make("test-packages")
    assert done.returncode != 0
    (line, *rest) = done.stderr.splitlines()
    assert "no apt-get" in line and "install redis-server prometheus chromium chromium-driver" in line, line
    assert all(r.startswith("make") for r in rest), done.stderr  # make's own "Error 1"
    assert m.calls == []


def test_not_root_without_sudo_says_so(tmp_path: Path) -> None:
    m = Machine(tmp_path, root=False, commands=("redis-server", "prometheus", "chromium"))
    done = m.make("test-packages")
    assert done.returncode != 0
    assert "without root (no sudo)" in done.stderr and "install chromium-driver" in done.stderr, done.stderr
    assert all(pkg not in done.stderr for pkg in ("install redis-server", "install prometheus"))


def test_ci_targets_exist() -> None:
    """.ci/run's make targets are still there."""
    ci = (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("test-fast", "test-unit-py", "test"):
        assert f"make {target}" in ci and f"\n{target}:" in makefile, target
    assert all(pkg in makefile for pkg in TEST_ONLY)
