"""A model's chat template rendered in the gateway, as Hugging Face's ``apply_chat_template``
renders it (a sandboxed Jinja environment with its filters, ``raise_exception``, ``strftime_now`` and
the tokenizer's special tokens), so
that ``/tokenize`` counts chat messages without a worker. The worker renders the same template
with the model's own tokenizer."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inferq.shared.errors import InvalidRequest, Unavailable

#: Put at the end of a message to be continued, to find where it ends in the rendered text (the
#: marker Hugging Face's ``apply_chat_template`` uses).
_CONTINUE = "CONTINUE_FINAL_MESSAGE_TAG "


class _TemplateRaised(Exception):
    pass


def _raise(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """Hugging Face's ``tojson`` (Jinja's own escapes HTML characters)."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """A compiled chat template with the special tokens it may use (``bos_token``, ...), from a
    model folder or from what a worker published of its tokenizer (api/prompt_ids.py)."""

    def __init__(self, source: str, config: dict[str, Any]) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        self.template = env.from_string(source)
        self.specials = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None, continue_final_message: bool = False) -> str:
        """The prompt text of ``messages``; a template that refuses them is a 400 naming ``messages``.
        ``continue_final_message``: the text ends inside the last message, left open, as Hugging
        Face's ``apply_chat_template`` cuts it (after a marker rendered at the message's end)."""
        if continue_final_message:
            messages = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + _CONTINUE}]
        try:
            text = str(self.template.render(messages=messages, tools=tools,
                                            add_generation_prompt=add_generation_prompt, **self.specials))
        except (_TemplateRaised, TemplateError) as e:
            raise InvalidRequest(f"the model's chat template refused these messages: {e}", param="messages") from e
        if not continue_final_message:
            return text
        if _CONTINUE.strip() not in text:
            raise InvalidRequest("continue_final_message: the model's chat template does not render the final "
                                 "message as it is, so it cannot be continued", param="messages")
        at = text.rindex(_CONTINUE.strip())
        return text[:at] if text[at:at + len(_CONTINUE)] == _CONTINUE else text[:at].rstrip()


@lru_cache(maxsize=4)
def load(folder: Path) -> ChatTemplate:
    """The chat template of the model in ``folder`` (``chat_template.jinja``, else
    ``tokenizer_config.json``'s ``chat_template``)."""
    config: dict[str, Any] = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text())
    source = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        source = (folder / "chat_template.jinja").read_text()
    if not isinstance(source, str):
        raise Unavailable("the model has no chat template this gateway can read (tokenizer_config.json or "
                          "chat_template.jinja)", code="tokenizer_unavailable")
    return ChatTemplate(source, config)
