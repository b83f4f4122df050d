"""The gateway's OpenAI surface: OpenAI requests become inferq jobs, and job events become OpenAI
answers and streams.

- ``params`` (with ``messages``): the requests of ``/v1/chat/completions`` and ``/v1/completions``;
  ``objects``: what they answer.
- ``jobs``: a request's jobs; ``answers``: a whole answer from a job's events; ``chunks``: a
  stream's SSE payloads (the common chunk from ``chunk_template``); ``tools``: tool calling.
- ``embeddings``: ``/v1/embeddings`` (its request, job and answer).
- ``responses``: the Responses API (``/v1/responses``), a response being a job.

The routes (api/routes/chat.py, responses.py) and the batch runner take the functions they call
from here; the request and answer models come from their modules.
"""

from __future__ import annotations

from inferq.api.openai.answers import Collected, Collector, chat_response, collect, completion_response
from inferq.api.openai.chunks import DONE, chat_chunks, completion_chunks
from inferq.api.openai.embeddings import embedding_job, embedding_response, vectors_of
from inferq.api.openai.jobs import answer_headers, chat_job, check_chat, completion_jobs, job_fields

__all__ = ["DONE", "Collected", "Collector", "answer_headers", "chat_chunks", "chat_job", "chat_response", "check_chat",
           "collect", "completion_chunks", "completion_jobs", "completion_response", "embedding_job",
           "embedding_response", "job_fields", "vectors_of"]
