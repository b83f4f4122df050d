"""A job's text prompt as the model's tokenizer encodes it (the worker's prompt path and the
prompt probes a worker publishes for gateways, shared/prompt_probe.py)."""

from __future__ import annotations

from typing import Any

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import JobRequest


def encode_request(tok: Any, req: JobRequest) -> list[int]:
    """The token ids of ``req``'s text prompt as the model's tokenizer ``tok`` gives them: ``prompt``
    encoded with the tokenizer's special tokens, or ``messages`` rendered with its chat template."""
    if req.messages is None:
        return list(tok.encode(req.prompt))
    # only when set: a tokenizer without the argument renders every other request
    cont = {"continue_final_message": True} if req.continue_final_message else {}
    try:
        text = tok.apply_chat_template(req.chat_messages(), tools=req.tools, tokenize=False,
                                       add_generation_prompt=req.add_generation_prompt, **cont)
    except Exception as e:  # the template raised (raise_exception) or refused the options
        raise InvalidRequest(f"the model's chat template refused these messages: {e}", param="messages") from e
    return list(tok.encode(text, add_special_tokens=False))
