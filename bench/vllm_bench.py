"""The load client ``vllm bench serve``: vLLM's own benchmark client drives an OpenAI HTTP target
(vllm-serve, inferq-sse) in place of the harness's SSE client (a target's ``"client": "vllm-bench"``).

vLLM's client is run from Python (``vllm.benchmarks.serve``: ``add_cli_args`` on an argument
parser, then ``main``, the same flags as ``vllm bench serve``; the CPU build's ``vllm`` command
does not start): random dataset with the workload's prompt and output lengths, ``--ignore-eos``,
``--max-concurrency`` = the level's clients (an open-loop level: ``--request-rate``), the level's
requests, the target's endpoint (``openai-chat`` on ``/v1/chat/completions`` or ``openai`` on
``/v1/completions``), the model's folder as tokenizer, ``--percentile-metrics ttft,tpot,itl,e2el
--metric-percentiles 50,90,99 --save-result --save-detailed``.

One process of vLLM's client is itself the limit at high concurrency, so a level is split over
the workload's ``client_processes`` as the harness splits its own (bench/clientprocs.py: each
process its share of the clients and requests). The processes live through the whole target
(vLLM is imported once) and run each level in two steps: every process builds its prompts and
stops at the start of vLLM's measured run (:meth:`VllmBench.prepare`), then all start together
(:meth:`VllmBench.run_level`), so that what the harness counts around a level (wall time, CPU)
is the measured run. Their per-request data (``--save-detailed``) are merged into the harness's
results: a level's throughput is all output tokens over the window from the first request's
start to the last one's end, its percentiles come from every request. vLLM's own figures of each
process are kept next to them (``vllm_bench``).

vLLM's versions differ in their flags: a flag the installed client does not know is replaced by
its stand-in (``--temperature`` by ``--extra-body``) or left out, and said so in the results;
one the run cannot do without ends the target with an error. Per-request start times (needed for
the merged window) came in with later versions: without them the window is the longest of the
processes' own benchmark durations.

A process of this module speaks JSON lines on its standard output (vLLM's own printing goes to
standard error, the log): ``{"started"}`` once vLLM is imported; for each job line
``{"options", "file", "env"}`` it answers ``{"ready"}`` when its run is about to start, runs it on
the line ``go``, then answers ``{"done"}`` (or ``{"error"}`` at any point). End of input ends it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.clientprocs import close_all, shares
from bench.config import Level
from bench.load import RequestResult, Send
from bench.stack import ROOT

#: How the report names this client.
LABEL = "vllm bench serve"
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"
#: Flags a run cannot do without: a client that lacks one fails the target.
REQUIRED = ("--backend", "--base-url", "--endpoint", "--model", "--tokenizer", "--dataset-name",
            "--random-input-len", "--random-output-len", "--num-prompts", "--ignore-eos", "--save-result",
            "--result-dir", "--result-filename")
#: Per-request lists in vLLM's detailed results.
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "errors")
#: Lists in vLLM's results that the harness does not keep (the generated texts).
DROPPED_LISTS = ("generated_texts", "queue_times", "input_lens", "output_lens", "ttfts", "itls", "latencies",
                 "start_times", "errors")

Option = list[list[str]]  # alternatives, first known wins: each a flag and its values


@dataclass(frozen=True)
class BenchSpec:
    """What every run of one target has in common."""

    base: str
    endpoint: str           # the target's: chat or completions
    model: str              # the name the server serves the model under
    tokenizer: str          # the model's folder
    input_len: int          # --random-input-len (see random_input_len)
    output_len: int
    temperature: float
    result_dir: str
    tag: str                # seeds every run's prompts apart from other targets' (workload seed, target)
    env: dict[str, str] = field(default_factory=dict)  # OPENAI_API_KEY for an inferq gateway with keys


def random_input_len(tok: Any, prompt_len: int, chat: bool) -> int:
    """``--random-input-len`` for prompts that the server counts as ``prompt_len`` tokens, as the
    harness's own prompts are counted. vLLM's random prompts have ``input_len`` minus the
    tokenizer's special tokens (which the completions route adds back); a chat route wraps them
    in the chat template, whose tokens are taken off here."""
    if not chat:
        return prompt_len
    special = int(tok.num_special_tokens_to_add()) if hasattr(tok, "num_special_tokens_to_add") else 0
    sample = " alpha beta gamma delta"
    plain = len(tok.encode(sample, add_special_tokens=False))
    rendered = tok.apply_chat_template([{"role": "user", "content": sample}], tokenize=False,
                                       add_generation_prompt=True)
    templated = len(tok.encode(rendered, add_special_tokens=False))
    return max(2, prompt_len - (templated - plain) + special)


def options(spec: BenchSpec, level: Level, num_prompts: int, seed: int, filename: str) -> list[Option]:
    """The flags of one process's run: ``level`` is its share (clients or rate)."""
    chat = spec.endpoint == "chat"
    opts: list[Option] = [
        [["--backend", "openai-chat" if chat else "openai"]],
        [["--base-url", spec.base]],
        [["--endpoint", "/v1/chat/completions" if chat else "/v1/completions"]],
        [["--model", spec.model]],
        [["--tokenizer", spec.tokenizer]],
        [["--dataset-name", "random"]],
        [["--random-input-len", str(spec.input_len)]],
        [["--random-output-len", str(spec.output_len)]],
        [["--random-range-ratio", "0"]],
        [["--random-prefix-len", "0"]],
        [["--ignore-eos"]],
        [["--num-prompts", str(num_prompts)]],
        [["--seed", str(seed)]],
        [["--temperature", f"{spec.temperature:g}"], ["--extra-body", json.dumps({"temperature": spec.temperature})]],
        [["--percentile-metrics", PERCENTILE_METRICS]],
        [["--metric-percentiles", METRIC_PERCENTILES]],
        [["--save-result"]],
        [["--save-detailed"]],
        [["--result-dir", spec.result_dir]],
        [["--result-filename", filename]],
        [["--disable-tqdm"]],
        [["--num-warmups", "0"]],
    ]
    if level.mode == "closed":
        opts += [[["--request-rate", "inf"]], [["--max-concurrency", str(max(1, int(level.value)))]]]
    else:
        opts += [[["--request-rate", f"{level.value:g}"]], [["--burstiness", "1.0"]]]
    return opts


def pick(opts: Sequence[Option], known: set[str]) -> tuple[list[str], list[str], list[str]]:
    """The command line for a client that knows the flags ``known``: (argv, what was replaced or
    left out, required flags it lacks)."""
    argv: list[str] = []
    notes: list[str] = []
    missing: list[str] = []
    for alternatives in opts:
        chosen = next((a for a in alternatives if a[0] in known), None)
        first = alternatives[0][0]
        if chosen is None and first in REQUIRED:
            missing.append(first)
        elif chosen is None:
            notes.append(f"{first}: left out")
        else:
            if chosen[0] != first:
                notes.append(f"{first}: as {chosen[0]}")
            argv += chosen
    return argv, notes, missing


def run_seed(tag: str, first_index: int, process: int) -> int:
    """The random dataset's seed of one process's run: every run, level, process and target has
    prompts of its own (no prefix cache hits from one to another)."""
    return int(hashlib.sha256(f"{tag}/{first_index}/{process}".encode()).hexdigest()[:7], 16)


# --- merging the processes' results -------------------------------------------------------------


def share_results(requests: Sequence[tuple[int, Any]], data: dict[str, Any], expected: int) -> list[RequestResult]:
    """One process's per-request data as the harness's results (``start``: vLLM's clock, the
    monotonic clock every process on the host shares; made relative by :func:`merge`)."""
    ttfts = data.get("ttfts")
    if ttfts is None or len(ttfts) != len(requests):
        raise RuntimeError(f"vLLM's results hold {None if ttfts is None else len(ttfts)} requests' timings, "
                           f"not {len(requests)}: no per-request data (--save-detailed)?")
    n = len(requests)
    lens = data.get("output_lens") or [0] * n
    itls = data.get("itls") or [[] for _ in range(n)]
    errors = data.get("errors") or [""] * n
    latencies, starts = data.get("latencies"), data.get("start_times")
    prompt_lens = data.get("input_lens") or [None] * n
    out = []
    for i, (index, _) in enumerate(requests):
        r = RequestResult(index=index, out_tokens=int(lens[i] or 0), prompt_tokens=prompt_lens[i])
        r.error = str(errors[i])[-500:] if errors[i] else None
        if r.error is None and r.out_tokens > 0:
            r.ttft, r.itl = float(ttfts[i]), [float(x) for x in itls[i]]
            r.e2e = float(latencies[i]) if latencies is not None else r.ttft + sum(r.itl)
            r.chunks = len(r.itl) + 1
            r.ok = True
            if r.out_tokens != expected:
                r.ok, r.error = False, f"expected {expected} output tokens, got {r.out_tokens}"
        elif r.error is None:
            r.error = "no output"
        if starts is not None:
            r.start = float(starts[i])
        out.append(r)
    return out


def merge(parts: Sequence[tuple[list[RequestResult], dict[str, Any]]]) -> tuple[list[RequestResult], float, str]:
    """The processes' results as one level: (results by index, wall time, how the wall was taken).
    The wall is the window from the first request's start to the last one's end where vLLM
    recorded start times; else the longest of the processes' own durations."""
    results = [r for rs, _ in parts for r in rs]
    timed = all(d.get("start_times") is not None and d.get("latencies") is not None for _, d in parts)
    if timed and results:
        t0 = min(r.start for r in results)
        ends = [r.start + (r.e2e or 0.0) for r in results]
        for r in results:
            r.start -= t0
        wall, how = max(ends) - t0, "first request's start to last request's end"
    else:
        for r in results:
            r.start = 0.0
        wall, how = max(float(d.get("duration") or 0.0) for _, d in parts), "longest process duration"
    return sorted(results, key=lambda r: r.index), wall, how


def figures(data: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own summary of one process's run (its scalar figures)."""
    return {k: v for k, v in data.items() if k not in DROPPED_LISTS and (v is None or isinstance(v, (int, float, str)))}


# --- the harness's side ------------------------------------------------------------------------


class VllmBench:
    """``n`` processes of vLLM's client for one target; :meth:`prepare` then :meth:`run_level`
    runs a level across them (as :func:`bench.load.drive` calls them)."""

    def __init__(self, n: int, spec: BenchSpec, expected_tokens: int, logdir: Path, name: str,
                 log: Callable[[str], None] = print) -> None:
        self.n, self.spec, self.expected, self.logdir, self.name, self.log = n, spec, expected_tokens, logdir, name, log
        self.procs: list[asyncio.subprocess.Process] = []
        self.pending: list[tuple[int, Level, list[tuple[int, Any]], str]] = []
        self.history: list[dict[str, Any]] = []  # per run (warm-up first): vLLM's own figures
        self.version: str | None = None
        self.notes: set[str] = set()
        self._calls = 0

    async def __aenter__(self) -> VllmBench:
        self.logdir.mkdir(parents=True, exist_ok=True)
        Path(self.spec.result_dir).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **self.spec.env)
        try:
            for k in range(self.n):
                with open(self.logdir / f"{self.name}-vllm-bench-{k}.log", "ab") as logf:
                    p = await asyncio.create_subprocess_exec(
                        sys.executable, "-m", "bench.vllm_bench", cwd=ROOT, env=env, limit=1 << 24,
                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=logf)
                self.procs.append(p)
            for k in range(self.n):
                msg = await self._read(k, 600)
                self.version = msg.get("vllm")
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await close_all(self.procs, 30)

    async def _read(self, k: int, timeout: float) -> dict[str, Any]:
        p = self.procs[k]
        assert p.stdout is not None
        try:
            line = await asyncio.wait_for(p.stdout.readline(), timeout)
        except TimeoutError:
            p.kill()
            raise RuntimeError(f"vllm bench process {k} gave no answer in {timeout:.0f} s; "
                               f"see {self.name}-vllm-bench-{k}.log") from None
        if not line:
            raise RuntimeError(f"vllm bench process {k} ended (code {await p.wait()}); "
                               f"see {self.name}-vllm-bench-{k}.log")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(f"vllm bench process {k}: {str(msg['error'])[-1500:]}")
        return msg

    async def _send(self, k: int, line: str) -> None:
        stdin = self.procs[k].stdin
        assert stdin is not None
        stdin.write(line.encode() + b"\n")
        await stdin.drain()

    async def prepare(self, level: Level, requests: Sequence[tuple[int, Any]], seed: int = 0) -> None:
        """Hand each process its share of the level and wait until all are about to start."""
        self._calls += 1
        self.pending = []
        for k, (lv, reqs) in enumerate(shares(level, requests, self.n)):
            filename = f"{self.name}-{self._calls:03d}-{level.label.replace('=', '')}-p{k}.json"
            opts = options(self.spec, lv, len(reqs), run_seed(self.spec.tag, reqs[0][0], k), filename)
            await self._send(k, json.dumps({"options": opts, "env": self.spec.env}))
            self.pending.append((k, lv, reqs, filename))
        waves = max(math.ceil(len(reqs) / max(1.0, lv.value)) for _, lv, reqs, _ in self.pending)
        for k, *_ in self.pending:
            msg = await self._read(k, 300 + 10 * waves)
            if not msg.get("ready"):  # vLLM's run went ahead without waiting for the others
                raise RuntimeError(f"vllm bench process {k} did not stop before its measured run: {msg}")

    async def run_level(self, level: Level, requests: Sequence[tuple[int, Any]], send: Send, timeout: float,
                        seed: int = 0) -> tuple[list[RequestResult], float]:
        """As :func:`bench.load.run_level` (``send`` is unused): start every prepared share at
        once, wait for all, merge their per-request data."""
        if not self.pending:
            await self.prepare(level, requests, seed)
        pending, self.pending = self.pending, []
        for k, *_ in pending:
            await self._send(k, "go")
        if level.mode == "closed":
            budget = timeout * (math.ceil(len(requests) / max(1.0, level.value)) + 1) + 120
        else:
            budget = len(requests) / max(level.value, 1e-9) + timeout + 120
        answers = await asyncio.gather(*(self._read(k, budget) for k, *_ in pending))
        parts = []
        for (_, _lv, reqs, _), msg in zip(pending, answers, strict=True):
            data = json.loads(Path(msg["file"]).read_text())
            if msg.get("requests_file"):
                data.update(json.loads(Path(msg["requests_file"]).read_text()))
            parts.append((share_results(reqs, data, self.expected), data))
            self.notes.update(msg.get("notes") or [])
        results, wall, how = merge(parts)
        procs = [dict(figures(d), file=Path(m["file"]).name) for (_, d), m in zip(parts, answers, strict=True)]
        own = sum(float(p.get("output_throughput") or 0.0) for p in procs)
        self.history.append({"processes": procs, "output_tok_s_sum": own, "window": how})
        self.log(f"      vllm bench serve's own figure: {own:.1f} output tok/s (the sum over {len(procs)} "
                 f"process{'es' if len(procs) > 1 else ''})")
        return results, wall


async def _unused_send(*_index_and_request: Any) -> RequestResult:
    raise RuntimeError("the vllm bench client sends its own requests")


async def drive_target(spec: BenchSpec, processes: int, expected_tokens: int, warmup: Sequence[int],
                       plan: Sequence[tuple[Level, list[list[int]]]], timeout: float, seed: int, logdir: Path,
                       name: str, log: Callable[[str], None]) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Warm up and run every level of one target with vLLM's client (as the harness's own client
    runs them: :func:`bench.load.drive`); returns the levels and what to say about the client."""
    from bench.load import drive

    warm = [(i, None) for i in warmup]
    runs = [(lv, [[(i, None) for i in ids] for ids in repeats]) for lv, repeats in plan]
    async with VllmBench(processes, spec, expected_tokens, logdir, name, log) as vb:
        levels = await drive(_unused_send, warm, runs, timeout, seed, log, run=vb.run_level, prepare=vb.prepare)
    history = vb.history[1:] if warm else vb.history
    for lv in levels.values():
        for run in lv["runs"]:
            run["vllm_bench"] = history.pop(0)
    about = {"label": LABEL, "vllm": vb.version, "processes": processes, "random_input_len": spec.input_len,
             "flags_replaced_or_left_out": sorted(vb.notes)}
    return levels, about


# --- a process of vLLM's client -----------------------------------------------------------------


def _parser(serve: Any) -> Any:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        try:
            from vllm.utils import FlexibleArgumentParser
        except ImportError:
            import argparse

            FlexibleArgumentParser = argparse.ArgumentParser  # noqa: N806
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    serve.add_cli_args(parser)
    return parser


def _child() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM's own printing: to the log

    def say(msg: dict[str, Any]) -> None:
        proto.write(json.dumps(msg) + "\n")
        proto.flush()

    try:
        import vllm
        import vllm.benchmarks.serve as serve

        parser = _parser(serve)
    except BaseException:
        say({"error": traceback.format_exc()})
        return
    known = set(parser._option_string_actions)
    original = serve.benchmark
    state: dict[str, Any] = {}

    async def gated(*args: Any, **kwargs: Any) -> Any:
        """vLLM's measured run, started on the harness's word once every process is ready."""
        say({"ready": True})
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise RuntimeError(f"expected 'go', got {line!r}")
        state["t0"] = time.perf_counter()
        result = await original(*args, **kwargs)
        state["t1"], state["result"] = time.perf_counter(), result
        return result

    serve.benchmark = gated
    say({"started": True, "vllm": getattr(vllm, "__version__", None)})
    while line := sys.stdin.readline():
        try:
            job = json.loads(line)
            argv, notes, missing = pick(job["options"], known)
            if missing:
                raise RuntimeError(f"this vllm bench serve ({getattr(vllm, '__version__', '?')}) lacks {missing}")
            os.environ.update(job.get("env") or {})
            state.clear()
            args = parser.parse_args(argv)
            print("vllm bench serve " + " ".join(argv), flush=True)
            serve.main(args)
            if "result" not in state:
                raise RuntimeError("vLLM's benchmark did not run")
            path = Path(args.result_dir) / args.result_filename
            msg: dict[str, Any] = {"done": True, "file": str(path), "t0": state["t0"], "t1": state["t1"],
                                   "notes": notes}
            saved = json.loads(path.read_text()) if path.exists() else {}
            if not path.exists():
                path.write_text(json.dumps(figures(state["result"])))
            if "ttfts" not in saved:  # this version saves no per-request data: what its run returned
                extra = path.with_suffix(".requests.json")
                extra.write_text(json.dumps({k: state["result"].get(k) for k in PER_REQUEST}))
                msg["requests_file"] = str(extra)
            say(msg)
        except BaseException as e:
            say({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"})
            if isinstance(e, KeyboardInterrupt):
                return


if __name__ == "__main__":
    _child()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter shutdown: its extension modules' leak reports would bury the log's end
