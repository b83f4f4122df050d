"""The models one worker can serve (``INFERQ_MODELS``): each a name, a model and the engine settings
that differ from the worker's own. Read by the worker (which model processes to run) and by the
gateway (the models it queues for while no worker holds them awake, as it does the default model).

    INFERQ_MODELS='[{"name": "chat", "model": "/models/chat-7b"},
                    {"name": "code", "model": "/models/code-7b", "settings": {"max_model_len": 16384}}]'
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferq.shared.keys import MODEL_NAME_MAX_LEN, MODEL_NAME_PATTERN

#: The settings a model of a multi-model worker may set for itself (its engine and what its jobs
#: need); every other setting is the worker's, shared by its models.
PER_MODEL = frozenset({
    "max_model_len", "gpu_memory_utilization", "kv_cache_gib", "cpu_kv_cache_gib", "tensor_parallel_size",
    "max_num_seqs", "max_num_batched_tokens", "dtype", "load_format", "enforce_eager", "runner", "convert",
    "tool_call_parser", "tokenizer_path", "lora_modules", "lora_dir", "enable_lora", "max_loras", "max_lora_rank",
    "max_cpu_loras", "interactive_reserve",
})


class ModelSpec(BaseModel):
    """One model a multi-model worker serves."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=MODEL_NAME_MAX_LEN, pattern=MODEL_NAME_PATTERN,
                      description="The name clients send as `model`, and its queue's (inferq.q.{name}).")
    model: str | None = Field(default=None, description="Hugging Face id or local folder; unset: the built-in "
                              "tiny model.")
    settings: dict[str, Any] = Field(default_factory=dict, description="Settings of this model's engine that "
                                     "differ from the worker's, by field name (max_model_len, kv_cache_gib, ...).")

    @field_validator("settings")
    @classmethod
    def _per_model_only(cls, v: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(v) - PER_MODEL)
        if unknown:
            raise ValueError(f"settings {unknown} cannot be set per model (those that can: {sorted(PER_MODEL)})")
        return v

    def env(self) -> dict[str, str]:
        """The environment variables that make a worker process serve this model."""
        out = {"INFERQ_SERVED_MODEL_NAME": self.name}
        if self.model is not None:
            out["INFERQ_MODEL"] = self.model
        for k, v in self.settings.items():
            out[f"INFERQ_{k.upper()}"] = str(v).lower() if isinstance(v, bool) else str(v)
        return out


def model_worker_id(base: str, model: str) -> str:
    """The worker id of the process that serves ``model`` in the multi-model worker ``base``
    (worker ids hold letters, digits and ._@+- only)."""
    return f"{base}.{re.sub(r'[^A-Za-z0-9._@+-]', '_', model)}"
