"""Log-probs in the job's wire form, and what a job gives back of its prompt.

vLLM reports log-probs per position as ``{token id: Logprob(logprob, rank, decoded_token)}``.
The sampled tokens' become :class:`TokenLogprob` entries; the prompt's (``prompt_logprobs``) are
sent once, as vLLM's server returns them, and with ``echo`` the prompt's text (and, with
``logprobs``, its tokens' entries) comes before each completion's first token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inferq.shared.schemas import PromptLogprob, PromptLogprobs, TokenLogprob, TopLogprob

#: What vLLM's server sends for a log-prob of minus infinity (JSON has no infinity).
LOGPROB_FLOOR = -9999.0


def _tok(lp: Any, tid: int, tokenizer: Any) -> str:
    if lp is not None and lp.decoded_token is not None:
        return str(lp.decoded_token)
    return str(tokenizer.decode([tid]))


def token_logprob(tid: int, entry: Mapping[int, Any] | None, tokenizer: Any, k: int) -> TokenLogprob:
    """Token ``tid``'s log-prob with the ``k`` most likely alternatives at its position; a
    position without log-probs (a prompt's first token) has ``logprob`` None."""
    if entry is None:
        return TokenLogprob(token=_tok(None, tid, tokenizer), logprob=None)
    chosen = entry.get(tid)
    top = sorted(entry.items(), key=lambda kv: kv[1].rank or 0)[:k]
    return TokenLogprob(
        token=_tok(chosen, tid, tokenizer),
        logprob=float(chosen.logprob) if chosen else float("-inf"),
        top_logprobs=[TopLogprob(token=_tok(lp, t, tokenizer), logprob=float(lp.logprob)) for t, lp in top],
    )


def sampled_logprobs(c: Any, tokenizer: Any, k: int) -> list[TokenLogprob] | None:
    """The sampled tokens' log-probs of one completion output, ``k`` alternatives each."""
    if not c.logprobs:
        return None
    return [token_logprob(tid, entry, tokenizer, k) for tid, entry in zip(c.token_ids, c.logprobs, strict=False)]


def wire(positions: Sequence[Mapping[int, Any] | None]) -> PromptLogprobs:
    """vLLM's prompt log-probs as its server returns them (token ids as keys, minus infinity as
    :data:`LOGPROB_FLOOR`)."""
    return [None if pos is None else {
        str(tid): PromptLogprob(logprob=max(float(lp.logprob), LOGPROB_FLOOR), rank=lp.rank,
                                decoded_token=lp.decoded_token)
        for tid, lp in pos.items()} for pos in positions]


class PromptReturn:
    """One job's prompt as its outputs give it back: the prompt's log-probs, gathered from the
    engine's outputs until complete (each of ``n`` completions is a request of its own in the
    engine, with its own copy: the first complete one is kept), and the echo of each completion.

    ``echo``: the prompt's text, put before each completion's first token (None: no echo);
    ``k``: the job's ``logprobs`` (None: the echo has no log-probs)."""

    def __init__(self, ids: list[int], echo: str | None, k: int | None, tokenizer: Any) -> None:
        self.ids = ids
        self.echo_text = echo
        self.k = k
        self.tokenizer = tokenizer
        self.positions: list[Mapping[int, Any] | None] | None = None
        self._parts: dict[int, list[Mapping[int, Any] | None]] = {}
        self._echoed: set[int] = set()
        self._echo_logprobs: list[TokenLogprob] | None = None

    def take(self, out: Any) -> PromptLogprobs | None:
        """The prompt's log-probs, in their wire form, from the output that completes them; None
        before that, and after (they are sent once)."""
        got = out.prompt_logprobs
        if self.positions is not None or not got:
            return None
        part = self._parts.setdefault(out.outputs[0].index if out.outputs else -1, [])
        part.extend(got)
        if len(part) < len(self.ids):
            return None
        self.positions, self._parts = part[:len(self.ids)], {}
        return wire(self.positions)

    def echo(self, index: int) -> tuple[str, list[TokenLogprob] | None] | None:
        """What completion ``index`` starts with, the first time it is asked (None after that, and
        without echo): the prompt's text and, with ``k``, its tokens' log-probs."""
        if self.echo_text is None or index in self._echoed:
            return None
        self._echoed.add(index)
        if self.k is None:
            return self.echo_text, None
        if self._echo_logprobs is None:
            positions = self.positions or [None] * len(self.ids)
            self._echo_logprobs = [token_logprob(tid, pos, self.tokenizer, self.k)
                                   for tid, pos in zip(self.ids, positions, strict=False)]
        return self.echo_text, list(self._echo_logprobs)
