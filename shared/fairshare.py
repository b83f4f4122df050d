"""Fair share between tenants inside each priority level of a model's queue.

A tenant is an API key, or the ``tenant=`` several keys name in the keys file (without keys, every
caller is one tenant: the queue is first in, first out as before). Each job is charged its expected
cost in tokens (its prompt, at ``INFERQ_FAIR_PROMPT_WEIGHT`` a token, and ``max_tokens`` per choice)
divided by its key's weight, as a virtual finish tag (start-time fair queueing, as in weighted fair
queueing): the tag is ``max(virtual time, the tenant's last tag) + cost / weight``, where the
virtual time is the tag of the job workers took last. The gateway's submit script
(shared/lua/job_submit.lua) puts the job's Celery message into its list in tag order, so a worker's
next job is always the one of the tenant with the least service so far; a tenant with 10,000 jobs
queued does not delay another's next job by more than the jobs ahead of it in tag order. A job that
ends having cost less than it was charged gives the difference back to its tenant
(shared/lua/job_finish.lua).

Nothing else changes: messages stay in Celery's lists (queue depth, KEDA triggers, cancels,
redelivery and hand-backs see them as they were). The share crosses into the Lua scripts as one
schema, :class:`FairShare` (the record's ``fair`` field), and every key a script touches for it is
declared in the script's KEYS (:func:`fair_keys`), never named in ARGV or in the record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from inferq.shared import keys
from inferq.shared.schemas import JobRequest

#: A tenant's name in the keys file (it labels metrics and Redis fields).
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,63}")
#: The tenant of every caller when auth is off.
ANONYMOUS = "anonymous"
#: Prompt characters counted as one token when the gateway could not count the prompt's tokens.
CHARS_PER_TOKEN = 4
#: The farthest from an end of its list that a submit places a message (job_submit.lua walks the
#: list from its nearer end): a message whose place is deeper goes this far from the nearer end. It
#: bounds a submit's Redis time whatever the queue's depth (bench/submit_cost.py; docs/design.md).
MAX_WALK = 2048


@dataclass(frozen=True)
class Share:
    """Whose share of the queue a job takes, and how big a share that is."""

    tenant: str = ANONYMOUS
    weight: float = 1.0


class FairShare(BaseModel):
    """A job's fair share, as job_submit.lua takes it and the job's record keeps it (``fair``);
    job_claim, job_finish, job_cancel and job_fail_queued read it back there."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(description="Whose share the job takes.")
    weight: float = Field(gt=0, description="The tenant's weight: its tags grow by cost / weight.")
    cost: int = Field(ge=1, description="Tokens the job is charged when queued (job_cost).")
    prompt_weight: float = Field(default=1.0, ge=0, le=1, description="What a prompt token counts for against "
                                 "an output token's 1, in the charge and in the refund at the job's end.")
    ordered: bool = Field(description="Placed in its list by virtual finish tag (fair share on); false: "
                          "pushed as it came (first in, first out).")
    tag: str | None = Field(default=None, description="Its virtual finish tag, set by job_submit.lua when "
                            "ordered; a string of every digit of the double (tags are compared and added to).")


def fair_keys(queue_list: str) -> list[str]:
    """The keys a script touches for the fair share of a job queued on ``queue_list`` (the list of its
    model's queue at its priority), in the order every script declares them: the list's tag order
    (zset), its state (hash: the virtual time ``v`` and each tenant's last tag ``t|{tenant}``), its
    tenants' queued jobs (hash)."""
    return [keys.fair_order(queue_list), keys.fair_state(queue_list), keys.fair_queued(queue_list)]


def job_cost(req: JobRequest, prompt_tokens: int | None, default_max_tokens: int, prompt_weight: float = 1.0) -> int:
    """The tokens a job is expected to cost: its prompt (as counted, else estimated from its
    characters) at ``prompt_weight`` a token, and its output, ``max_tokens`` for each of its ``n``
    choices (none for an embedding job, whose prompt counts in full: it is all its work)."""
    if prompt_tokens is None:
        if req.embed is not None:
            prompt_tokens = sum(map(len, req.embed.token_ids or [])) + \
                sum(map(len, req.embed.texts or [])) // CHARS_PER_TOKEN
        elif req.prompt_token_ids is not None:
            prompt_tokens = len(req.prompt_token_ids)
        else:
            chars = len(req.prompt or "") + sum(len(m.content) for m in req.messages or [])
            prompt_tokens = chars // CHARS_PER_TOKEN
    if req.embed is not None:
        return max(1, prompt_tokens)
    output = (req.max_tokens or default_max_tokens) * req.n
    return max(1, round(prompt_tokens * prompt_weight) + output)


def fair_share(share: Share, cost: int, ordered: bool, prompt_weight: float = 1.0) -> FairShare:
    """The job's share as job_submit.lua takes it (its tag is the script's to set)."""
    return FairShare(tenant=share.tenant, weight=share.weight, cost=cost, ordered=ordered,
                     prompt_weight=prompt_weight)
