"""The worker's layers, the gateway's place, and no import cycle in any part.

The worker is built in layers, each importing only those below it (every import counts, also
those inside functions and ``TYPE_CHECKING`` blocks, read from the source with ``ast``)::

    entry (tasks, main, kombu patches and gate, multi) ──▶ runtime ──▶ liveness ──▶ engine ──▶ base
                                               └─────▶ jobs ──────▶ engine

Liveness (heartbeat, reaper, hand-backs) works over the store and the view the runtime gives
it: it never imports the job path. The gateway (api/) imports only itself and shared/, never the
worker or the engine (vLLM, torch), as docs/design.md draws it; within it, only the app wires the
routes (nothing else imports api/routes/). No part has an import cycle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.unit import test_imports
from tests.unit.test_imports import imported_names

LAYERS: dict[str, tuple[str, ...]] = {  # layer -> the modules (prefixes) in it
    "base": ("inferq.worker.metrics", "inferq.worker.loopthread"),
    "engine": ("inferq.worker.engine",),
    "jobs": ("inferq.worker.jobs",),
    "liveness": ("inferq.worker.liveness",),
    "runtime": ("inferq.worker.runtime",),
    "entry": ("inferq.worker.tasks", "inferq.worker.main", "inferq.worker.kombu_fix",
              "inferq.worker.kombu_pipeline", "inferq.worker.kombu_gate", "inferq.worker.multi"),
}
MAY_IMPORT: dict[str, set[str]] = {  # layer -> the layers below it that it may import
    "base": set(),
    "engine": {"base"},
    "jobs": {"engine", "base"},
    "liveness": {"engine", "base"},
    "runtime": {"jobs", "liveness", "engine", "base"},
    "entry": {"runtime", "jobs", "liveness", "engine", "base"},
}


def modules(package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (a top-level folder: worker, shared)."""
    out = {}
    for path in test_imports.source_files(package):
        parts = path.relative_to(test_imports.ROOT).with_suffix("").parts
        name = ".".join(["inferq", *parts])
        out[name.removesuffix(".__init__")] = path
    return out


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (``from pkg import mod`` counts as mod)."""
    mods = modules(package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for _, imported in imported_names(path):
            target = imported
            while target and target not in mods:
                target = target.rpartition(".")[0]
            if target and target != name and target != f"inferq.{package}":
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of two or more modules (each holds a cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_of(module: str) -> str | None:
    for layer, prefixes in LAYERS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return layer
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module)
        if own is None:
            if module != "inferq.worker":
                out.append(f"{module} is in no layer")
            continue
        for target in sorted(imported):
            theirs = layer_of(target)
            if theirs is not None and theirs != own and theirs not in MAY_IMPORT[own]:
                out.append(f"{module} ({own}) imports {target} ({theirs})")
    return out


@pytest.mark.parametrize("package", ["worker", "shared", "api", "cli"])
def test_no_import_cycle(package: str) -> None:
    assert cycles(import_graph(package)) == []


def gateway_violations() -> list[str]:
    """The gateway's imports that break its rule: anything of ours but api/ and shared/, the engine,
    or a route imported from outside api/routes/ but by the app."""
    out = []
    for name, path in modules("api").items():
        for line, imported in imported_names(path):
            where = f"{path.relative_to(test_imports.ROOT)}:{line}"
            top = imported.split(".")[0]
            if top in ("vllm", "torch"):
                out.append(f"{where}: the gateway imports the engine ({imported})")
            elif top in test_imports.OURS and not imported.startswith(("inferq.api", "inferq.shared")):
                out.append(f"{where}: the gateway imports {imported}")
            elif imported.startswith("inferq.api.routes") and name != "inferq.api.app" \
                    and not name.startswith("inferq.api.routes"):
                out.append(f"{where}: {name} imports a route ({imported}); only the app wires them")
    return out


def test_the_gateway_imports_only_shared_and_itself() -> None:
    assert gateway_violations() == []


def test_the_gateway_check_catches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree written for the purpose: the gateway importing the worker, torch, and a route from
    its service."""
    monkeypatch.setattr(sys.modules[test_imports.__name__], "ROOT", tmp_path)
    for rel, source in {"api/service.py": "from inferq.api.routes import chat\nimport torch\n",
                        "api/streams.py": "def f():\n    from inferq.worker.jobs import runner\n",
                        "api/app.py": "from inferq.api.routes import chat\nfrom inferq.shared import keys\n",
                        "api/routes/chat.py": "from inferq.api import service\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    assert gateway_violations() == [
        "api/service.py:1: inferq.api.service imports a route (inferq.api.routes.chat); only the app wires them",
        "api/service.py:2: the gateway imports the engine (torch)",
        "api/streams.py:2: the gateway imports inferq.worker.jobs.runner",
    ]


def test_the_worker_imports_only_downwards() -> None:
    assert layer_violations(import_graph("worker")) == []


def test_the_runner_is_small_and_so_are_worker_functions() -> None:
    import ast

    assert len((test_imports.ROOT / "worker/jobs/runner.py").read_text().splitlines()) <= 250
    long = []
    for path in test_imports.source_files("worker"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 50:
                    long.append(f"{path.relative_to(test_imports.ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert long == []


def test_the_checks_catch_a_cycle_and_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both checks fail on a tree written for the purpose: jobs/a.py imports liveness/b.py, which
    imports jobs/a.py back (a cycle; liveness imports the job path; so does jobs, upwards)."""
    monkeypatch.setattr(sys.modules[test_imports.__name__], "ROOT", tmp_path)
    for rel, source in {"worker/jobs/a.py": "def f():\n    from inferq.worker.liveness import b\n",
                        "worker/liveness/b.py": "from inferq.worker.jobs.a import f\n",
                        "worker/engine/c.py": "import os\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(source)
    graph = import_graph("worker")
    assert cycles(graph) == [["inferq.worker.jobs.a", "inferq.worker.liveness.b"]]
    assert layer_violations(graph) == [
        "inferq.worker.jobs.a (jobs) imports inferq.worker.liveness.b (liveness)",
        "inferq.worker.liveness.b (liveness) imports inferq.worker.jobs.a (jobs)",
    ]
