"""Tool calls in free text (OpenAI's ``tool_choice: "auto"``), found by vLLM's own tool-call
parsers, as ``vllm serve --enable-auto-tool-choice --tool-call-parser NAME`` finds them.

One :class:`ToolCallStream` per job and completion: it is fed each delta of the output and says
which part is content and which tool-call pieces it holds (the parser's streaming API), so that a
streamed and a collected answer are made of the same pieces. vLLM is imported here only inside
functions: importing this module loads nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from inferq.shared.errors import InvalidRequest
from inferq.shared.schemas import JobRequest, ToolCallPiece

log = logging.getLogger(__name__)


def parser_class(name: str) -> Any:
    """vLLM's parser class of that name; a worker checks it at start (an unknown name is fatal)."""
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    return ToolParserManager.get_tool_parser(name)


def _vllm_request(req: JobRequest) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    assert req.messages is not None and req.tools
    # the messages as the client sent them (a call's arguments a JSON string, as vLLM's protocol
    # takes them), not as the chat template reads them (arguments parsed into objects)
    return ChatCompletionRequest(model="inferq", messages=[m.model_dump(exclude_none=True) for m in req.messages],
                                 tools=req.tools, tool_choice="auto")


class ToolCallStream:
    """The parser's view of one completion's output, delta by delta."""

    def __init__(self, parser_cls: Any, tokenizer: Any, req: JobRequest) -> None:
        try:
            self.request = _vllm_request(req)
        except ValueError as e:  # vLLM's protocol refused the tools
            raise InvalidRequest(f"tools: {e}", param="tools") from e
        self.parser = parser_cls(tokenizer, self.request.tools)
        self.text, self.ids = "", []  # type: tuple[str, list[int]]
        self.called = False

    def feed(self, delta_text: str, delta_ids: list[int]) -> tuple[str, list[ToolCallPiece]]:
        """The content and the tool-call pieces in this delta."""
        prev_text, prev_ids = self.text, self.ids
        self.text, self.ids = prev_text + delta_text, prev_ids + list(delta_ids)
        delta = self.parser.extract_tool_calls_streaming(prev_text, self.text, delta_text, prev_ids, self.ids,
                                                         list(delta_ids), self.request)
        if delta is None:
            return "", []
        pieces = [_piece(tc) for tc in delta.tool_calls or []]
        self.called = self.called or bool(pieces)
        return delta.content or "", pieces

    def finish(self) -> list[ToolCallPiece]:
        """Arguments the parser holds but has not streamed yet (as vLLM sends them at the end)."""
        if not self.called:
            return []
        rest = self.parser.get_remaining_unstreamed_args()
        if not rest:
            return []
        return [ToolCallPiece(index=len(self.parser.prev_tool_call_arr) - 1, arguments=rest)]


def _piece(tc: Any) -> ToolCallPiece:
    fn = getattr(tc, "function", None)
    return ToolCallPiece(index=tc.index, id=getattr(tc, "id", None), name=getattr(fn, "name", None),
                         arguments=getattr(fn, "arguments", None))


def tool_streams(parser: Any, tokenizer: Any, req: JobRequest) -> Callable[[], ToolCallStream] | None:
    """For tool_choice "auto": a maker of one parser stream per completion (``parser``: the worker's
    parser class, None without one: a 400 naming tool_choice); None for a job that parses none."""
    if not req.parse_tool_calls:
        return None
    if parser is None:
        raise InvalidRequest('tool_choice "auto" needs a tool-call parser, and this worker has none '
                             "(INFERQ_TOOL_CALL_PARSER)", param="tool_choice")
    return partial(ToolCallStream, parser, tokenizer, req)
