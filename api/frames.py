"""A job's events as stored and published, read cheaply: :class:`Frame` (type, ``seq`` and the JSON
text, a token event's read without a JSON parse) and :class:`PlainToken` (consecutive plain token
events of one completion joined, their text kept as the worker's JSON wrote it). The stream hub
(api/streams.py) hands frames on; the OpenAI streams read them merged (:func:`merged`)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

from inferq.shared.schemas import TokenEvent, parse_event
from inferq.shared.store import Event

_TOKEN = '{"type":"token","seq":'  # how a worker's token event starts (pydantic keeps field order)
# a plain token event exactly as a worker writes it (no logprobs, tool calls or prompt log-probs):
# the text's JSON string body is the group between its quotes (a quote inside it is escaped)
_PLAIN = re.compile(r'\{"type":"token","seq":(\d+),"index":(\d+),"text":"(.*)","n_tokens":(\d+)\}', re.S)


class Frame(NamedTuple):
    """One event as stored and published: its type, ``seq`` and JSON text."""

    type: str
    seq: int
    raw: str

    @property
    def terminal(self) -> bool:
        return self.type in ("done", "error")

    @property
    def plain_token(self) -> bool:
        """A token event without logprobs (the sampled tokens' or the prompt's) or tool calls, as a
        worker writes it (:data:`_PLAIN`, which :func:`merged` reads too): the hot path, rebuilt from
        JSON without validation (a worker wrote it through pydantic)."""
        return self.type == "token" and _PLAIN.fullmatch(self.raw) is not None

    def event(self) -> Event:
        """The parsed event."""
        if self.plain_token:
            return TokenEvent.model_construct(**json.loads(self.raw))
        return parse_event(self.raw)

    def json(self) -> str:
        """The text to send a client: a token event as it is; others in their canonical form
        (the Lua scripts write a few events with cjson, which orders and omits fields its own way)."""
        return self.raw if self.type == "token" else parse_event(self.raw).model_dump_json(exclude_none=True)


@dataclass(slots=True)
class PlainToken:
    """Consecutive plain token events of one completion, joined, with the text as the worker's JSON
    wrote it (escaped, without its quotes): a stream splices ``text_json`` into its chunk's JSON,
    which is what dumping the chunk would write, without decoding and encoding the text again.
    A member of the event union: ``type == "token"`` narrows to it or a :class:`TokenEvent`, and
    it reads like one without logprobs, tool calls or prompt log-probs."""

    seq: int
    index: int
    text_json: str
    n_tokens: int

    type: ClassVar[Literal["token"]] = "token"
    logprobs: ClassVar[None] = None
    tool_calls: ClassVar[None] = None
    prompt_logprobs: ClassVar[None] = None

    @property
    def text(self) -> str:
        text: str = json.loads(f'"{self.text_json}"')
        return text

    def event(self) -> TokenEvent:
        return TokenEvent(seq=self.seq, index=self.index, text=self.text, n_tokens=self.n_tokens)


#: An event as the OpenAI streams read it: parsed, or a run of plain tokens (``merge``)
StreamItem = Event | PlainToken


def frame(raw: str) -> Frame:
    if raw.startswith(_TOKEN) and (end := raw.find(",", len(_TOKEN))) > 0:
        return Frame("token", int(raw[len(_TOKEN):end]), raw)
    d = json.loads(raw)
    return Frame(str(d["type"]), int(d["seq"]), raw)


def from_last_restart(frames: list[Frame]) -> list[Frame]:
    """The frames from the last ``restart`` among them on: the events of an attempt that was lost
    are dropped when the restart that ends it comes with them (a stream that replays a restarted
    job from its log starts at the attempt that counts). A reader that already passed a lost
    attempt's text on sees the restart itself, as before."""
    for i in range(len(frames) - 1, -1, -1):
        if frames[i].type == "restart":
            return frames[i:]
    return frames


def merged(frames: list[Frame]) -> list[StreamItem]:
    """The frames' events, consecutive plain token events of the same completion joined into
    one :class:`PlainToken` (texts and token counts added up, ``seq`` the last one's). Events with
    logprobs, and all others, pass as they are."""
    out: list[StreamItem] = []
    run: PlainToken | None = None
    for f in frames:
        m = _PLAIN.fullmatch(f.raw) if f.type == "token" else None
        if m is not None:
            seq, index, text, n = int(m[1]), int(m[2]), m[3], int(m[4])
            if run is not None and run.index == index:
                run = PlainToken(seq, index, run.text_json + text, run.n_tokens + n)
                continue
            if run is not None:
                out.append(run)
            run = PlainToken(seq, index, text, n)
            continue
        if run is not None:
            out.append(run)
            run = None
        out.append(f.event())
    if run is not None:
        out.append(run)
    return out
