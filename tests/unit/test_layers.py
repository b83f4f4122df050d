"""The worker's layers, and no import cycle in the worker or the shared package.

The worker is built in layers, each importing only those below it (every import counts, also
those inside functions and ``TYPE_CHECKING`` blocks, read from the source with ``ast``)::

    entry (tasks, main, kombu patches) ──▶ runtime ──▶ liveness ──▶ engine ──▶ base
                                               └─────▶ jobs ──────▶ engine

Liveness (heartbeat, reaper, hand-backs) works over the store and the view the runtime gives
it: it never imports the job path. shared/ and worker/ have no import cycle at all.
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
              "inferq.worker.kombu_pipeline"),
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


@pytest.mark.parametrize("package", ["worker", "shared"])
def test_no_import_cycle(package: str) -> None:
    assert cycles(import_graph(package)) == []


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
