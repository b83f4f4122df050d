"""The harness names each process of a stack by its role: a child that multiprocessing spawned is
the gateway's (uvicorn's workers) under the gateway, a frontend of an engine group elsewhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import cpu
from tests.wait import eventually

PARENT = """# {marker}
import multiprocessing as mp, sys, time
if __name__ == "__main__":
    p = mp.get_context("spawn").Process(target=time.sleep, args=(30,))
    p.start()
    print(p.pid, flush=True)
    sys.stdin.read()
    p.kill()
"""


@pytest.mark.parametrize(("marker", "role"), [("inferq.cli api", "gateway"), ("inferq.cli worker", "worker frontend")])
def test_a_spawned_child_is_named_after_its_parent(tmp_path, marker: str, role: str) -> None:
    script = tmp_path / "parent.py"
    script.write_text(PARENT.format(marker=marker))
    # the marker in the parent's command line, as `python -m inferq.cli api` has it
    proc = subprocess.Popen([sys.executable, str(script), marker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        child = int(proc.stdout.readline())
        cmdline = Path(f"/proc/{child}/cmdline")
        eventually(lambda: "multiprocessing.spawn" in cmdline.read_text().replace("\0", " "), 30,
                   "the child's command line")
        procs = cpu._processes()
        assert cpu._role(proc.pid, "python", procs) == marker.split()[-1].replace("api", "gateway")
        assert cpu._role(child, "python", procs) == role
    finally:
        proc.communicate("", timeout=30)
