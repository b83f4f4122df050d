"""``/tokenize`` and ``/detokenize``, as vLLM's server has them, for the default model: the gateway
reads the model's ``tokenizer.json`` itself (``Settings.tokenizer_dir``, a worker's model folder, or
what the workers published in Redis; the ``tokenizers`` library, no vLLM), so they cost no worker
time. A prompt is counted as a worker counts it; chat messages are rendered with the model's chat
template first (``api/chat_template.py``), as the worker does.
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from inferq.api.deps import Caller, Service
from inferq.api.openai.messages import OpenAIMessage, ToolDef
from inferq.api.prompt_ids import GatewayTokenizer, gateway_tokenizer
from inferq.api.service import JobService
from inferq.shared.errors import InvalidRequest, NotFound, Unavailable
from inferq.shared.keys import MODEL_NAME_PATTERN
from inferq.shared.schemas import WorkerInfo

router = APIRouter(tags=["tokenize"])


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, max_length=256, pattern=MODEL_NAME_PATTERN)
    prompt: str = Field(max_length=1_000_000)
    add_special_tokens: bool = True
    return_token_strs: bool | None = Field(default=False, description="Also answer each token's string "
                                           "(`token_strs`), as vLLM's server does.")


class TokenizeChatRequest(BaseModel):
    """vLLM's chat form: the messages as the chat template renders them."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, max_length=256, pattern=MODEL_NAME_PATTERN)
    messages: list[OpenAIMessage] = Field(min_length=1, max_length=1024)
    add_generation_prompt: bool = True
    continue_final_message: bool = Field(default=False, description="The text ends inside the last message, "
                                         "left open (needs `add_generation_prompt: false`).")
    add_special_tokens: bool = False
    tools: list[ToolDef] | None = Field(default=None, max_length=128)
    return_token_strs: bool | None = Field(default=False, description="Also answer each token's string "
                                           "(`token_strs`), as vLLM's server does.")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, max_length=256, pattern=MODEL_NAME_PATTERN)
    tokens: list[int] = Field(max_length=1_000_000)


class DetokenizeResponse(BaseModel):
    prompt: str


async def _tokenizer(service: JobService, model: str | None) -> tuple[GatewayTokenizer, list[WorkerInfo]]:
    """The default model's tokenizer: from ``INFERQ_TOKENIZER_PATH``, else a live worker's model
    folder where this gateway can read it, else what the workers published in Redis (a gateway on
    another host); with the model's live workers (read once per request)."""
    settings = service.settings
    if model not in (None, settings.model_name) and (adapter := await service.adapters.get(model)) is not None:
        model = adapter.parent  # an adapter tokenizes as its base model
    if model not in (None, settings.model_name):
        raise NotFound(f"model {model!r}: this gateway tokenizes only its default model "
                       f"{settings.model_name!r}", param="model", code="model_not_found")
    workers = await service.live_workers(settings.model_name)
    folder = settings.tokenizer_dir
    if folder is not None and (tok := gateway_tokenizer(str(folder))) is not None:
        return tok, workers
    for w in workers:
        tok = gateway_tokenizer(w.tokenizer) if w.tokenizer else None
        if tok is not None or (tok := await service.published.wait(w.tokenizer_files)) is not None:
            return tok, workers
    raise Unavailable("this gateway cannot read the model's tokenizer, and no live worker of it has "
                      "published one: set INFERQ_TOKENIZER_PATH to a folder with its tokenizer.json",
                      code="tokenizer_unavailable")


@router.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(req: TokenizeRequest | TokenizeChatRequest, service: Service, _: Caller) -> TokenizeResponse:
    """The token ids of a prompt, or of chat messages rendered with the model's chat template, as
    the default model's tokenizer gives them."""
    tok, workers = await _tokenizer(service, req.model)
    if isinstance(req, TokenizeChatRequest):
        if req.continue_final_message and req.add_generation_prompt:  # as vLLM (the default adds one too)
            raise InvalidRequest("cannot set both continue_final_message and add_generation_prompt to true",
                                 param="continue_final_message")
        text = tok.render_chat([m.to_chat().template_dict() for m in req.messages], req.add_generation_prompt,
                               [t.model_dump(exclude_none=True) for t in req.tools or ()] or None,
                               req.continue_final_message)
    else:
        text = req.prompt
    ids = tok.tokenizer.encode(text, add_special_tokens=req.add_special_tokens).ids
    strs = [tok.tokenizer.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=max((w.max_model_len for w in workers), default=None),
                            tokens=ids, token_strs=strs)


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(req: DetokenizeRequest, service: Service, _: Caller) -> DetokenizeResponse:
    """The text of token ids (special tokens left out, as vLLM's server does)."""
    tok = (await _tokenizer(service, req.model))[0].tokenizer
    if any(not 0 <= t < tok.get_vocab_size() for t in req.tokens):
        raise InvalidRequest(f"tokens: every id must be from 0 to {tok.get_vocab_size() - 1}", param="tokens")
    return DetokenizeResponse(prompt=tok.decode(req.tokens, skip_special_tokens=True))
