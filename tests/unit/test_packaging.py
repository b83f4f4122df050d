"""Every package folder of the four parts is installed: pyproject.toml lists its packages by
hand (the folders install under the ``inferq`` namespace), so a new sub-package must be added
there, or a non-editable install (the image) would leave it out."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("api", "worker", "shared", "cli")


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    assert {f"inferq.{p}" for p in PARTS} <= listed
    folders = {"inferq." + ".".join(init.parent.relative_to(ROOT).parts)
               for part in PARTS for init in (ROOT / part).rglob("__init__.py")}
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - folders - {"inferq.api.console"} == set(), "listed packages with no folder"
