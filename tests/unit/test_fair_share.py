"""Fair share between tenants in the queue (shared/fairshare.py; a Redis of its own, no worker).

Jobs are submitted as the gateway does (Admission.queue), and taken as workers do: pop the right
end of the queue's list and claim the job. What is asserted is the order workers get them in."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

from inferq.api import queue_metrics
from inferq.api.admission import Admission
from inferq.api.auth import KeyRing, KeySpec, key_id, read_keys_file
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.fairshare import FairShare, Share, job_cost
from inferq.shared.schemas import DoneEvent, JobRequest, JobStatus, Usage
from inferq.shared.settings import Settings
from inferq.shared.store import JobStore
from tests.helpers import queue_depth

MAX_TOKENS = 10  # each job costs 11 tokens: a 4-character prompt (~1 token) and 10 out


def admission(url: str, r: redis.asyncio.Redis, shares: dict[str, Share], fair: bool = True,
              prompt_weight: float = 1.0) -> Admission:
    s = Settings(redis_url=url, served_model_name=f"fair-{uuid.uuid4().hex[:6]}", fair_share=fair,
                 fair_prompt_weight=prompt_weight)
    return Admission(s, r, JobService(s, r, JobStore(r, s.job_ttl_s), make_celery(s)),
                     shares=lambda owner: shares.get(owner or "", Share(owner or "anonymous")))


async def submit(adm: Admission, owner: str, n: int = 1, priority: int = 5, max_tokens: int = MAX_TOKENS,
                 prompt: str = "abcd") -> list[str]:
    ids = [f"job-{uuid.uuid4().hex}" for _ in range(n)]
    reqs = [JobRequest(prompt=prompt, max_tokens=max_tokens, priority=priority) for _ in ids]
    await adm.queue(owner, owner, reqs, ids)
    return ids


async def take(adm: Admission, n: int | None = None) -> list[str]:
    """What workers do: pop the right end of the model's lists (most urgent first), claim the job.
    Returns the owners of the jobs taken, in order."""
    r, store, owners = adm.redis, adm.service.store, []
    for name in keys.queue_lists(adm.settings.model_name):
        while (n is None or len(owners) < n) and (raw := await r.rpop(name)) is not None:
            job_id = json.loads(raw)["headers"]["id"]
            claim = await store.claim(job_id, "w")
            rec = await store.get(job_id)
            assert claim is not None and rec is not None
            if claim.previous is JobStatus.queued:
                owners.append(rec.owner or "")
    return owners


async def test_without_fair_share_the_queue_is_first_in_first_out(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {}, fair=False)
    await submit(adm, "A", 20)
    await submit(adm, "B")
    assert await take(adm) == ["A"] * 20 + ["B"]


async def test_a_tenant_with_one_job_is_not_queued_behind_another_s_backlog(own_redis: str,
                                                                          r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 200)
    await submit(adm, "B")
    got = await take(adm)
    assert len(got) == 201 and got.index("B") <= 1  # behind at most the job A had at the front


async def test_two_backlogged_tenants_alternate(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 30)
    await submit(adm, "B", 30)
    got = await take(adm)
    for k in range(2, 61, 2):  # every prefix: one each, give or take one
        assert abs(got[:k].count("A") - got[:k].count("B")) <= 1, got


async def test_weights_share_the_queue_in_proportion(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {"A": Share("A", 3.0), "B": Share("B", 1.0)})
    await submit(adm, "B", 20)
    await submit(adm, "A", 60)
    got = await take(adm, 40)
    assert got.count("A") in (29, 30, 31) and got.count("B") in (9, 10, 11), got


async def test_tenants_of_one_name_share_one_slot(own_redis: str, r: redis.asyncio.Redis) -> None:
    acme = Share("acme", 1.0)
    adm = admission(own_redis, r, {"A1": acme, "A2": acme})
    await submit(adm, "A1", 10)
    await submit(adm, "A2", 10)
    await submit(adm, "B", 10)
    got = await take(adm, 20)
    assert got.count("B") == 10, got  # acme's 20 jobs and B's 10: B has half the service


async def test_an_idle_tenant_comes_back_level_not_with_credit(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 40)
    assert await take(adm, 20) == ["A"] * 20  # A alone for a while: B is owed nothing for it
    await submit(adm, "B", 20)
    got = await take(adm, 20)
    assert 9 <= got.count("B") <= 11, got


async def test_cheaper_jobs_run_more_often(own_redis: str, r: redis.asyncio.Redis) -> None:
    """The charge is tokens: a tenant whose jobs cost a tenth gets ten jobs for one."""
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 20, max_tokens=109)  # 110 tokens each
    await submit(adm, "B", 100, max_tokens=10)  # 11 tokens each
    got = await take(adm, 44)
    assert got.count("A") in (3, 4, 5), got


async def test_priorities_still_come_first(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 10, priority=0)
    await submit(adm, "B", 10, priority=5)
    assert await take(adm) == ["A"] * 10 + ["B"] * 10


async def test_counts_served_tokens_and_gives_back_what_a_job_did_not_use(own_redis: str,
                                                                          r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {"A": Share("acme", 2.0)})
    store, model = adm.service.store, adm.settings.model_name
    [a1, a2] = await submit(adm, "A", 2)
    [b1] = await submit(adm, "B", 1)
    lists = keys.queue_lists(model)
    snap = await queue_metrics.snapshot(r, model, 60, 60)
    assert snap.tenants == {(model, "acme", "queued"): 2, (model, "B", "queued"): 1}
    state = keys.fair_state(lists[5])
    before = float(await r.hget(state, "t|acme"))
    await store.claim(a1, "w")
    await r.sadd(keys.worker_jobs("w"), a1)
    await r.zadd(keys.workers(model), {"w": __import__("time").time()})
    snap = await queue_metrics.snapshot(r, model, 60, 60)
    assert snap.tenants[(model, "acme", "running")] == 1 and snap.tenants[(model, "acme", "queued")] == 1
    assert await store.finish(a1, "w", 1, DoneEvent(seq=1, status=JobStatus.succeeded), check_log=False,
                              status=JobStatus.succeeded, usage=Usage(prompt_tokens=1, completion_tokens=3))
    assert int(await r.hget(keys.STATS, keys.stat("served", model, "acme"))) == 4
    # charged 11 tokens at weight 2 (5.5), used 4 (2): 3.5 back
    assert float(await r.hget(state, "t|acme")) == pytest.approx(before - 3.5)
    assert await store.request_cancel(a2) is JobStatus.queued  # a cancel leaves the count too
    assert await store.request_cancel(b1) is JobStatus.queued
    snap = await queue_metrics.snapshot(r, model, 60, 60)
    assert not any(k[2] == "queued" for k in snap.tenants)
    text = queue_metrics.exposition(snap).decode()
    assert f'inferq_tenant_served_tokens_total{{model="{model}",tenant="acme"}} 4.0' in text


async def test_depth_oldest_and_cancels_still_count_right(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    model = adm.settings.model_name
    first = await submit(adm, "A", 5)
    await submit(adm, "B")  # now at the popping end, but A's first job is still the oldest
    snap = await queue_metrics.snapshot(r, model, 60, 60)
    rec = await adm.service.store.get(first[0])
    assert rec is not None and snap.oldest[model] == pytest.approx(rec.created_at)
    assert await queue_depth(adm.service.store.redis, model) == 6
    await adm.service.cancel(first[1])
    assert await queue_depth(adm.service.store.redis, model) == 5
    assert sorted(await take(adm)) == ["A"] * 4 + ["B"]


def test_job_cost_counts_prompt_and_every_choice() -> None:
    assert job_cost(JobRequest(prompt="x" * 40, max_tokens=5, n=3), None, 256) == 10 + 15
    assert job_cost(JobRequest(prompt="x", max_tokens=5), 7, 256) == 12
    assert job_cost(JobRequest(prompt="x"), 1, 256) == 257


def test_job_cost_counts_a_prompt_token_at_its_weight_but_an_embedding_s_in_full() -> None:
    from inferq.shared.schemas.jobs import EmbedInputs

    assert job_cost(JobRequest(prompt="x", max_tokens=5), 100, 256, prompt_weight=0.5) == 55
    assert job_cost(JobRequest(prompt="x", max_tokens=5), 100, 256, prompt_weight=0.0) == 5
    embed = JobRequest(embed=EmbedInputs(texts=["x" * 40]))
    assert job_cost(embed, None, 256, prompt_weight=0.5) == 10


async def test_a_long_prompt_costs_its_tenant_its_weight(own_redis: str, r: redis.asyncio.Redis) -> None:
    """At half weight, a tenant whose jobs ask 10 tokens after a 400-character (100-token) prompt is
    charged 60 a job: it gets one job for every 6 of a tenant asking 10 after a 1-token prompt
    (with prompts in full it would be one for 10)."""
    adm = admission(own_redis, r, {}, prompt_weight=0.5)
    await submit(adm, "A", 20, prompt="x" * 400)
    await submit(adm, "B", 100, prompt="abcd")
    got = await take(adm, 35)
    assert got.count("A") == 5, got
    [a] = await submit(adm, "C", 1, prompt="x" * 400)
    fair = FairShare.model_validate_json(await r.hget(keys.job(a), "fair"))
    assert (fair.cost, fair.prompt_weight) == (60, 0.5)


async def test_the_refund_counts_the_prompt_at_the_share_s_weight(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {}, prompt_weight=0.5)
    store, model = adm.service.store, adm.settings.model_name
    [a1, _] = await submit(adm, "A", 2, prompt="x" * 400)  # charged 50 + 10 = 60 each
    state = keys.fair_state(keys.queue_lists(model)[5])
    before = float(await r.hget(state, "t|A"))
    await store.claim(a1, "w")
    assert await store.finish(a1, "w", 1, DoneEvent(seq=1, status=JobStatus.succeeded), check_log=False,
                              status=JobStatus.succeeded, usage=Usage(prompt_tokens=100, completion_tokens=4))
    # used 100 x 0.5 + 4 = 54 of the 60: 6 back; the served count stays in plain tokens
    assert float(await r.hget(state, "t|A")) == pytest.approx(before - 6)
    assert int(await r.hget(keys.STATS, keys.stat("served", model, "A"))) == 104


def test_keys_file_names_tenants_and_weights(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("sk-1 ops team tenant=acme weight=3\nsk-2 tenant=acme\nsk-3 weight=0.5\nsk-4 carol\n")
    specs = read_keys_file(f)
    assert specs == {"sk-1": KeySpec("ops team", "acme", 3.0), "sk-2": KeySpec(None, "acme", 1.0),
                     "sk-3": KeySpec(None, None, 0.5), "sk-4": KeySpec("carol", None, 1.0)}
    ring = KeyRing(specs)
    assert ring.share(key_id("sk-1")) == Share("acme", 3.0)
    assert ring.share(key_id("sk-3")) == Share(key_id("sk-3"), 0.5)
    assert ring.share(None) == Share() and ring.share("key-unknown") == Share()


@pytest.mark.parametrize("line", ["sk-secret weight=0", "sk-secret weight=x", "sk-secret weight=nan",
                                  "sk-secret tenant=a|b", "sk-secret tenant="])
def test_a_bad_option_names_its_line_not_the_key(tmp_path: Path, line: str) -> None:
    f = tmp_path / "keys"
    f.write_text("# keys\n" + line + "\n")
    with pytest.raises(ValueError, match="line 2") as e:
        read_keys_file(f)
    assert "sk-secret" not in str(e.value)


async def test_jobs_cancelled_while_queued_cost_their_tenant_nothing(own_redis: str, r: redis.asyncio.Redis) -> None:
    """A tenant that cancels its backlog is not behind it afterwards."""
    adm = admission(own_redis, r, {})
    backlog = await submit(adm, "A", 100)
    await submit(adm, "B", 10)
    for job_id in backlog:
        await adm.service.cancel(job_id)
    await submit(adm, "A", 10)
    got = await take(adm)
    assert sorted(got) == ["A"] * 10 + ["B"] * 10
    assert got[:10].count("A") in (4, 5, 6), got


class Monitor:
    """Every command Redis runs, as MONITOR reports it, read on a thread of its own."""

    def __init__(self, url: str) -> None:
        import threading

        self.client = redis.Redis.from_url(url)
        self.lines: list[dict] = []
        self.ready, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        self.ready.wait(5)

    def _read(self) -> None:
        with self.client.monitor() as m:
            self.ready.set()
            for cmd in m.listen():
                self.lines.append(cmd)
                if self.stop.is_set() and "inferq:monitor:end" in cmd["command"]:
                    return

    def scripts(self) -> list[tuple[str, set[str], list[list[str]]]]:
        """Each script run: its sha, the keys it declared, and the commands it ran (as argument lists)."""
        import shlex

        runs: list[tuple[str, set[str], list[list[str]]]] = []
        for cmd in self.lines:
            args = shlex.split(cmd["command"])
            if args[0].upper() in ("EVALSHA", "EVAL"):
                n = int(args[2])
                runs.append((args[1], set(args[3:3 + n]), []))
            elif cmd.get("client_type") == "lua" and runs:
                runs[-1][2].append(args)
        return runs


#: Commands whose first argument is not a key.
NOT_KEYED = {"PUBLISH"}


async def test_every_key_a_job_script_touches_is_declared(own_redis: str, r: redis.asyncio.Redis) -> None:
    """Submit (fair share on), claim, finish, cancel and fail queued jobs with MONITOR on: every key a
    script's commands name is one the script was given in KEYS (the fair share's keys included:
    none is read from the record or ARGV)."""
    adm = admission(own_redis, r, {"A": Share("acme", 2.0)})
    store = adm.service.store
    mon = Monitor(own_redis)
    [a1, a2, a3] = await submit(adm, "A", 3)
    [b1] = await submit(adm, "B", 1)
    await store.claim(a1, "w")
    await store.finish(a1, "w", 1, DoneEvent(seq=1, status=JobStatus.succeeded), check_log=False,
                       status=JobStatus.succeeded, usage=Usage(prompt_tokens=1, completion_tokens=3))
    await store.claim(b1, "w", queue_list=keys.queue_lists(adm.settings.model_name)[5])
    await store.request_cancel(a2)
    from inferq.shared.schemas import ErrorInfo

    await store.fail_queued(a3, ErrorInfo(type="invalid_request_error", code="undecodable_job", message="x"))
    mon.stop.set()
    await r.get("inferq:monitor:end")
    mon.thread.join(10)
    runs = mon.scripts()
    assert len(runs) >= 8
    undeclared = [(sha[:8], c) for sha, declared, cmds in runs for c in cmds
                  if len(c) > 1 and c[0].upper() not in NOT_KEYED and c[1] not in declared]
    assert undeclared == []
    touched = {c[1] for _, _, cmds in runs for c in cmds if len(c) > 1}
    assert any(k.startswith("inferq:fair:") for k in touched)  # the share's keys were touched, declared


async def test_a_script_refuses_a_share_whose_keys_were_not_declared(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {})
    [a1] = await submit(adm, "A", 1)
    store = adm.service.store
    with pytest.raises(redis.exceptions.ResponseError, match="keys of the share were not declared"):
        await store._claim(keys=[keys.job(a1), keys.job_log(a1), keys.worker_jobs("w"), keys.QUEUED],
                           args=['"w"', "1", a1, "", 60])


async def test_the_record_keeps_the_share_by_its_full_names(own_redis: str, r: redis.asyncio.Redis) -> None:
    adm = admission(own_redis, r, {"A": Share("acme", 2.0)})
    [a1] = await submit(adm, "A", 1)
    fair = FairShare.model_validate_json(await r.hget(keys.job(a1), "fair"))
    assert (fair.tenant, fair.weight, fair.cost, fair.ordered) == ("acme", 2.0, 11, True)
    assert float(fair.tag or 0) == 5.5 and set(fair.model_dump()) == {"tenant", "weight", "cost", "ordered",
                                                                     "prompt_weight", "tag"}


@pytest.mark.parametrize(("walk", "at"), [(8, 5), (5, 5), (3, 3), (1, 1)])
async def test_a_message_is_placed_exactly_within_the_walk_of_either_end(own_redis: str, r: redis.asyncio.Redis,
                                                                          walk: int, at: int) -> None:
    """A's 10 jobs have tags 11 ... 110; B's one job, charged 55 tokens, belongs after A's fifth: placed
    there when that is within the walk of an end of the list, else the walk from the nearer end."""
    adm = admission(own_redis, r, {})
    adm.service.store.max_walk = walk
    await submit(adm, "A", 10)
    await submit(adm, "B", max_tokens=54)  # a 4-character prompt (1 token) and 54 out
    got = await take(adm)
    assert got.index("B") == at and got.count("A") == 10, got


async def test_a_message_placed_from_the_pushing_end_keeps_the_order(own_redis: str, r: redis.asyncio.Redis) -> None:
    """B's job belongs 3 from the pushing end of A's 10 (tags 11 ... 110: its 80 goes after A's 7th)."""
    adm = admission(own_redis, r, {})
    await submit(adm, "A", 10)
    await submit(adm, "B", max_tokens=79)
    got = await take(adm)
    assert got.index("B") == 7, got


async def test_a_tenant_with_few_jobs_queued_is_announced_to_the_workers(own_redis: str,
                                                                          r: redis.asyncio.Redis) -> None:
    """The submit script publishes each interactive job on the model's waiting channel while its tenant
    has 8 or fewer queued (a tenant that may run below its share: worker/jobs/room.py makes room for
    it), with the tenant's weight; a backlogged tenant's further jobs and batch work are not."""
    import asyncio

    adm = admission(own_redis, r, {"A": Share("acme", 2.0)})
    got: list[dict] = []
    async with r.pubsub() as ps:
        await ps.subscribe(keys.waiting(adm.settings.model_name))
        await ps.get_message(timeout=1)  # the subscription's confirmation
        await submit(adm, "A", 10)  # announced 8 times: then it is backlogged
        await adm.queue("B", "B", [JobRequest(prompt="abcd", max_tokens=10, service_class="batch", priority=9)],
                        [f"job-{uuid.uuid4().hex}"])  # batch work is not announced
        await submit(adm, "C")
        for _ in range(40):
            msg = await ps.get_message(ignore_subscribe_messages=True, timeout=0.1)
            if msg is not None:
                got.append(json.loads(msg["data"]))
            await asyncio.sleep(0)
    assert got == [{"tenant": "acme", "weight": 2}] * 8 + [{"tenant": "C", "weight": 1}]
