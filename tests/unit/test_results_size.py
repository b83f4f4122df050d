"""docs/results holds summaries, not raw benchmark output: under 5 MB in all, no file over 512 KiB.

Counted: what git would commit there (tracked files and untracked ones it does not ignore); without
git, every file in the folder. docs/results/.gitignore keeps the harness's raw output out.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
MAX_TOTAL = 5 * 1000 * 1000
MAX_FILE = 512 * 1024


def committable() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                              "docs/results"], cwd=ROOT, capture_output=True, check=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return [p for p in RESULTS.rglob("*") if p.is_file()]
    return [ROOT / name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def test_no_results_file_is_raw_output() -> None:
    big = sorted(f"{p.relative_to(ROOT)} ({p.stat().st_size // 1024} KiB)" for p in committable()
                 if p.stat().st_size > MAX_FILE)
    assert not big, (f"files over {MAX_FILE // 1024} KiB in docs/results: keep a run's summary (bench report "
                     f"--md, python -m bench.merge), not its per-request timings: {big}")


def test_results_stay_small() -> None:
    total = sum(p.stat().st_size for p in committable())
    assert total <= MAX_TOTAL, (f"docs/results holds {total / 1e6:.1f} MB, over {MAX_TOTAL / 1e6:.0f} MB: "
                                "keep summaries there, not raw results")
