"""Import direction between the parts, read from the source with ``ast``.

    cli ──▶ api ──▶ shared
     └────▶ worker ──▶ shared

The gateway (api/) and the worker (worker/) never import each other, shared/ imports only
itself, and only worker/ (with bench/ and tests/) imports the engine. Every part is imported
under its installed name (``inferq.api``, never a bare ``api``). The gateway is also built in a
fresh interpreter to show that vLLM and torch stay out of its process.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("api", "worker", "shared", "cli")  # installed as inferq.<part>
CHECKED = (*PARTS, "bench", "tests")
OURS = {"inferq", *CHECKED}  # top-level names of this repository's code
ALLOWED = {  # which of our modules each installed part may import
    "api": ("inferq.api", "inferq.shared"),
    "worker": ("inferq.worker", "inferq.shared"),
    "shared": ("inferq.shared",),
    "cli": None,  # anything
}
ENGINE = ("vllm", "torch")
ENGINE_ALLOWED = {"worker", "bench", "tests"}
# "pkg.module:attr", the form uvicorn and Celery take an application in
_IMPORT_STRING = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+):[A-Za-z_]\w*$")


def _package(path: Path) -> str:
    """The dotted package a file belongs to, as it is imported (api/routes/x.py: inferq.api.routes)."""
    parts = list(path.relative_to(ROOT).parent.parts)
    return ".".join(["inferq", *parts] if parts[0] in PARTS else parts)


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join([*base, node.module] if node.module else base)


def imported_names(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of everything the file imports, at any depth (functions,
    ``TYPE_CHECKING`` blocks), relative imports resolved; ``from m import n`` gives ``m.n``.
    Also module names passed as constants to ``importlib.import_module``/``__import__``,
    to ``python -m`` in a command list, and ``module:attr`` application strings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node, package)
            for alias in node.names:
                yield node.lineno, module if alias.name == "*" else f"{module}.{alias.name}".lstrip(".")
        else:
            yield from ((node.lineno, name) for name in _named_modules(node))


def _named_modules(node: ast.AST) -> Iterator[str]:
    """Modules a node names without importing them: an ``import_module``/``__import__`` call's
    constant, what follows ``-m`` in a command list, a ``module:attr`` application string."""
    if isinstance(node, ast.Call):
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            yield node.args[0].value
    elif isinstance(node, ast.List | ast.Tuple):
        items = node.elts
        for a, b in zip(items, items[1:], strict=False):
            if isinstance(a, ast.Constant) and a.value == "-m" and isinstance(b, ast.Constant) \
                    and isinstance(b.value, str):
                yield b.value
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
            and (m := _IMPORT_STRING.match(node.value)) and m.group(1).split(".")[0] in OURS:
        yield m.group(1)


def source_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layering_violations(files: list[Path]) -> list[str]:
    out = []
    for path in files:
        part = path.relative_to(ROOT).parts[0]
        allowed = ALLOWED[part]
        for line, name in imported_names(path):
            top = name.split(".")[0]
            if allowed is not None and top in OURS and not _under(name, allowed):
                out.append(f"{path.relative_to(ROOT)}:{line}: {part}/ imports {name} "
                           f"(it may import only {', '.join(allowed)} of ours)")
            if part not in ENGINE_ALLOWED and top in ENGINE:
                out.append(f"{path.relative_to(ROOT)}:{line}: {part}/ imports {name} (only worker/ imports the engine)")
    return out


def bare_import_violations(files: list[Path]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: imports {name}; import it as inferq.{name}"
            for path in files for line, name in imported_names(path) if name.split(".")[0] in PARTS]


def test_every_part_has_source_to_check() -> None:
    for part in CHECKED:
        assert source_files(part), f"no .py files under {part}/"


def test_parts_import_only_what_they_may() -> None:
    assert layering_violations(source_files(*PARTS)) == []


def test_nothing_imports_a_part_by_its_bare_name() -> None:
    assert bare_import_violations(source_files(*CHECKED)) == []


@pytest.mark.parametrize("part, source, bad", [
    ("api", "from inferq.worker.jobs.runner import JobRunner\n", "inferq.worker.jobs.runner.JobRunner"),
    ("api", "def f():\n    import inferq.cli.main\n", "inferq.cli.main"),
    ("api", "from inferq import worker\n", "inferq.worker"),
    ("api", "from ...worker import tasks\n", "inferq.worker.tasks"),
    ("api", "import vllm\n", "vllm"),
    ("worker", "from inferq.api.streams import StreamHub\n", "inferq.api.streams.StreamHub"),
    ("shared", "from inferq.api import app\n", "inferq.api.app"),
    ("shared", "import importlib\nimportlib.import_module('inferq.worker.tasks')\n", "inferq.worker.tasks"),
    ("shared", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch.nn\n", "torch.nn"),
    ("shared", "import bench.stack\n", "bench.stack"),
])
def test_the_layering_check_catches(part: str, source: str, bad: str, tmp_path: Path, monkeypatch) -> None:
    """The checks above fail when a rule is broken (here in a file written for the purpose)."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    path = tmp_path / part / "routes" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    found = layering_violations([path])
    assert len(found) == 1 and f"imports {bad} " in found[0], found


@pytest.mark.parametrize("source, bad", [
    ("import api.app\n", "api.app"),
    ("from shared.settings import Settings\n", "shared.settings.Settings"),
    ("from worker import tasks\n", "worker.tasks"),
    ("import cli\n", "cli"),
    ("cmd = [sys.executable, '-m', 'cli', 'up']\n", "cli"),
    ("app = 'api.app:create_app'\n", "api.app"),
    ("__import__('shared.keys')\n", "shared.keys"),
])
def test_the_bare_name_check_catches(source: str, bad: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    path = tmp_path / "tests" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert bare_import_violations([path]) == [f"tests/x.py:1: imports {bad}; import it as inferq.{bad}"]


def test_inferq_names_are_not_taken_for_bare_ones(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    path = tmp_path / "cli" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text("from inferq.api.app import create_app\nimport bench.stack\nfrom . import wsclient\n"
                    "key = 'worker:w1'\nx = 'inferq.api.app:create_app'\n")
    assert bare_import_violations([path]) == [] and layering_violations([path]) == []


# Run in a fresh interpreter: this one has imported whatever other tests needed.
_ENGINE_FREE = """
import json, sys
{body}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "torch"))))
"""
_BUILD_GATEWAY = """
from inferq.api.app import create_app
from inferq.shared.settings import Settings
app = create_app(Settings(redis_url="redis://127.0.0.1:9/0", api_keys="k1"))
app = create_app(Settings(redis_url="redis://127.0.0.1:9/0"))
assert app.openapi()["paths"]
"""


def engine_modules_after(body: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    proc = subprocess.run([sys.executable, "-c", _ENGINE_FREE.format(body=body)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("body", [
    _BUILD_GATEWAY,
    "from inferq.cli.main import main\nimport inferq.cli.wsclient, inferq.cli.launcher",
    "import inferq.shared.store, inferq.shared.celery_app, inferq.shared.schemas",
], ids=["gateway", "cli", "shared"])
def test_building_the_gateway_loads_no_engine(body: str) -> None:
    assert engine_modules_after(body) == []


def test_the_engine_check_sees_an_engine_import() -> None:
    """The subprocess check above sees vLLM when the gateway's process loads it (here through
    a worker function that imports vLLM when called)."""
    loaded = engine_modules_after(_BUILD_GATEWAY + "from inferq.worker.jobs.sampling import engine_dead\n"
                                                   "engine_dead(ValueError())\n")
    assert "vllm" in loaded and "torch" in loaded
