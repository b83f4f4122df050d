"""All of inferq's configuration: one pydantic-settings class, read from ``INFERQ_*`` variables.

Gateway, worker and launcher read the same class so that they agree on names that both sides
use (model name, Redis URL, queue names, limits). Create it once with :func:`get_settings`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Served name of the built-in demo model (used when ``INFERQ_MODEL`` is unset).
TINY_MODEL_NAME = "inferq-tiny"


#: The built-in tiny model's version: its folder name, rebuilt when this changes.
TINY_VERSION = "v2"


class Settings(BaseSettings):
    """Every knob of inferq. Environment variables are the field names upper-cased with ``INFERQ_``."""

    model_config = SettingsConfigDict(env_prefix="INFERQ_", extra="ignore")

    # --- shared -------------------------------------------------------------------------------
    redis_url: str = "redis://127.0.0.1:6379/0"
    model: str | None = Field(
        default=None,
        description="HF model id or local folder the worker serves; unset = the built-in tiny demo model.",
    )
    served_model_name: str | None = Field(
        default=None, description="Name clients use for the model; defaults to INFERQ_MODEL."
    )
    job_ttl_s: int = Field(default=24 * 3600, ge=60, description="How long job records and logs live.")
    cache_dir: Path = Field(default=Path.home() / ".cache" / "inferq")
    log_level: str = "INFO"
    log_format: Literal["plain", "json"] = Field(
        default="plain", description="'json': one JSON object per line, lines about a job carrying its "
        "job_id, model and worker_id (shared/logs.py).")
    tokenizer_path: Path | None = Field(
        default=None, description="Folder with the model's tokenizer.json, for the gateway's /tokenize and "
        "/detokenize; default: INFERQ_MODEL when it is a local folder, the built-in model's otherwise.")

    @property
    def builtin_model_dir(self) -> Path:
        """Where the built-in tiny model is built (once) and read from."""
        return self.cache_dir / "models" / f"inferq-tiny-{TINY_VERSION}"

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
        "each job to, gateway and worker; unset: tracing off (shared/tracing.py).")

    # --- gateway ------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 8000
    api_workers: int = Field(default=1, ge=1, description="Gateway processes sharing the port.")
    ws_compression: bool = Field(
        default=False, description="Offer permessage-deflate on WebSockets. Off: token events are tiny, and "
        "compressing each one raised the gateway's CPU per token 1.4-1.8x (docs/benchmarks.md).")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="Largest request body accepted.")
    max_prompt_chars: int = Field(default=200_000, ge=1)
    max_tokens_limit: int = Field(default=32_768, ge=1, description="Upper bound on max_tokens.")
    max_stop_sequences: int = Field(default=8, ge=0)
    max_stop_chars: int = Field(default=256, ge=1)
    max_n: int = Field(default=8, ge=1, description="Upper bound on completions per request (n).")
    max_json_depth: int = Field(default=32, ge=1, le=128, description="Deepest nesting of objects and "
                                "arrays in a free-form JSON field (json_schema); the worker's JSON parser "
                                "and the serializers stop near 200.")
    max_json_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest free-form JSON field "
                                "(json_schema), as compact UTF-8 JSON.")
    max_queue_depth: int = Field(default=10_000, ge=1, description="Queued jobs per model before 429.")
    default_max_tokens: int = Field(default=256, ge=1)
    api_keys: SecretStr = Field(default=SecretStr(""), description="Comma-separated API keys; any turns auth on.")
    api_keys_file: Path | None = Field(default=None, description="API keys, one per line: 'KEY [name]'.")
    allowed_origins: str = Field(default="", description="Comma-separated origins (scheme://host[:port], or "
                                 "'*') that browser pages may call the API from (CORS) and open WebSockets "
                                 "from; empty: no CORS headers, and WebSockets from any origin.")

    @property
    def origins(self) -> list[str]:
        """``allowed_origins`` as a list."""
        return [o.strip().rstrip("/") for o in self.allowed_origins.split(",") if o.strip()]
    rate_limit_per_minute: int = Field(default=0, ge=0, description="Submissions per key per minute; 0: off.")
    max_concurrent_jobs_per_key: int = Field(default=0, ge=0, description="Unfinished jobs per key; 0: off.")
    idempotency_ttl_s: int = Field(default=24 * 3600, ge=1, description="How long an Idempotency-Key holds.")

    # --- files and batches (the Batch API; api/batches) ---------------------------------------
    files_dir: Path | None = Field(
        default=None, description="Folder (shared by every gateway) that uploaded and batch output files "
        "are kept in; unset: file contents live in Redis, each at most max_file_bytes.")
    max_file_bytes: int = Field(default=64 << 20, ge=1024, description="Largest file upload (POST /v1/files).")
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

    # --- worker / engine ----------------------------------------------------------------------
    max_model_len: int | None = None
    gpu_memory_utilization: float = Field(default=0.90, gt=0, le=1)
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=128, ge=1, description="Engine batch size = Celery job slots.")
    max_num_batched_tokens: int | None = None
    frontends: int = Field(
        default=1, ge=1, le=64, description="Worker processes feeding one engine (like vllm serve's "
        "--api-server-count): each a queue consumer with its share of max_num_seqs. Above 1, the token "
        "path of a fast engine runs on that many Python threads instead of one.")
    gil_switch_interval_ms: float = Field(
        default=0.5, gt=0, le=100, description="How long a worker thread may hold the GIL while another "
        "waits for it (Python's sys.setswitchinterval; CPython's default is 5). A worker's threads (the "
        "queue consumer, the job threads, the engine loop) mostly run briefly and then wait on I/O; after "
        "each wait a thread needs the GIL back, and behind a busy engine loop it waited up to this long.")
    tool_call_parser: str | None = Field(
        default=None, description="vLLM tool-call parser the worker runs on outputs of requests with "
        "tool_choice 'auto' (as vllm serve --tool-call-parser: pythonic, hermes, llama3_json, mistral, ...); "
        "unset: 'auto' is refused with a 400.")
    dtype: str = "auto"
    load_format: str = Field(default="auto", description="'dummy' serves random weights (benchmarks).")
    cpu_kv_cache_gib: float = Field(default=1.0, gt=0, description="KV cache size on the CPU build.")
    enforce_eager: bool | None = Field(default=None, description="Default: true on CPU, false on GPU.")
    heartbeat_s: float = Field(default=2.0, gt=0)
    worker_ttl_s: float = Field(default=10.0, gt=0, description="A worker silent this long is dead.")
    reaper_budget_s: float | None = Field(
        default=None, gt=0, description="Longest one reaper pass runs (it holds the reaper lock for twice "
        "that); default: half the worker TTL.")
    max_attempts: int = Field(default=3, ge=1, description="Runs of a job before it fails as worker_lost.")
    event_write_budget_s: float = Field(
        default=30.0, gt=0, description="How long a worker retries writing a job's events through a Redis "
        "outage; past it the attempt stops and the job goes back to the queue (its log never gets a hole).")
    default_timeout_s: float = Field(default=3600.0, gt=0, description="Job deadline when none is given.")
    max_timeout_s: float = Field(default=24 * 3600.0, gt=0)
    drain_timeout_s: float = Field(default=60.0, ge=0, description="SIGTERM: finish held jobs this long.")
    scheduling_policy: str = Field(default="priority", description="vLLM scheduler: 'priority' or 'fcfs'.")
    visibility_timeout_s: int = Field(default=6 * 3600, ge=60)
    worker_id: str | None = None
    metrics_port: int = Field(
        default=9400, ge=0, le=65535, description="The worker's Prometheus /metrics port (vLLM's metrics "
        "and inferq's); 0: off. An engine group's frontend i serves it on this port + i.")

    @property
    def reaper_budget(self) -> float:
        """Seconds one reaper pass may spend (``reaper_budget_s`` or half the worker TTL)."""
        return self.reaper_budget_s or self.worker_ttl_s / 2

    @property
    def model_name(self) -> str:
        """The name clients send in ``model`` and the suffix of the model's queue."""
        return self.served_model_name or self.model or TINY_MODEL_NAME


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read from the environment once."""
    return Settings()
