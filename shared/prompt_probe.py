"""Whether a gateway tokenizes a prompt into the token ids a worker would.

A gateway that can read the model's tokenizer tokenizes each prompt it queues (it counts it against
the context window anyway) and sends the ids with the job, so that the worker, whose one GIL also
runs the engine's frontend, does not tokenize it again. It may only do so where its tokenizing is
the worker's: each worker tokenizes the probe requests below at start-up, in each form a gateway
can tokenize, and announces a digest of the ids per form (``WorkerInfo.prompt_probe``); a gateway
sends ids for a form only where its own digest is the same.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable

from inferq.shared.schemas import ChatMessage, JobRequest

log = logging.getLogger(__name__)

#: The forms of prompt a gateway may tokenize: a plain ``prompt``; ``messages`` rendered with the
#: model's chat template (without tools or an assistant turn's tool calls, and not continuing the
#: final message: a gateway's template filters need not match the worker's there).
PROMPT, CHAT = "prompt", "chat"

_TEXT = ("Probe: naïve café, 東京 and ΔΩ; tabs\tand  double spaces,\nnew lines\r\n, digits 0123456789, "
         "emoji 🙂, <s> </s> [INST] <|im_start|> {{ braces }} ... the END.")

_TURNS = [ChatMessage(role="user", content="Hello? " + _TEXT), ChatMessage(role="assistant", content="Hi: " + _TEXT),
          ChatMessage(role="user", content="  and again  \n")]

#: Per form, the probe requests. Chat has several, as templates refuse different turns (many
#: refuse a system turn, or turns that do not alternate); which of them the template refuses is
#: part of the digest.
PROBES: dict[str, list[JobRequest]] = {
    PROMPT: [JobRequest(prompt=_TEXT)],
    CHAT: [
        JobRequest(messages=_TURNS),
        JobRequest(messages=_TURNS[:1]),
        JobRequest(messages=_TURNS[:2], add_generation_prompt=False),
        JobRequest(instructions="Be brief.", messages=[ChatMessage(role="system", content="A probe. " + _TEXT),
                                                      *_TURNS]),
    ],
}


def form(req: JobRequest) -> str | None:
    """The form of ``req``'s prompt a gateway may tokenize, or None (token ids, tools or tool calls,
    a final message continued: the worker alone prepares those)."""
    if req.prompt is not None:
        return PROMPT
    if (req.messages is not None and not req.tools and not req.continue_final_message
            and not any(m.tool_calls for m in req.messages)):
        return CHAT
    return None


def digests(encode: Callable[[JobRequest], list[int]]) -> dict[str, str]:
    """Per form, a digest of ``encode``'s ids for its probes (and of which probes it refused); a
    form whose every probe ``encode`` refuses (a model without a chat template) has none."""
    out = {}
    for name, probes in PROBES.items():
        parts = []
        for probe in probes:
            try:
                parts.append(",".join(map(str, encode(probe))))
            except Exception as e:
                log.debug("a %s probe was refused: %s", name, e)
                parts.append("!")
        if set(parts) == {"!"}:
            log.info("no %s probe could be tokenized: prompts of that form are tokenized by the worker", name)
            continue
        out[name] = hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]
    return out
