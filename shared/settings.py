"""All of inferq's configuration: one pydantic-settings class, read from ``INFERQ_*`` variables.

Gateway, worker and launcher read the same class so that they agree on names that both sides
use (model name, Redis URL, queue names, limits). Create it once with :func:`get_settings`.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inferq.shared.keys import MODEL_NAME_MAX_LEN, MODEL_NAME_PATTERN
from inferq.shared.served_models import ModelSpec

#: Served name of the built-in demo model (used when ``INFERQ_MODEL`` is unset).
TINY_MODEL_NAME = "inferq-tiny"
#: Served name of the built-in demo embedding model (``INFERQ_RUNNER=pooling``, ``INFERQ_MODEL`` unset).
TINY_EMBED_NAME = "inferq-tiny-embed"


#: The built-in tiny model's version: its folder name, rebuilt when this changes.
TINY_VERSION = "v2"


class Settings(BaseSettings):
    """Every knob of inferq. Environment variables are the field names upper-cased with ``INFERQ_``."""

    # an empty variable is an unset one: docker-compose.yml passes `${INFERQ_X:-}` for every setting
    # an operator may give, so that one left unset keeps its default (an empty string is no number)
    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore", env_ignore_empty=True)

    # --- shared -------------------------------------------------------------------------------
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", description="Redis for everything: the Celery broker, job records, "
        "token streams (log and pub/sub), worker heartbeats, files and batches. Gateways and workers on other "
        "hosts join the same fleet by pointing here. With INFERQ_REDIS_SENTINELS its host and port are not used "
        "(the Sentinels name the master); its db, user, password and TLS (rediss://, ?ssl_*) still are.")
    redis_sentinels: str = Field(default="", description="Redis Sentinels as host:port,host:port (port "
                                 "default 26379): every client of the gateway and the workers, Celery's included, "
                                 "asks them for the master and asks again after a failover. Empty: no Sentinel.")
    redis_sentinel_master: str = Field(default="", description="The master's name as the Sentinels monitor it "
                                       "(`sentinel monitor NAME ...`); needed with INFERQ_REDIS_SENTINELS.")
    redis_sentinel_password: SecretStr = Field(default=SecretStr(""), description="Password of the Sentinels "
                                               "themselves (their requirepass); the data's is INFERQ_REDIS_URL's. "
                                               "With a rediss:// URL the Sentinels are spoken to over TLS too.")
    model: str | None = Field(
        default=None,
        description="Hugging Face model id or local folder the worker serves; unset: the built-in tiny demo "
        "model (2 layers, random weights, built on first use in cache_dir, no download).",
    )
    served_model_name: str | None = Field(
        default=None, validate_default=True, description="Name clients send as `model`, and the model's queue "
        "(inferq.q.{name}): letters, digits and ._/@+-, at most 256 characters. Default: INFERQ_MODEL (as vllm "
        "serve names a model), or inferq-tiny for the built-in model; a local folder whose path is not such a "
        "name (a space, a colon...) needs this set."
    )
    job_ttl_s: int = Field(default=25 * 3600, ge=60, description="How long job records and token logs live "
                           "(seconds); a Responses API response lives as long as its job. At least "
                           "INFERQ_MAX_TIMEOUT_S plus a margin (a minute, or INFERQ_WORKER_TTL_S + "
                           "INFERQ_HEARTBEAT_S if longer); a queued job's record lives until its deadline plus "
                           "this.")
    cache_dir: Path = Field(default=Path.home() / ".cache" / "inferq", description="Where the built-in model "
                            "is built (models/) and where `inferq up` writes its processes' logs (logs/).")
    log_level: str = Field(default="INFO", description="Log level of the gateway and the worker (DEBUG, INFO, "
                           "WARNING, ...).")
    log_format: Literal["plain", "json"] = Field(
        default="plain", description="'json': one JSON object per line, lines about a job carrying its "
        "job_id, model and worker_id (shared/logs.py).")
    tokenizer_path: Path | None = Field(
        default=None, description="Folder with the model's tokenizer.json, for the gateway's /tokenize and "
        "/detokenize, and to tokenize the default model's prompts before they are queued (the ids go with "
        "the job, where the workers' probe shows the gateway tokenizes as they do); default: INFERQ_MODEL "
        "when it is a local folder, the built-in model's otherwise. Without one, the gateway uses a live "
        "worker's model folder or the tokenizer the workers publish in Redis; with none of them, /tokenize "
        "answers 503 tokenizer_unavailable.")

    @property
    def builtin_model_dir(self) -> Path:
        """Where the built-in tiny model is built (once) and read from."""
        return self.cache_dir / "models" / f"inferq-tiny-{TINY_VERSION}"

    @property
    def builtin_embed_model_dir(self) -> Path:
        """The built-in tiny embedding model: the tiny model's weights and tokenizer, served pooled."""
        return self.cache_dir / "models" / f"inferq-tiny-embed-{TINY_VERSION}"

    @property
    def tokenizer_dir(self) -> Path | None:
        """The folder the gateway reads the default model's tokenizer from (None: not known here,
        e.g. INFERQ_MODEL is a Hub id)."""
        if self.tokenizer_path is not None:
            return self.tokenizer_path
        if self.model is None:
            return self.builtin_model_dir
        return Path(self.model) if Path(self.model).is_dir() else None

    otel_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP collector (e.g. http://otel-collector:4318) to send traces of "
        "each job to, gateway and worker (needs the tracing extra: pip install 'inferq[tracing]'); unset: "
        "tracing off (shared/tracing.py).")

    # --- gateway ------------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address the gateway listens on (`inferq api` and "
                      "`inferq up`; --host overrides it).")
    port: int = Field(default=8000, description="Port the gateway listens on (--port overrides it).")
    api_workers: int = Field(default=1, ge=1, description="Gateway processes sharing the port (`inferq api "
                             "--workers N`); they share nothing but Redis. Run several in front of a busy GPU.")
    ws_compression: bool = Field(
        default=False, description="Offer permessage-deflate on WebSockets. Off: token events are tiny, and "
        "compressing each one raised the gateway's CPU per token 1.4-1.8x (docs/results/NOTES.md).")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Largest request body accepted "
                                "(413 beyond).")
    max_prompt_chars: int = Field(default=200_000, ge=1, description="Longest prompt: characters of a text "
                                  "prompt or of all messages' contents, or token ids (400 naming the field).")
    max_tokens_limit: int = Field(default=32_768, ge=1, description="Upper bound on max_tokens "
                                  "(400 naming the field beyond).")
    max_stop_sequences: int = Field(default=8, ge=0, description="Most stop sequences in one request.")
    max_stop_chars: int = Field(default=256, ge=1, description="Longest stop sequence, in characters.")
    max_n: int = Field(default=8, ge=1, description="Upper bound on completions per "
                       "request (n; 400 beyond).")
    max_json_depth: int = Field(default=32, ge=1, le=128, description="Deepest nesting of objects and "
                                "arrays in a free-form JSON field (json_schema); the worker's JSON parser "
                                "and the serializers stop near 200.")
    max_json_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest free-form JSON field "
                                "(json_schema), as compact UTF-8 JSON.")
    max_queue_depth: int = Field(default=10_000, ge=1, description="Queued jobs per model; "
                                 "beyond, a submission gets 429 with Retry-After.")
    default_max_tokens: int = Field(default=256, ge=1, description="max_tokens of a job whose request gives "
                                    "none (at most what the context window leaves after the prompt); an "
                                    "OpenAI text completion without max_tokens gets 16, as OpenAI's and vLLM's.")
    api_keys: SecretStr = Field(default=SecretStr(""), description="Comma-separated bearer keys; any turns "
                                "auth on, and jobs, files and batches become private to their key "
                                "(docs/security.md).")
    api_keys_file: Path | None = Field(default=None, description="API keys, one per line: "
                                       "'KEY [name] [tenant=T] [weight=W] [priority=LO[-HI]] [role=operator]' (fair "
                                       "share, the priorities the key may use, by default 5 to 9, and whether it "
                                       "may manage other keys' LoRA adapters: docs/security.md); "
                                       "added to INFERQ_API_KEYS.")
    allowed_origins: str = Field(default="", description="Comma-separated origins (scheme://host[:port], or "
                                 "'*') that browser pages may call the API from (CORS) and open WebSockets "
                                 "from; a WebSocket from another page's origin is closed with 4403. Empty: "
                                 "no CORS headers, and WebSockets from any origin.")

    @property
    def origins(self) -> list[str]:
        """``allowed_origins`` as a list."""
        return [o.strip().rstrip("/") for o in self.allowed_origins.split(",") if o.strip()]
    rate_limit_per_minute: int = Field(default=0, ge=0, description="Submissions per key (per client "
                                       "IP without keys) per minute, 429 beyond; 0: off.")
    fair_share: bool = Field(default=True, description="Order each priority level of a model's queue by "
                             "fair share between tenants (API keys, or the tenant= their keys-file lines "
                             "name, weighted by weight=): a worker's next job is the one of the tenant "
                             "served least so far. Off: first in, first out.")
    fair_prompt_weight: float = Field(
        default=0.5, ge=0, le=1, description="What a prompt token counts for in a job's fair-share charge, "
        "against an output token's 1 (embedding jobs: 1). An output token holds a running slot for an engine "
        "step; a prompt token is prefilled in a batch of thousands, often from the prefix cache. 0.5 is the "
        "pricing of Virtual Token Counter fair scheduling (Sheng et al., OSDI 2024).")
    max_concurrent_jobs_per_key: int = Field(default=0, ge=0, description="Unfinished jobs per key (per "
                                             "client IP without keys), 429 beyond; 0: off.")
    answered_embedding_ttl_s: int = Field(
        default=300, ge=1, description="How long an embedding job's record and log (its vectors: a 2,048-input "
        "request's are megabytes) stay in Redis once /v1/embeddings, /pooling, /score or /rerank has answered "
        "with them, instead of INFERQ_JOB_TTL_S; an Idempotency-Key repeat after that is a 404. Jobs submitted "
        "on /v1/jobs and batch lines keep INFERQ_JOB_TTL_S (they are read later).")
    batch_event_interval_ms: int = Field(
        default=250, ge=0, le=10_000, description="A batch job's text (service_class batch: Batch API lines, "
        "background work) goes to its log at most this often, the tokens of each interval in one event, instead "
        "of one event per engine step: nobody reads batch work token by token, and each event costs the worker, "
        "Redis and any reader CPU. A stream of it is as exact, in fewer pieces. 0: every step, as interactive "
        "work.")
    embed_coalesce_inflight: int = Field(
        default=2, ge=0, le=64, description="/v1/embeddings requests of one key (one client IP without keys) "
        "share a job: while this many of the key's shared jobs are in flight on a gateway process, its next "
        "requests gather and go as one job when one of them ends (an idle gateway sends each at once). One "
        "job costs the queue the same whatever its inputs; 0: each request is a job of its own.")
    embed_coalesce_max_inputs: int = Field(
        default=64, ge=2, le=2048, description="Most inputs in one shared /v1/embeddings job (a request "
        "with more than half as many goes as a job of its own).")
    idempotency_ttl_s: int = Field(default=24 * 3600, ge=1, description="How long an Idempotency-Key "
                                   "returns the job it created (seconds).")
    http_header_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds a client has to send a request's line and headers, counted "
        "from the connection's opening (or, on a kept-alive connection, from the request's first bytes); "
        "after that the connection is closed, with a 408 if part of a request came. Half-sent requests "
        "cannot hold connections (and file descriptors).")
    http_body_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest wait for the next part of a request body (seconds); "
        "beyond, the request gets 408 and its connection is closed.")
    http_max_header_bytes: int = Field(
        default=16 * 1024, ge=8 * 1024, le=1 << 20, description="Largest request head, the request line "
        "and headers together (431 beyond; a request line over 8 KiB gets 414), on plain HTTP and on "
        "WebSocket upgrades alike.")
    http_keep_alive_s: float = Field(
        default=75.0, gt=0, description="How long an idle kept-alive connection stays open between two "
        "requests (uvicorn's timeout_keep_alive). Keep it above the idle time after which clients stop "
        "reusing a connection (httpx and the openai SDK: 5 s, aiohttp: 15 s) and, behind a load balancer, "
        "above the balancer's idle timeout (60 s on AWS's): a server that closes first races a client "
        "sending its next request on the connection, which then fails (\"Server disconnected without "
        "sending a response\").")

    # --- files and batches (the Batch API; api/batches) ---------------------------------------
    files_dir: Path | None = Field(
        default=None, description="Folder (shared by every gateway) that uploaded and batch output files "
        "are kept in; unset: file contents live in Redis, each at most max_file_bytes.")
    max_file_bytes: int = Field(default=64 << 20, ge=1024, description="Largest file upload (POST /v1/files).")
    max_file_bytes_per_key: int = Field(default=256 << 20, ge=0, description="Most bytes of files one key "
                                        "(one client address without keys) may store, uploads and batch "
                                        "outputs together; an upload past it is refused (400) until files are "
                                        "deleted or expire. 0: no limit.")
    max_batch_lines: int = Field(default=50_000, ge=1, description="Most requests in one batch's input file.")
    file_ttl_s: int = Field(default=30 * 86400, ge=0, description="An uploaded file expires this long after "
                            "its upload unless the upload names its own expires_after (OpenAI's default for "
                            "batch files: 30 days); 0: kept until deleted. A batch's output files expire as "
                            "its output_expires_after says, else are kept.")
    batch_priority: int = Field(default=9, ge=0, le=9, description="Priority of a batch's jobs (0 runs "
                                "first): above the default 5, interactive requests go first.")
    batch_window: int = Field(default=256, ge=1, description="Most unfinished jobs one batch has queued "
                              "or running at once; its next lines are queued as they finish.")
    batch_poll_s: float = Field(default=0.5, gt=0, description="How often a gateway advances its batches.")
    batch_lease_s: float = Field(default=15.0, gt=0, description="How long a gateway holds a batch it "
                                 "advances without renewing; another gateway takes it over after that.")

    # --- interactive and batch work on one fleet (docs/design.md, "Service classes") ----------
    service_classes: bool = Field(
        default=True, description="Two service classes. Batch work (Batch API lines, requests with service_tier "
        "'flex' or service_class 'batch', keys with class=batch) is queued at INFERQ_BATCH_PRIORITY, the batch "
        "lane, which a worker pops only while it holds fewer than INFERQ_MAX_NUM_SEQS jobs and fewer batch jobs "
        "than its batch limit; interactive work may also take INFERQ_INTERACTIVE_RESERVE more sequences. Off: "
        "a worker takes INFERQ_MAX_NUM_SEQS jobs of any class, by priority alone.")
    interactive_reserve: int | None = Field(
        default=None, ge=0, description="Engine sequences (and job slots) beyond INFERQ_MAX_NUM_SEQS that only "
        "interactive work takes, so that an interactive job starts at once while batch work fills the engine "
        "(the engine runs up to INFERQ_MAX_NUM_SEQS + this; vLLM's priority scheduler preempts batch first when "
        "the KV cache runs short). Unset: a quarter of INFERQ_MAX_NUM_SEQS, and at least twice its square root "
        "(6 of 8, 12 of 32, 32 of 128); 0 with classes off.")
    tenant_reserve: bool = Field(
        default=True, description="With service classes, a worker that holds INFERQ_MAX_NUM_SEQS jobs keeps a "
        "free sequence of its reserve for each tenant it runs below its share (by weight, among the tenants it "
        "holds) that has nothing queued: a job of a tenant past its share is not taken into that sequence, so "
        "the other tenant's next job starts at once instead of waiting for one of a backlog's jobs to end; and "
        "such a tenant's job queued behind the head of the queue is taken ahead of it.")
    tenant_reserve_keep_s: float = Field(
        default=2.0, ge=0, le=600, description="With the tenant reserve, how long a worker remembers a tenant: "
        "it keeps a tenant below its share as many free sequences as the tenant held at once within that time "
        "(up to its share), and one for a tenant it held within it that holds none now (a client whose next "
        "requests come as its last ones end); 0: one sequence, only while the tenant holds a job there.")
    tenant_room_for_new: bool = Field(
        default=True, description="With service classes, a worker whose every sequence is held hands back the "
        "youngest job of the tenant most above its share (paused where it can be, to go on from its tokens so "
        "far) for each job queued of a tenant it runs nothing of, up to that tenant's share: a tenant's first "
        "requests beside another's backlog start at once instead of waiting for a backlog job to end. "
        "INFERQ_RUNNING_FAIR_SHARE does this for every tenant below its share.")
    running_fair_share: bool = Field(
        default=False, description="With service classes, a worker whose every slot is held hands its youngest "
        "batch job back (reason 'preempted', not counted against its attempts; paused where it can be, to go "
        "on from its tokens so far) when interactive work waits. On: also the youngest interactive job of the "
        "tenant most above its share of the worker (slots x weight / the weights of the tenants queued or "
        "running there) when a tenant waits below its share. Off by default: on the benchmark page (2-core "
        "VM) it lost to fair share in the queue alone on the tenant targets; not measured on a GPU.")
    interactive_ttft_p99_ms: float = Field(
        default=0.0, ge=0, description="Interactive time to first token (from submission) a worker keeps its "
        "p99 under, over each heartbeat: above it, the worker halves the batch jobs it takes; below, it takes "
        "one more per heartbeat, up to INFERQ_MAX_NUM_SEQS. 0: no target.")
    interactive_itl_p99_ms: float = Field(
        default=0.0, ge=0, description="Interactive time between tokens a worker keeps its p99 under, as "
        "INFERQ_INTERACTIVE_TTFT_P99_MS. 0: no target.")

    # --- several models on one worker (docs/design.md, "Workers that follow demand") ----------
    models: list[ModelSpec] = Field(
        default_factory=list, description="Models one worker serves, as JSON: [{\"name\": N, \"model\": "
        "PATH_OR_ID, \"settings\": {engine settings of this model, e.g. \"max_model_len\": 8192}}, ...]. The "
        "worker holds one of them awake at a time (the others asleep: vLLM's sleep mode on a GPU, weights in host "
        "memory; stopped on a CPU) and swaps to the one the queue shows waiting. Gateways queue jobs for every "
        "model named here, as for the default model, while no worker holds it awake. Empty: the worker serves "
        "INFERQ_MODEL alone.")
    sleep_mode: Literal["auto", "on", "off"] = Field(
        default="auto", description="How a multi-model worker puts a model to sleep. 'on': vLLM's sleep mode "
        "(level 1: weights to host memory, KV cache dropped; a wake takes about a second); 'off': the engine is "
        "stopped and started again at its next wake; 'auto': on where the platform has it (GPUs), else off.")
    swap_check_s: float = Field(default=0.25, gt=0, le=10, description="How often a multi-model worker reads "
                                "its models' queues and the fleet's awake workers to decide which model to hold.")
    swap_min_awake_s: float = Field(
        default=10.0, ge=0, description="Hysteresis: a model that still has work keeps the worker at least this "
        "long after its wake (a model with nothing queued or running here gives way at once).")
    swap_max_wait_s: float = Field(
        default=30.0, gt=0, description="The bound on waiting for a wake: once a model's oldest queued job has "
        "waited this long with no worker holding the model awake, a worker swaps to it even while its own "
        "model still has jobs queued (after INFERQ_SWAP_MIN_AWAKE_S).")
    swap_grace_s: float = Field(
        default=30.0, ge=0, description="Before a model sleeps, how long its running jobs may run on to their "
        "end; those still running then go back to the queue (restart event, reason model_swap).")
    swap_wake_first: bool = Field(
        default=False, description="A swap wakes the other model before the awake one goes to sleep (its running "
        "jobs end meanwhile, both models awake for that while): a swap's wait is the wake alone. Only where the "
        "GPU holds both models' weights and KV caches at once (size INFERQ_KV_CACHE_GIB and "
        "INFERQ_GPU_MEMORY_UTILIZATION for it); a model's first start always waits for the other's sleep.")
    swap_overlap: bool = Field(
        default=True, description="With sleep mode: a swap brings the other model's weights back while the "
        "awake one goes to sleep, where the GPU has room for them beside it (NVML's free memory against their "
        "size at that model's last wake, plus 2 GiB); its KV cache comes back once the other has slept. The "
        "two copies (to host memory, and back) run at once, so a swap takes about the longer of them, not both.")
    swap_prespawn: bool | None = Field(
        default=None, description="A multi-model worker spawns each model's process when it starts, and the "
        "process imports vLLM then waits: a model first started after those imports (about 15 s on a GPU host) "
        "starts its engine alone, not a new process and its imports too (about 1 GiB of host memory a model "
        "meanwhile). Unset: on with sleep mode.")
    swap_prepare: bool = Field(
        default=True, description="With sleep mode: while the awake model is idle, start each model not yet "
        "started (and leave the last one awake), so that a model's first wake is a wake, not an engine start.")

    # --- worker / engine ----------------------------------------------------------------------
    max_model_len: int | None = Field(default=None, description="Context window; unset: the model's own.")
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1, description="Fraction of GPU memory the "
                                          "engine takes for weights and KV cache.")
    kv_cache_gib: float | None = Field(default=None, gt=0, description="KV cache size (GiB) on a GPU, in place of "
                                       "what INFERQ_GPU_MEMORY_UTILIZATION leaves after the weights (vLLM's "
                                       "kv_cache_memory_bytes): several engines on one GPU can then start at once, "
                                       "none sizing its cache by memory another is still taking.")
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs per worker (one engine sharded "
                                      "over them).")
    max_num_seqs: int = Field(default=128, ge=1, description="Engine batch size, and the worker's Celery job "
                              "slots (an engine group splits them among its frontends). With service classes "
                              "(INFERQ_SERVICE_CLASSES) the slots any work fills: the engine and the pool get "
                              "INFERQ_INTERACTIVE_RESERVE more, for interactive work only.")
    max_num_batched_tokens: int | None = Field(default=None, description="Tokens per engine step: higher "
                                               "favours prefill, lower favours decode latency; unset: vLLM's.")
    stream_interval: int = Field(
        default=1, ge=1, le=1024, description="Tokens a streamed job's event carries (vllm serve's "
        "--stream-interval): its first and last go at once, the others in events of this many tokens. Every "
        "event costs the worker, Redis and the gateway CPU, so fewer events a token cost less, at the price of "
        "text arriving in larger, rarer pieces. A request may ask for more (`stream_interval`), not fewer.")
    frontends: int = Field(
        default=1, ge=1, le=64, description="Worker processes feeding one engine (like vllm serve's "
        "--api-server-count): each a queue consumer with ceil(max_num_seqs / N) slots and an AsyncLLM client "
        "of the one EngineCore. Above 1, the token path of a fast engine runs on that many Python threads "
        "instead of one, and a burst of jobs is taken in N at a time: raise it for a small model at "
        "hundreds of sequences, or when many jobs arrive at once.")
    gil_switch_interval_ms: float = Field(
        default=0.5, gt=0, le=100, description="How long a worker thread may hold the GIL while another "
        "waits for it (Python's sys.setswitchinterval; CPython's default is 5). A worker's threads (the "
        "queue consumer, the job threads, the engine loop) mostly run briefly and then wait on I/O; after "
        "each wait a thread needs the GIL back, and behind a busy engine loop it waited up to this long.")
    tool_call_parser: str | None = Field(
        default=None, description="vLLM tool-call parser the worker runs on outputs of requests with "
        "tool_choice 'auto' (as vllm serve --tool-call-parser: pythonic, hermes, llama3_json, mistral, ...); "
        "unset: 'auto' is refused with a 400.")
    dtype: str = Field(default="auto", description="The engine's dtype (as vLLM's --dtype). With 'auto' the "
                       "built-in model runs in float32 on a CPU without native bfloat16 (no AVX-512 BF16 or "
                       "AMX), where vLLM's CPU build emulates bfloat16 about 4x slower.")
    runner: Literal["auto", "generate", "pooling"] = Field(
        default="auto", description="As vLLM's --runner: 'pooling' serves an embedding model (/v1/embeddings) "
        "instead of text generation; 'auto': what the model's architecture says. With INFERQ_MODEL unset, "
        "'pooling' serves the built-in tiny embedding model, inferq-tiny-embed.")
    convert: Literal["auto", "none", "embed", "classify"] = Field(
        default="auto", description="As vLLM's --convert: 'embed' serves a generative model's last hidden "
        "state as its embedding (with INFERQ_RUNNER=pooling).")
    load_format: str = Field(default="auto", description="As vLLM's --load-format; 'dummy' serves random "
                             "weights with the model's real shapes (benchmarks).")
    cpu_kv_cache_gib: float = Field(default=1.0, gt=0, description="KV cache size (GiB) with vLLM's "
                                    "CPU build.")
    enforce_eager: bool | None = Field(default=None, description="vLLM's enforce_eager (no "
                                       "CUDA graphs); default: true on CPU, false on GPU.")
    lora_modules: str = Field(
        default="", description="LoRA adapters the workers serve on their model, as vllm serve's "
        "--lora-modules: comma-separated name=path pairs (a local folder in PEFT layout, readable by every "
        "worker of the model). Clients send the adapter's name as `model`; /v1/models lists it with its "
        "parent. Any adapter turns LoRA on in the engine.")
    lora_dir: Path | None = Field(
        default=None, description="A folder of LoRA adapters: each subfolder holding an adapter_config.json "
        "is an adapter named after the subfolder (added to INFERQ_LORA_MODULES).")
    enable_lora: bool = Field(
        default=False, description="Start the engine with LoRA on even with no adapter configured, so that "
        "adapters can be loaded at run time (on whenever INFERQ_LORA_MODULES or INFERQ_LORA_DIR names one).")
    max_loras: int = Field(default=4, ge=1, description="Adapters one engine batch may mix (vLLM's "
                           "max_loras: GPU slots); more adapters queue for a slot.")
    max_lora_rank: int = Field(default=16, ge=1, description="Highest adapter rank the engine takes (vLLM's "
                               "max_lora_rank); an adapter above it is refused when loaded.")
    max_cpu_loras: int | None = Field(default=None, ge=1, description="Adapters kept in host memory "
                                      "(vLLM's max_cpu_loras); unset: max_loras.")
    lora_runtime_updates: bool = Field(
        default=False, description="Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (as vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING): a caller names a path that every worker of the model then reads, "
        "so keep it off unless every key holder may do that.")
    lora_load_timeout_s: float = Field(default=60.0, gt=0, description="How long a run-time load waits "
                                       "for a live worker of the model to load the adapter and say so.")

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The adapters configured at start: name -> path (INFERQ_LORA_DIR's, then INFERQ_LORA_MODULES)."""
        found: dict[str, str] = {}
        if self.lora_dir is not None and self.lora_dir.is_dir():
            for sub in sorted(self.lora_dir.iterdir()):
                if (sub / "adapter_config.json").is_file():
                    found[sub.name] = str(sub)
        for pair in filter(None, (p.strip() for p in self.lora_modules.split(","))):
            name, sep, path = pair.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"INFERQ_LORA_MODULES: {pair!r} is not name=path")
            found[name.strip()] = path.strip()
        return found

    @property
    def lora_enabled(self) -> bool:
        """Whether the engine starts with LoRA on."""
        return self.enable_lora or bool(self.lora_modules.strip()) or self.lora_dir is not None

    affinity: Literal["prefix", "off"] = Field(
        default="prefix", description="Cache-affine pull. 'prefix': a worker that takes a job whose prompt's "
        "prefix (in blocks of INFERQ_AFFINITY_BLOCK_TOKENS) or LoRA adapter another live worker of the model "
        "ran last, while that worker has a free slot, passes the job to that worker's lane instead of running "
        "it (once; a worker whose slots are full hands its lane back to the queue at its next heartbeat). "
        "'off': plain pull, each job runs on the worker that took it (docs/design.md).")
    affinity_block_tokens: int = Field(default=64, ge=8, le=4096, description="Tokens per prefix block that "
                                       "cache-affine pull matches prompts by.")
    affinity_slack: float = Field(default=0.25, ge=0, le=1, description="How much busier (running, waiting "
                                  "and in its lane, as a fraction of its sequences) than the worker that took a "
                                  "job the worker holding its prefix may be and still get it: above, the job runs "
                                  "where it was taken. Lower balances load, higher follows caches.")
    affinity_spread: bool = Field(default=True, description="A job that starts a new prefix (no worker holds "
                                  "its first block) runs on the least loaded worker (live: its claimed jobs and "
                                  "its lane) when the worker that took it is busier by more than one: follow-ups "
                                  "come back to where their prefix ran, so this keeps the fleet's load even.")
    affinity_ttl_s: int = Field(default=600, ge=1, description="How long an engine is taken to still hold a "
                                "prefix without a job or a KV-cache event renewing it (seconds).")
    affinity_index: Literal["events", "writes"] = Field(
        default="events", description="What feeds cache-affine pull's prefix index. 'events': the engine's own "
        "KV-cache events (vLLM's kv_events_config), so the index holds what each engine's cache holds "
        "(evictions and restarts included). 'writes': the worker that claims a job writes its prompt's "
        "prefix (an approximation: evictions are not seen).")
    heartbeat_s: float = Field(default=2.0, gt=0, description="Worker heartbeat period (seconds), and the "
                               "reaper's pass period.")
    worker_ttl_s: float = Field(default=10.0, gt=0, description="A worker silent this long is dead: its jobs "
                                "go back to the queue (seconds).")
    reaper_budget_s: float | None = Field(
        default=None, gt=0, description="Longest one reaper pass runs (it holds the reaper lock for twice "
        "that); default: half the worker TTL.")
    max_attempts: int = Field(default=3, ge=1, description="Runs of a job (worker lost, "
                              "drained, engine failure) before it fails as worker_lost.")
    event_write_budget_s: float = Field(
        default=30.0, gt=0, description="How long a worker retries writing a job's events through a Redis "
        "outage; past it the attempt stops and the job goes back to the queue (its log never gets a hole).")
    default_timeout_s: float = Field(default=3600.0, gt=0, description="Job deadline (seconds) when the "
                                     "request gives no timeout.")
    max_timeout_s: float = Field(default=24 * 3600.0, gt=0, description="Largest timeout a request may give "
                                 "(400 beyond).")
    drain_timeout_s: float = Field(default=60.0, ge=0, description="On SIGTERM, how long a worker lets its "
                                   "jobs finish before handing them back to the queue (seconds).")
    scheduling_policy: str = Field(default="priority", description="vLLM scheduler: 'priority' "
                                   "honours each job's priority (0 first ... 9 last), 'fcfs' ignores it.")
    visibility_timeout_s: int = Field(default=6 * 3600, ge=60, description="Celery's Redis transport "
                                      "redelivers an unacknowledged job after this long (seconds): keep it "
                                      "above the longest job. Lost workers are found by their heartbeat instead.")
    worker_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9._@+-]+$", max_length=128,
                                  description="The worker's id in heartbeats, metrics and logs "
                                  "(an engine group's frontend i adds -i); default: host-pid-random.")
    metrics_port: int = Field(
        default=9400, ge=0, le=65535, description="The worker's Prometheus /metrics and "
        "/ready port (vLLM's metrics and inferq's); 0: off; a port already taken is logged and skipped. An "
        "engine group's frontend i serves it on this port + i.")

    @property
    def deadline_margin_s(self) -> float:
        """How much longer than the longest timeout ``job_ttl_s`` must be: the time a job's end at its
        deadline may take to be written and read. A queued job past its deadline is failed by the
        next reaper pass (every ``heartbeat_s``), which a reaper that died delays by its lock's life
        (2 x its budget: ``worker_ttl_s``); a minute at least, for its client to read the end."""
        return max(60.0, self.worker_ttl_s + self.heartbeat_s)

    @model_validator(mode="after")
    def _records_outlive_deadlines(self) -> Settings:
        """A job's record (and its log) must outlive the job's deadline by :attr:`deadline_margin_s`:
        with a TTL equal to the timeout, a job still queued at its deadline had its record expire
        then, and vanished (job_not_found, no end ever written). (The record of a queued job is also
        kept until its deadline plus the TTL: shared/store.py.)"""
        margin = self.deadline_margin_s
        for name in ("max_timeout_s", "default_timeout_s"):
            timeout, setting = getattr(self, name), f"INFERQ_{name.upper()}"
            if self.job_ttl_s < timeout + margin:
                raise ValueError(
                    f"INFERQ_JOB_TTL_S ({self.job_ttl_s} s) must exceed {setting} ({timeout:g} s) by at least "
                    f"{margin:g} s: a job's record must outlive its deadline until its end is written and read "
                    f"(a job still queued at its deadline would vanish); set INFERQ_JOB_TTL_S >= "
                    f"{timeout + margin:g}")
        return self

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """INFERQ_REDIS_SENTINELS as (host, port) pairs (an IPv6 host in brackets: [::1]:26379)."""
        out = []
        for item in filter(None, (i.strip() for i in self.redis_sentinels.split(","))):
            m = re.fullmatch(r"(?:\[(?P<v6>[^\]]+)\]|(?P<host>[^:\[\]]+))(?::(?P<port>\d{1,5}))?", item)
            if m is None or not 0 < int(m["port"] or 26379) < 65536:
                raise ValueError(f"INFERQ_REDIS_SENTINELS: {item!r} is not host:port")
            out.append((m["v6"] or m["host"], int(m["port"] or 26379)))
        return out

    @model_validator(mode="after")
    def _sentinels_named_well(self) -> Settings:
        if self.sentinel_addresses and not self.redis_sentinel_master:
            raise ValueError("INFERQ_REDIS_SENTINELS needs INFERQ_REDIS_SENTINEL_MASTER (the name they monitor)")
        return self

    @field_validator("served_model_name")
    @classmethod
    def _served_name_is_a_name(cls, v: str | None, info: ValidationInfo) -> str | None:
        """The served name is what clients send as ``model`` and part of Redis keys and queue names:
        it must be a name a client may send. Without INFERQ_SERVED_MODEL_NAME it is INFERQ_MODEL (a
        Hub id, or a folder's path as given), which must then be one too."""
        if v:
            if not is_model_name(v):
                raise ValueError(f"INFERQ_SERVED_MODEL_NAME {v!r} is not a model name: {_NAME_RULE}")
            return v
        model = info.data.get("model")
        if model and not is_model_name(model):
            raise ValueError(f"INFERQ_MODEL {model!r} is the model's name while INFERQ_SERVED_MODEL_NAME is unset, "
                             f"and it is not a model name: {_NAME_RULE}; set INFERQ_SERVED_MODEL_NAME to the name "
                             "clients send")
        return v

    @model_validator(mode="after")
    def _adapters_named_well(self) -> Settings:
        """Adapter names become ``model`` values: the same characters as model names, none a model's."""
        for name in self.lora_adapters:
            if not is_model_name(name):
                raise ValueError(f"LoRA adapter name {name!r} may hold only letters, digits and ._/@+-")
            if name == self.model_name:
                raise ValueError(f"LoRA adapter name {name!r} is the model's own name")
        return self

    @model_validator(mode="after")
    def _models_named_once(self) -> Settings:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"INFERQ_MODELS names a model twice: {names}")
        if self.models and self.frontends > 1:
            raise ValueError("INFERQ_MODELS and INFERQ_FRONTENDS > 1 cannot be combined: a multi-model worker "
                             "feeds each engine from one process")
        return self

    @property
    def model_names(self) -> list[str]:
        """The models gateways queue for with no live worker: the default model and INFERQ_MODELS'."""
        return [self.model_name, *(m.name for m in self.models if m.name != self.model_name)]

    @property
    def reserve(self) -> int:
        """Sequences beyond ``max_num_seqs`` that only interactive work takes (0 with classes off)."""
        if not self.service_classes:
            return 0
        if self.interactive_reserve is not None:
            return self.interactive_reserve
        # interactive work at half the engine holds a Poisson-like count of sequences: twice its
        # square root covers its rises above what it held when batch last took a slot
        return max(1, self.max_num_seqs // 4, math.ceil(2 * math.sqrt(self.max_num_seqs)))

    @property
    def engine_max_num_seqs(self) -> int:
        """The engine's ``max_num_seqs``: the sequences any work fills and the interactive reserve."""
        return self.max_num_seqs + self.reserve

    @property
    def reaper_budget(self) -> float:
        """Seconds one reaper pass may spend (``reaper_budget_s`` or half the worker TTL)."""
        return self.reaper_budget_s or self.worker_ttl_s / 2

    @property
    def model_name(self) -> str:
        """The name clients send in ``model`` and the suffix of the model's queue."""
        if self.served_model_name or self.model:
            return self.served_model_name or self.model or ""
        return TINY_EMBED_NAME if self.runner == "pooling" else TINY_MODEL_NAME


_NAME_RULE = f"a name holds only letters, digits and ._/@+- (at most {MODEL_NAME_MAX_LEN} characters)"


def is_model_name(name: str) -> bool:
    """Whether ``name`` may be a model's (or an adapter's) name: what a client may send as ``model``."""
    return bool(re.fullmatch(MODEL_NAME_PATTERN, name)) and len(name) <= MODEL_NAME_MAX_LEN


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
