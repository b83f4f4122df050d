"""Pausing a job instead of starting it over (docs/design.md, "Service classes").

A worker that makes room for work with a better claim on its slot (worker/jobs/room.py) pauses a
running job: its generation stops, every event it emitted is logged, and the job goes back to the
queue with what it produced (a :class:`~inferq.shared.schemas.Resume` in its record) and no
``restart`` event. Its next attempt, on any worker, continues it: the kept tokens become the end of
its prompt (a prefix-cache hit where that worker's cache still holds them), its token budget shrinks
by them, and its stream goes on from the last event its client saw.

A continuation is the same job only for one completion (n = 1) without echo or prompt log-probs,
without a seed (a seeded job would no longer give its one text), stop strings (one could straddle
the pause), presence or frequency penalties (vLLM counts them over the output, where the kept
tokens no longer are), structured output or tool-call parsing (their state is not carried over):
other jobs are handed back to start over, as before. A continuation runs without a tool-call parser
even on a worker that has one (its first attempt's text was plain), and its latencies are not an
interactive job's first token (the batch limit does not watch it).
"""

from __future__ import annotations

from typing import Any

from inferq.shared.schemas import ChoiceEnd, JobRequest, Resume
from inferq.worker.jobs.outputs import Progress


def resumable(req: JobRequest, parses_tools: bool) -> bool:
    """Whether a continuation of ``req`` from any point is the same job (see the module)."""
    structured = (req.json_schema is not None or req.json_object or req.choice is not None
                  or req.regex is not None or req.grammar is not None)
    return (req.n == 1 and req.embed is None and not req.echo and req.prompt_logprobs is None
            and req.seed is None and not req.stop and not req.presence_penalty and not req.frequency_penalty
            and not structured and not parses_tools)


def continued(params: Any, resume: Resume) -> int:
    """Shrink vLLM's ``SamplingParams`` by the kept tokens (its budget and its minimum); the tokens
    left to generate (0: the budget is spent, the job ends with finish reason ``length``)."""
    kept = len(resume.ids)
    params.max_tokens = max(int(params.max_tokens) - kept, 0)
    params.min_tokens = max(int(params.min_tokens or 0) - kept, 0)
    return int(params.max_tokens)


def continuation(p: Progress, prompt: list[int], resume: Resume | None, params: Any,
                 pausable: bool) -> list[int] | None:
    """The prompt ids an attempt generates from: ``prompt``, or, continuing ``resume``, ``prompt``
    and the kept tokens (``p`` starts from their text and count, ``params`` shrink by them). A
    ``pausable`` attempt (or a continuation) keeps its token ids in ``p``. None: the kept tokens
    spent the budget (the completion ends with finish reason ``length``)."""
    if pausable or resume is not None:
        p.ids = []
    if resume is None:
        return prompt
    p.ids, p.texts[0], p.tokens[0] = list(resume.ids), [resume.text], len(resume.ids)
    if continued(params, resume) < 1:
        p.finish[0] = ChoiceEnd(index=0, finish_reason="length")
        return None
    return [*prompt, *resume.ids]


def kept(p: Progress) -> Resume:
    """What a paused attempt hands back: its completion's token ids and text so far."""
    return Resume(ids=list(p.ids or ()), text="".join(p.texts.get(0, ())))
