"""What a worker publishes of its model's tokenizer, so that a gateway on another host (no shared
model folder) can tokenize prompts as the worker does (api/prompt_ids.py).

The files are the tokenizer as the worker loaded it: the fast tokenizer's own serialization (with
whatever transformers changed at load, such as a BOS post-processor), the chat template and the
special tokens a template may use. They are stored in Redis under a key named by their digest
(``keys.tokenizer_files``), announced in the worker's heartbeat (``WorkerInfo.tokenizer_files``),
which also keeps the key alive; gateways still send ids only where the workers' probe agrees
(shared/prompt_probe.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from redis.asyncio import Redis

from inferq.shared import keys
from inferq.shared.redis import hash_fields

log = logging.getLogger(__name__)

#: How long published files outlive the last heartbeat that named them.
TTL_S = 7 * 24 * 3600


def files_of(tokenizer: Any) -> dict[str, str] | None:
    """The tokenizer's files (``tokenizer``: its tokenizer.json; ``config``: its special tokens;
    ``chat_template``), or None for one that is not a fast (``tokenizers``) tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    config = {k: v for k in ("bos_token", "eos_token", "unk_token", "pad_token")
              if isinstance(v := getattr(tokenizer, k, None), str)}
    files = {"tokenizer": backend.to_str(), "config": json.dumps(config, sort_keys=True)}
    if isinstance(template := getattr(tokenizer, "chat_template", None), str):
        files["chat_template"] = template
    return files


def key_of(files: dict[str, str]) -> str:
    """The Redis key the files are stored under: named by their digest."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:24]
    return keys.tokenizer_files(digest)


async def publish(redis: Redis, files: dict[str, str]) -> str:
    """Store the files (the same key for the same files); returns their key."""
    key = key_of(files)
    async with redis.pipeline(transaction=True) as p:
        p.hset(key, mapping=hash_fields(files))
        p.expire(key, TTL_S)
        await p.execute()
    log.info("published the model's tokenizer for gateways as %s", key)
    return key
