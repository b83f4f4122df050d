"""OpenAI requests as inferq jobs: the job a chat completion asks for, the jobs of a text completion
(one per prompt: several prompts in one request become one job each), and the headers that name
them on the answer. The completion id is the job id, so every completion can also be polled and
streamed through ``/v1/jobs``; a prompt of token ids goes to the worker as ids.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from inferq.api.openai import tools
from inferq.api.openai.params import ChatCompletionRequest, CompletionRequest, tier_class
from inferq.shared.request_limits import check_json
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings


def check_chat(req: ChatCompletionRequest, settings: Settings) -> None:
    """The limits on a chat request's free-form JSON, named as the client sent it (the job's own
    check would name ``json_schema``)."""
    if (rf := req.response_format) is not None and rf.json_schema is not None:
        check_json(rf.json_schema.schema_, "response_format.json_schema.schema", settings)


def chat_job(req: ChatCompletionRequest) -> JobRequest:
    """The job of a chat completion: its messages for the worker's chat template, its sampling, and
    what constrains the output (a response format, or forced tool calls)."""
    fields = req.sampling_fields()
    if req.max_completion_tokens is not None:
        fields["max_tokens"] = req.max_completion_tokens
    if req.logprobs:
        fields["logprobs"] = req.top_logprobs or 0
    if (rf := req.response_format) is not None and rf.type == "json_object":
        fields["json_object"] = True
    elif rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        fields["json_schema"] = rf.json_schema.schema_
    if (schema := tools.tool_schema(req)) is not None:
        fields["json_schema"] = schema
    if req.tools:
        fields["tools"] = [t.model_dump(exclude_none=True) for t in req.tools]
        fields["parse_tool_calls"] = tools.parsed(req)
    return JobRequest(messages=[m.to_chat() for m in req.messages], model=req.model, user=req.user,
                      add_generation_prompt=req.add_generation_prompt,
                      continue_final_message=req.continue_final_message, **fields, **tier_class(req.service_tier))


#: ``max_tokens`` of a text completion that sets none: 16, as OpenAI's and vLLM's completions API.
COMPLETION_MAX_TOKENS = 16


def completion_jobs(req: CompletionRequest) -> list[JobRequest]:
    """The jobs of a text completion, one per prompt (text, or token ids), in order."""
    fields = {"max_tokens": COMPLETION_MAX_TOKENS, **req.sampling_fields(), "echo": req.echo,
              **tier_class(req.service_tier)}
    if req.logprobs is not None:
        fields["logprobs"] = req.logprobs
    return [JobRequest(**({"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}),
                       model=req.model, user=req.user, **fields) for p in req.prompts()]


def answer_headers(first_id: str, replayed: bool) -> dict[str, str]:
    """The headers of an answer: its (first) job's id, and whether an earlier request with the same
    ``Idempotency-Key`` created its jobs."""
    return {"X-Inferq-Job-Id": first_id, **({"Idempotent-Replayed": "true"} if replayed else {})}


#: What says how a request's answer is delivered, not what its jobs are.
DELIVERY_FIELDS = frozenset({"stream", "stream_options", "background"})


def job_fields(req: BaseModel) -> dict[str, Any]:
    """A request as its ``Idempotency-Key`` fingerprint takes it: everything but how the answer is
    delivered, so that the same request, streamed or not, answers from the same job (a streamed
    request retried without streaming collects the job's answer)."""
    return req.model_dump(mode="json", exclude=set(DELIVERY_FIELDS))
