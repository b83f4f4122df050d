"""The workload definition: one JSON file read into :class:`Workload` (see bench/configs/*.json).

A target is a string (its kind, e.g. ``"inferq-ws"``) or an object that overrides the workload
for that target only: ``{"kind": "naive-hf", "num_requests": 8}``, ``{"name": "inferq-ws-2w",
"kind": "inferq-ws", "stack": "2w"}`` (a named variant from ``stacks``), ``"env"`` (extra
environment of the target's own process: inprocess and naive servers), ``"endpoint"``
(inferq-sse: ``chat`` or ``completions``), ``"batch_size"`` (naive-hf-static), ``"api_servers"``
(vllm-serve: ``--api-server-count``), ``"client"`` (the load client of an OpenAI HTTP target:
``harness``, the harness's own SSE client, or ``vllm-bench``, vLLM's ``vllm bench serve``, see
bench/vllm_bench.py; the workload's ``client`` is the default of every such target).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

KINDS = ("inprocess", "vllm-serve", "inferq-ws", "inferq-sse", "inferq-rest", "naive-hf", "naive-hf-static")
INFERQ_KINDS = ("inferq-ws", "inferq-sse", "inferq-rest")
STREAMING_KINDS = ("inprocess", "vllm-serve", "inferq-ws", "inferq-sse")
SSE_KINDS = ("vllm-serve", "inferq-sse")  # the same OpenAI SSE client drives both
#: Load clients: the harness's own (every kind) and vLLM's ``vllm bench serve`` (the SSE kinds only)
CLIENTS = ("harness", "vllm-bench")


@dataclass(frozen=True)
class StackSpec:
    """How the inferq stack is started: redis-server + ``workers`` Celery/vLLM workers + gateway."""

    workers: int = 1
    frontends: int = 1  # INFERQ_FRONTENDS: worker processes per engine
    max_num_seqs: int = 128
    kv_cache_gib: float = 1.0
    gpu_memory_utilization: float = 0.90
    env: dict[str, str] = field(default_factory=dict)          # every worker and the gateway
    worker_env: list[dict[str, str]] = field(default_factory=list)  # per worker, by index
    startup_timeout_s: float = 600.0
    staggered: bool = False  # start workers one at a time (engines sharing one GPU size their KV cache apart)


@dataclass(frozen=True)
class Target:
    name: str
    kind: str
    stack: str = "default"
    num_requests: int | dict[str, int] | None = None
    concurrency: list[int] | None = None
    request_rate: list[float] | None = None
    env: dict[str, str] = field(default_factory=dict)
    endpoint: str = "chat"
    batch_size: int | None = None
    poll_interval_ms: float = 20.0
    api_servers: int = 1  # vllm-serve: API server processes (--api-server-count)
    client: str | None = None  # None: the workload's client (SSE kinds), else the harness's


@dataclass(frozen=True)
class Level:
    """One load level: closed loop with ``value`` clients, or open loop at ``value`` requests/s."""

    mode: str
    value: float

    @property
    def label(self) -> str:
        return f"c={int(self.value)}" if self.mode == "closed" else f"r={self.value:g}"


@dataclass(frozen=True)
class Workload:
    name: str
    model: str | None = None
    load_format: str = "auto"
    max_model_len: int | None = None
    dtype: str = "auto"
    prompt_len: int = 64
    output_len: int = 64
    temperature: float = 0.0
    num_requests: int | dict[str, int] = 16  # or per level label: {"c=1": 8, "c=64": 256}
    repeats: int = 3  # every level runs this many times (fresh prompts each time): median and spread
    warmup_requests: int = 2
    concurrency: list[int] = field(default_factory=lambda: [1])
    request_rate: list[float] | None = None
    request_timeout_s: float = 600.0
    seed: int = 0
    targets: list[Target] = field(default_factory=list)
    stack: StackSpec = field(default_factory=StackSpec)
    stacks: dict[str, StackSpec] = field(default_factory=dict)
    naive_batch_size: int = 8
    naive_batch_window_ms: float = 50.0
    naive_dtype: str = "auto"
    inprocess_env: dict[str, str] = field(default_factory=dict)
    # processes the load client of the HTTP targets is spread over (bench/clientprocs.py; vLLM's
    # client: bench/vllm_bench.py): one Python process reads some tens of thousands of streamed
    # chunks a second at most
    client_processes: int = 1
    # the load client of the OpenAI HTTP targets (vllm-serve, inferq-sse) that name none
    client: str = "harness"
    # set: vllm serve and inferq's workers run on bench/standin_core.py's stand-in EngineCore (one
    # token for every running request each this many ms; 0: as fast as the frontend reads)
    standin_core_step_ms: float | None = None

    def client_for(self, t: Target) -> str:
        """The load client that drives target ``t``: its own, else the workload's (SSE kinds only)."""
        if t.client is not None:
            return t.client
        return self.client if t.kind in SSE_KINDS else "harness"

    def levels(self, t: Target) -> list[Level]:
        rates = t.request_rate if t.request_rate is not None else (None if t.concurrency else self.request_rate)
        if rates:
            return [Level("open", float(r)) for r in rates]
        return [Level("closed", float(c)) for c in (t.concurrency or self.concurrency)]

    def all_levels(self) -> list[Level]:
        """Every level any target runs, in a stable order (each gets its own slice of prompts)."""
        seen: dict[str, Level] = {}
        for t in self.targets:
            for lv in self.levels(t):
                seen.setdefault(lv.label, lv)
        return sorted(seen.values(), key=lambda lv: (lv.mode, lv.value))

    def requests_for(self, t: Target, level: Level) -> int:
        """Requests of target ``t`` at ``level``: the target's setting, else the workload's."""
        for n in (t.num_requests, self.num_requests):
            if isinstance(n, dict) and level.label in n:
                return int(n[level.label])
            if isinstance(n, int):
                return n
        raise ValueError(f"target {t.name}: num_requests has no entry for level {level.label}")

    def stack_for(self, t: Target) -> StackSpec:
        return self.stack if t.stack == "default" else self.stacks[t.stack]

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def _stack(raw: dict[str, Any], base: StackSpec | None = None) -> StackSpec:
    known = {f.name for f in fields(StackSpec)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown stack settings: {sorted(unknown)}")
    return replace(base or StackSpec(), **raw)


def _target(raw: str | dict[str, Any]) -> Target:
    d: dict[str, Any] = {"kind": raw} if isinstance(raw, str) else dict(raw)
    d.setdefault("name", d.get("kind"))
    unknown = set(d) - {f.name for f in fields(Target)}
    if unknown:
        raise ValueError(f"target {d.get('name')}: unknown settings {sorted(unknown)}")
    t = Target(**d)
    if t.kind not in KINDS:
        raise ValueError(f"target {t.name}: kind must be one of {KINDS}, not {t.kind!r}")
    if t.client is not None and t.client not in CLIENTS:
        raise ValueError(f"target {t.name}: client must be one of {CLIENTS}, not {t.client!r}")
    if t.client == "vllm-bench" and t.kind not in SSE_KINDS:
        raise ValueError(f"target {t.name}: the vllm-bench client drives only {SSE_KINDS}")
    if t.api_servers < 1 or (t.api_servers != 1 and t.kind != "vllm-serve"):
        raise ValueError(f"target {t.name}: api_servers must be >= 1, and is for vllm-serve only")
    return t


def parse_workload(raw: dict[str, Any]) -> Workload:
    """Build and check a :class:`Workload` from a decoded JSON config."""
    d = dict(raw)
    d.pop("comment", None)
    base = _stack(d.pop("stack", {}))
    stacks = {k: _stack(v, base) for k, v in d.pop("stacks", {}).items()}
    targets = [_target(t) for t in d.pop("targets", [])]
    unknown = set(d) - {f.name for f in fields(Workload)}
    if unknown:
        raise ValueError(f"unknown workload settings: {sorted(unknown)}")
    w = Workload(targets=targets, stack=base, stacks=stacks, **d)
    if not w.targets:
        raise ValueError("no targets")
    names = [t.name for t in w.targets]
    if len(set(names)) != len(names):
        raise ValueError(f"target names must be unique: {names}")
    for t in w.targets:
        if t.stack != "default" and t.stack not in w.stacks:
            raise ValueError(f"target {t.name}: no stack named {t.stack!r} in 'stacks'")
        if not w.levels(t):
            raise ValueError(f"target {t.name}: no load levels")
        for lv in w.levels(t):
            w.requests_for(t, lv)
    _check_settings(w)
    return w


def _check_settings(w: Workload) -> None:
    """The workload's own settings (not its targets') are in range."""
    if w.repeats < 1:
        raise ValueError("repeats must be >= 1")
    if w.client_processes < 1:
        raise ValueError("client_processes must be >= 1")
    if w.client not in CLIENTS:
        raise ValueError(f"client must be one of {CLIENTS}, not {w.client!r}")
    if w.standin_core_step_ms is not None and any(t.kind == "inprocess" for t in w.targets):
        raise ValueError("standin_core_step_ms: the stand-in EngineCore serves vllm serve and inferq, not inprocess")
    if w.prompt_len < 2 or w.output_len < 1:
        raise ValueError("prompt_len must be >= 2 and output_len >= 1")


def load_workload(path: str | Path) -> Workload:
    """Read a workload JSON file."""
    return parse_workload(json.loads(Path(path).read_text()))
