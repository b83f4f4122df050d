"""What an OpenAI stream sends of a job's events: one filter for the chat, completion and
Responses streams."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inferq.api.frames import PlainToken, from_last_restart, merged
from inferq.api.streams import StreamHub
from inferq.shared.schemas import DoneEvent, ErrorEvent, RestartEvent, TokenEvent

#: What an OpenAI stream is sent of a job's events (a ``loading`` event never is)
SentItem = TokenEvent | PlainToken | DoneEvent | ErrorEvent | RestartEvent


async def sent_batches(hub: StreamHub, job_id: str, merge: bool = True) -> AsyncIterator[list[SentItem]]:
    """The job's events a client stream sends, in the lists the hub reads them in (a stream takes
    one async hop per list, not per token): the last attempt's, when a restart comes with the
    events of the attempt it ends; with ``merge``, consecutive plain tokens of a completion as one
    :class:`~inferq.api.frames.PlainToken`. Left out: a token event holding the prompt's log-probs
    (never streamed), a ``loading`` event (OpenAI's streams have no chunk for a wait: the stream's
    headers wait for the first chunk, and the SSE pings keep the connection), and a restart while
    nothing of the job was sent yet (the next attempt just streams). A restart after that ends the
    stream as an error does: text sent cannot be taken back."""
    sent = False
    async for batch in hub.batches(job_id, kind="sse"):
        frames = from_last_restart(batch)
        out: list[SentItem] = []
        for ev in merged(frames) if merge else [f.event() for f in frames]:
            if ev.type == "loading":
                continue
            if ev.type == "token":
                if ev.prompt_logprobs is not None:
                    continue
                sent = True
            elif ev.type == "restart" and not sent:
                continue
            out.append(ev)
        if out:
            yield out
