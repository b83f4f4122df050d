"""The image (Dockerfile): it passes hadolint; each engine's stage installs what that engine needs
at run time (the GPU one a C compiler for Triton, the CPU one the Debian libraries vLLM's CPU
kernels link), and the check the build runs for it (deploy/docker/check-engine.sh) passes here
and fails without them. Where a Docker engine runs, the CPU image is built and run; here there is
none, and that test is skipped."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CHECK = ROOT / "deploy" / "docker" / "check-engine.sh"
BIN = Path(sys.executable).parent
#: Debian packages python:3.11-slim-bookworm already has, of those vLLM's libraries link
SLIM_PACKAGES = {"libc6", "libgcc-s1", "libstdc++6", "zlib1g"}


def stages() -> dict[str, str]:
    """Each named stage's instructions (continuation lines joined), by name."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if m := re.match(r"FROM \S+(?: AS (\S+))?", line):
            name = m[1] or "final"
            found[name] = ""
        elif name and line.strip() and not line.lstrip().startswith("#"):
            found[name] += line + "\n"
    return found


def apt_packages(stage: str) -> set[str]:
    return {p for run in re.findall(r"apt-get install ([^&]+)", stages()[stage])
            for p in run.split() if not p.startswith("-")}


def test_dockerfile_passes_hadolint() -> None:
    done = subprocess.run([str(BIN / "hadolint"), "--no-color", "--config", str(ROOT / ".hadolint.yaml"),
                           str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_hadolint_ignore_says_why() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if m := re.match(r"# hadolint ignore=(\S+)", line):
            assert all(rule in lines[i - 1] for rule in m[1].split(",")), (i + 1, lines[i - 1])


def test_the_gpu_stage_has_what_triton_builds_its_launcher_with() -> None:
    assert {"gcc", "libc6-dev"} <= apt_packages("engine-gpu")
    assert re.search(r"check-engine \"\$\{ENGINE\}\"", stages()["final"])  # the build checks it


def _check(engine: str, path: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([shutil.which("sh") or "/bin/sh", str(CHECK), engine], capture_output=True, text=True,
                          env={**os.environ, "PATH": path, **env})


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("clang")), reason="no C compiler on this machine")
def test_the_gpu_check_builds_an_extension_and_fails_without_a_compiler(tmp_path: Path) -> None:
    ok = _check("gpu", f"{BIN}:{os.environ['PATH']}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bare = tmp_path / "bin"  # python and the shell's tools, no compiler
    bare.mkdir()
    for tool in ("python", "mktemp", "rm"):
        (bare / tool).symlink_to(shutil.which(tool, path=f"{BIN}:{os.environ['PATH']}"))
    no_cc = _check("gpu", str(bare))
    assert no_cc.returncode != 0 and "no C compiler" in no_cc.stderr, no_cc.stdout + no_cc.stderr


def _vllm_libraries() -> list[Path]:
    """The system libraries vLLM's compiled modules link (torch's own and vLLM's excluded)."""
    vllm, torch = (importlib.util.find_spec(m) for m in ("vllm", "torch"))
    if vllm is None or torch is None:
        pytest.skip("needs vLLM's CPU build, which is not installed for this Python")
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(torch.origin).parent / "lib")}
    site = Path(vllm.origin).parents[1]
    found = set()
    for so in Path(vllm.origin).parent.glob("*.so"):
        out = subprocess.run(["ldd", str(so)], capture_output=True, text=True, env=env, check=True).stdout
        for name, path in re.findall(r"^\s*(\S+) => (\S+)", out, re.M):
            assert path != "not", f"{so.name} needs {name}, which is not found"
            if not Path(path).resolve().is_relative_to(site):
                found.add(Path(path))
    return sorted(found)


@pytest.mark.skipif(shutil.which("dpkg") is None or shutil.which("ldd") is None, reason="needs Debian's dpkg")
def test_the_cpu_stage_installs_every_library_vllms_cpu_kernels_link() -> None:
    packages = set()
    for lib in _vllm_libraries():
        owner = subprocess.run(["dpkg", "-S", str(lib.resolve())], capture_output=True, text=True)
        if owner.returncode != 0:  # /lib is a link to /usr/lib: dpkg knows one of the two spellings
            owner = subprocess.run(["dpkg", "-S", str(lib)], capture_output=True, text=True, check=True)
        packages.add(owner.stdout.split(":")[0])
    assert "libnuma1" in packages  # what python:3.11-slim lacks, and vLLM's CPU build links
    assert packages - SLIM_PACKAGES <= apt_packages("engine-cpu"), packages
    ok = _check("cpu", f"{BIN}:{os.environ['PATH']}")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def docker_engine() -> bool:
    """A Docker CLI that reaches a running engine."""
    return shutil.which("docker") is not None and subprocess.run(
        ["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.mark.timeout(3600)
@pytest.mark.skipif(not docker_engine(), reason="no Docker engine here: the CPU image is not built")
def test_the_cpu_image_builds_and_runs() -> None:
    tag = "inferq:cpu-smoke"
    subprocess.run(["docker", "build", "--build-arg", "ENGINE=cpu", "-t", tag, str(ROOT)], check=True)
    try:
        for cmd in (["inferq", "--help"], ["check-engine", "cpu"]):
            subprocess.run(["docker", "run", "--rm", tag, *cmd], check=True, capture_output=True)
    finally:
        subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True)
