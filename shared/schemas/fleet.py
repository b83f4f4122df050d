"""What workers say of themselves (:class:`WorkerInfo`, their heartbeat) and the fleet's LoRA
adapters (the registry and its control messages)."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field


class EngineStats(BaseModel):
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    lora_running: list[str] = Field(default_factory=list, description="LoRA adapters with requests in the running "
                                    "batch at the last step (those in the engine's GPU slots).")
    peak_running: int = Field(default=0, description="Largest running batch seen since start.")
    engine_requests: int = Field(default=0, description="Requests the engine holds right now.")
    jobs_started: int = 0
    jobs_finished: int = 0
    steps: int = 0
    prefix_cache_queries: int = Field(default=0, description="Prompt tokens looked up in the prefix cache "
                                      "since start (of the steps whose stats reached this worker).")
    prefix_cache_hits: int = Field(default=0, description="Of those, the tokens found cached.")
    last_step_at: float | None = Field(
        default=None, description="Unix time of the engine's last step: a busy engine moves it, a stuck one does not.")


class ClassesInfo(BaseModel):
    """A worker's service classes (worker/jobs/classes.py): its gate and the jobs it holds."""

    slots: int = Field(description="Job slots any work fills (its share of INFERQ_MAX_NUM_SEQS).")
    reserve: int = Field(description="Job slots beyond them that only interactive work takes.")
    batch_limit: int = Field(description="Batch-lane jobs it takes at most now (the latency targets lower it).")
    running: dict[str, dict[str, int]] = Field(default_factory=dict, description="Jobs it holds: class -> "
                                               "tenant -> jobs.")
    ttft_p99_ms: float | None = Field(default=None, description="Interactive time to first token, p99 over the "
                                      "last heartbeat (with a target set).")
    itl_p99_ms: float | None = Field(default=None, description="Interactive time between tokens, p99 over the "
                                     "last heartbeat (with a target set).")


class WorkerInfo(BaseModel):
    """What a worker publishes about itself on every heartbeat."""

    id: str
    model: str
    host: str
    pid: int
    max_model_len: int
    max_num_seqs: int
    tokenizer: str | None = None
    tool_call_parser: str | None = Field(default=None, description="INFERQ_TOOL_CALL_PARSER of the worker.")
    vocab_size: int | None = Field(default=None, description="The model's token ids are 0 to this, excluded "
                                   "(a prompt of token ids is checked against it).")
    started_at: float
    last_seen: float
    draining: bool = False
    stats: EngineStats = Field(default_factory=EngineStats)
    frontend: int = Field(default=0, description="This worker's index in its engine group.")
    tokenizer_files: str | None = Field(default=None, description="The Redis key of the model's tokenizer "
                                        "as this worker published it for gateways (worker/engine/tokenizer_files.py).")
    prompt_probe: dict[str, str] = Field(default_factory=dict, description="Per form of prompt, a digest "
                                         "of the probe's token ids as this worker tokenizes it "
                                         "(shared/prompt_probe.py).")
    frontends: int = Field(default=1, description="Workers sharing this worker's engine (INFERQ_FRONTENDS); "
                           "each reports the whole engine's stats.")
    adapters: list[str] = Field(default_factory=list, description="LoRA adapters this worker's engine holds "
                                "in host memory (by name, least recently used first; vLLM's max_cpu_loras).")
    engine: str = Field(default="", description="The engine instance this worker feeds (several frontends of an "
                        "engine group name one; a restarted engine is a new one): cache-affine pull's index names "
                        "engines. Empty: the worker's id.")
    max_loras: int = Field(default=0, description="Adapters one engine batch may mix (0: LoRA off).")
    lane: bool = Field(default=False, description="Whether this worker consumes its lane (cache-affine pull): "
                       "only then may other workers pass jobs to it.")
    tasks: list[str] = Field(default_factory=lambda: ["generate"], description="What its engine serves: "
                             "'generate' (text), or pooling tasks such as 'embed' (INFERQ_RUNNER=pooling).")
    classes: ClassesInfo | None = Field(default=None, description="Its service classes (None: "
                                        "INFERQ_SERVICE_CLASSES off).")
    swapper: str | None = Field(default=None, description="The multi-model worker this worker process serves "
                                "one model of (INFERQ_MODELS); None: a worker of one model.")


#: A model's state on a multi-model worker: ``cold`` (its engine not started yet), ``waking``,
#: ``awake`` (its jobs are taken), ``sleeping`` (its running jobs end or go back) or ``asleep``.
ModelState = Literal["cold", "waking", "awake", "sleeping", "asleep"]


class SwapRecord(BaseModel):
    """One swap of a multi-model worker: the model put to sleep, the one woken, and what each step took."""

    from_model: str | None = Field(description="The model that was awake (None: none was).")
    to_model: str
    at: float = Field(description="Unix time the swap began.")
    drain_s: float = Field(default=0.0, description="Waiting for the running jobs of the model going to sleep "
                           "(up to INFERQ_SWAP_GRACE_S) and handing back the rest.")
    sleep_s: float = Field(default=0.0, description="Putting its engine to sleep (or stopping it).")
    wake_s: float = Field(default=0.0, description="Waking the other (or starting it: see cold).")
    total_s: float = 0.0
    cold: bool = Field(default=False, description="The model woken had never been started: its engine started.")
    handed_back: int = Field(default=0, description="Jobs still running at the end of the grace, sent back to "
                             "the queue.")
    reason: str = Field(default="", description="Why the worker swapped (the policy's rule).")
    overlapped: bool = Field(default=False, description="The woken model's weights came back while the other "
                             "slept (INFERQ_SWAP_OVERLAP): wake_s is then its KV cache and queue alone.")
    phases: dict[str, float] = Field(default_factory=dict, description="A cold start: where wake_s went "
                                     "(process, setup, engine, consumer: worker/multi/procs.py start_phases).")


class ModelSlot(BaseModel):
    """One model of a multi-model worker, as its heartbeat shows it."""

    name: str
    state: ModelState
    worker: str | None = Field(default=None, description="The worker id of the process serving it (while it "
                               "runs: awake, or asleep in sleep mode).")
    info: WorkerInfo | None = Field(default=None, description="Its worker's description as of its last wake "
                                    "(None: never started): gateways check requests against it while it sleeps.")
    wake_s: float | None = Field(default=None, description="What waking it takes, from its last wakes (a start "
                                 "while it is cold).")
    eta_s: float | None = Field(default=None, description="How long a job for it queued now would wait for this "
                                "worker to have it awake: the wake, after what the awake model may still hold "
                                "the worker for (0 when awake; None: no estimate of a wake yet).")


class SwapperInfo(BaseModel):
    """What a multi-model worker publishes about itself every heartbeat (``inferq:swapper:{id}``)."""

    id: str
    host: str
    pid: int
    models: list[ModelSlot]
    awake: str | None = Field(default=None, description="The model it holds awake (None: between two).")
    awake_since: float | None = None
    sleep_mode: bool = Field(description="Whether its models sleep in vLLM's sleep mode (else they are stopped).")
    max_wait_s: float = Field(description="Its INFERQ_SWAP_MAX_WAIT_S.")
    swaps: int = 0
    recent: list[SwapRecord] = Field(default_factory=list, description="Its last swaps, the latest last.")
    started_at: float
    last_seen: float

    def slot(self, model: str) -> ModelSlot | None:
        return next((m for m in self.models if m.name == model), None)


class AdapterInfo(BaseModel):
    """A LoRA adapter the fleet serves (``inferq:adapters``): clients send ``name`` as ``model``."""

    id: int = Field(default=0, description="Its id in every engine (vLLM's lora_int_id), unique in the fleet: "
                    "the registry gives each registration a new one (shared/adapters.py). 0: not registered yet.")
    name: str
    parent: str = Field(description="The base model it adapts: its workers run it, on its queue.")
    path: str = Field(description="Its folder, readable by every worker of the base model.")
    source: Literal["settings", "runtime"] = "settings"
    owner: str | None = Field(default=None, description="The key (its id) that loaded it at run time, which alone "
                              "may replace or unload it (and an operator key); None: the operator's.")
    created_at: float = Field(default_factory=time.time)


class AdapterCommand(BaseModel):
    """Published on ``inferq:control:adapters``: the workers of ``adapter.parent`` load the adapter
    (and push an :class:`AdapterReply` onto ``reply_to``) or unload it."""

    op: Literal["load", "unload"]
    adapter: AdapterInfo
    reply_to: str | None = None


class AdapterReply(BaseModel):
    """A worker's answer to a load: ``error`` None when its engine took the adapter."""

    worker: str
    error: str | None = None


class AdapterHomes(BaseModel):
    """The adapter homes one worker planned for its model's fleet (``inferq:lora-homes:{model}``):
    the others use it while it still serves their own read of the demand, so that the fleet works
    to one plan and a plan moves only when the demand or the engines do (worker/jobs/homes.py)."""

    engines: dict[str, int] = Field(description="The engines it was made for: id -> adapter slots.")
    homes: dict[str, list[str]] = Field(description="Adapter -> its home engines.")
    made_at: float = Field(default_factory=time.time)
