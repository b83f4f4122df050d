"""A job's request as vLLM's ``SamplingParams``, and what vLLM's errors say about a request.

vLLM is imported here only inside functions: importing this module loads nothing.
"""

from __future__ import annotations

from typing import Any

from inferq.shared.errors import ContextLengthExceeded, InvalidRequest
from inferq.shared.schemas import JobRequest


def structured_outputs(req: JobRequest) -> Any:
    """vLLM's ``StructuredOutputsParams`` for the request's JSON schema, JSON object, choice, regex
    or grammar (at most one is set); None without one."""
    from vllm.sampling_params import StructuredOutputsParams

    if req.json_schema is not None:
        return StructuredOutputsParams(json=req.json_schema)
    if req.json_object:
        return StructuredOutputsParams(json_object=True)
    if req.choice is not None:
        return StructuredOutputsParams(choice=list(req.choice))
    if req.regex is not None:
        return StructuredOutputsParams(regex=req.regex)
    if req.grammar is not None:
        return StructuredOutputsParams(grammar=req.grammar)
    return None


def max_tokens_for(req: JobRequest, prompt_tokens: int, max_model_len: int, default_max_tokens: int) -> int:
    """The tokens the job may generate: its ``max_tokens``, or the default within the context
    window. Raises :class:`ContextLengthExceeded` when prompt and completion do not fit."""
    max_tokens = req.max_tokens or min(default_max_tokens, max_model_len - prompt_tokens)
    if max_tokens < 1 or prompt_tokens + max_tokens > max_model_len:
        raise ContextLengthExceeded(prompt_tokens, max(max_tokens, 1), max_model_len, req.prompt_param)
    return max_tokens


def sampling_params(req: JobRequest, prompt_tokens: int, max_model_len: int, default_max_tokens: int) -> Any:
    """vLLM's ``SamplingParams`` for the job (DELTA outputs). Raises :class:`InvalidRequest` where
    vLLM's own validation refuses the request, naming the field when vLLM does."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    max_tokens = max_tokens_for(req, prompt_tokens, max_model_len, default_max_tokens)
    prompt_logprobs = req.prompt_logprobs
    if prompt_logprobs is None and req.echo:  # an echo with logprobs has the prompt's (as vLLM)
        prompt_logprobs = req.logprobs
    try:
        return SamplingParams(
            n=req.n, max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
            top_k=req.top_k, min_p=req.min_p, stop=req.stop or None, seed=req.seed,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty, ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens, stop_token_ids=req.stop_token_ids or None,
            logprobs=req.logprobs, structured_outputs=structured_outputs(req),
            logit_bias=req.logit_bias or None, prompt_logprobs=prompt_logprobs,
            output_kind=RequestOutputKind.DELTA,
            **({"stream_interval": req.stream_interval} if req.stream_interval is not None else {}),
        )
    except Exception as e:
        if isinstance(e, ValueError) or client_error(e):  # vLLM's own validation of the request
            raise InvalidRequest(str(e), param=getattr(e, "parameter", None)) from e
        raise


def engine_dead(e: BaseException | None) -> bool:
    """``e`` is, or was caused by, vLLM's ``EngineDeadError``."""
    from vllm.v1.engine.exceptions import EngineDeadError

    while e is not None:
        if isinstance(e, EngineDeadError):
            return True
        e = e.__cause__
    return False


def client_error(e: BaseException) -> bool:
    """An error vLLM raises for the request itself (``VLLMClientError``, from vLLM 0.3x on; before
    that its validation raised ValueError, and ``VLLMValidationError`` is no longer one)."""
    return any(c.__name__ == "VLLMClientError" for c in type(e).__mro__)
