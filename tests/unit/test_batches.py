"""The Batch API's parts on a real Redis, with no engine: the input file's format check, a line's
conversion, the file store (folder mode), and the runner's state machine (window, expiry, cancel)
over jobs that stay queued because no worker runs here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis.asyncio
from pydantic import ValidationError

from inferq.api.admission import Admission
from inferq.api.auth import Principal
from inferq.api.batches import lines
from inferq.api.batches.files import FileStore
from inferq.api.batches.runner import BatchRunner, LeaseLost, line_job_ids
from inferq.api.batches.schemas import BatchCreate, BatchRecord, OutputLine
from inferq.api.batches.service import BatchService
from inferq.api.queue_metrics import exposition, snapshot
from inferq.api.service import JobService
from inferq.shared import keys
from inferq.shared.celery_app import make_celery
from inferq.shared.errors import InvalidRequest, NotFound
from inferq.shared.schemas import JobRequest
from inferq.shared.settings import Settings
from inferq.shared.store import AlreadyQueued, JobStore

CHAT = "/v1/chat/completions"
ALICE = Principal(key_id="alice", name=None, ip="1.2.3.4")
BOB = Principal(key_id="bob", name=None, ip="1.2.3.5")


def line(i: int, url: str = CHAT, **body: object) -> str:
    body = {"messages": [{"role": "user", "content": f"q{i}"}], **body} if url == CHAT else {"prompt": f"q{i}", **body}
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body})


def test_check_file_keeps_good_lines_and_skips_blank_ones() -> None:
    good, errors = lines.check_file(f"{line(1)}\n\n{line(2)}\r\n", CHAT, 10)
    assert errors == [] and [json.loads(g)["custom_id"] for g in good] == ["c1", "c2"]


@pytest.mark.parametrize("bad,code", [
    ("[1, 2]", "invalid_json_line"),
    (json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/moderations", "body": {}}), "invalid_url"),
    (json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": []}), "invalid_body"),
    (json.dumps({"custom_id": "", "method": "POST", "url": CHAT, "body": {}}), "invalid_custom_id"),
    (json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}, "extra": 1}), "invalid_request"),
])
def test_check_file_names_each_format_error_and_its_line(bad: str, code: str) -> None:
    good, errors = lines.check_file(f"{line(1)}\n{bad}\n", CHAT, 10)
    assert good == [] and [(e.code, e.line) for e in errors] == [(code, 2)]


def test_check_file_limits_lines_and_refuses_an_empty_file() -> None:
    _, errors = lines.check_file("\n".join(line(i) for i in range(4)), CHAT, 3)
    assert [(e.code, e.line) for e in errors] == [("too_many_lines", 4)] and "3" in errors[0].message
    assert [e.code for e in lines.check_file("\n \n", CHAT, 3)[1]] == ["empty_file"]


def test_prepare_converts_as_the_endpoint_does_and_refuses_as_it_would() -> None:
    s = Settings(batch_priority=8, max_tokens_limit=100)
    chat = lines.prepare(line(1, stream=True, max_tokens=5), s)  # stream: answered whole anyway
    assert [(j.max_tokens, j.priority) for j in chat.jobs] == [(5, 8)] and chat.chat is not None
    texts = lines.prepare(line(2, url="/v1/completions", prompt=["a", "b"], n=2), s)
    assert [j.prompt for j in texts.jobs] == ["a", "b"] and texts.n == 2
    assert all(j.priority == 8 for j in texts.jobs)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        lines.prepare(line(3, max_tokens=1000), s)
    with pytest.raises(ValidationError):
        lines.prepare(line(4, temperature="hot"), s)
    out = lines.refused("c4", InvalidRequest("max_tokens: too many", param="max_tokens"))
    assert out.response is not None and out.response.status_code == 400
    assert out.response.body["error"]["param"] == "max_tokens"


async def test_file_store_in_a_folder(r: redis.asyncio.Redis, tmp_path: Path) -> None:
    files = FileStore(Settings(files_dir=tmp_path / "files", max_file_bytes=2048), r)
    f = await files.create("alice", "batch", "in.jsonl", b'{"a": 1}\n')
    assert (tmp_path / "files" / f"{f.id}.jsonl").read_bytes() == b'{"a": 1}\n'
    assert await r.hget(keys.file(f.id), "content") is None  # the contents are not in Redis
    assert await files.content(f.id, ALICE) == '{"a": 1}\n'
    assert [x.id for x in (await files.list(ALICE, None, 10, None)).data] == [f.id]
    assert (await files.list(BOB, None, 10, None)).data == []
    g = await files.create("alice", "batch", "second.jsonl", b"{}\n")
    assert [x.id for x in (await files.list(ALICE, None, 10, None, newest_first=False)).data] == [f.id, g.id]
    assert [x.id for x in (await files.list(ALICE, None, 1, f.id, newest_first=False)).data] == [g.id]
    with pytest.raises(NotFound):
        await files.get(f.id, BOB)  # another key's file does not exist for it
    with pytest.raises(InvalidRequest, match="at most 2048"):
        await files.create("alice", "batch", "big.jsonl", b"x" * 2049)
    await files.delete(f.id, ALICE)
    assert not (tmp_path / "files" / f"{f.id}.jsonl").exists()
    with pytest.raises(NotFound):
        await files.content(f.id, ALICE)


async def test_a_keys_files_count_against_its_quota_until_deleted_or_expired(r: redis.asyncio.Redis) -> None:
    """Files live in Redis without INFERQ_FILES_DIR: one key's uploads stop at its quota (400 naming
    the file and the limit), another key's are not affected, and a delete or an expiry gives the
    bytes back. A batch's output is written past the quota (it is counted)."""
    files = FileStore(Settings(max_file_bytes=2048, max_file_bytes_per_key=3000), r)
    a = await files.create("alice", "batch", "a.jsonl", b"x" * 1500)
    b = await files.create("alice", "batch", "b.jsonl", b"x" * 1500, ttl_s=3600)
    with pytest.raises(InvalidRequest) as e:
        await files.create("alice", "batch", "c.jsonl", b"x")
    assert (e.value.param, e.value.code) == ("file", "file_quota_exceeded") and "at most 3000" in e.value.message
    assert len((await files.list(ALICE, None, 10, None)).data) == 2  # the refused one left nothing
    await files.create("bob", "batch", "b.jsonl", b"x" * 2000)  # per key
    out = await files.create("alice", "batch_output", "out.jsonl", b"y" * 100, limited=False)
    assert int(await r.get(keys.file_bytes("alice"))) == 3100
    await files.delete(a.id, ALICE)
    await files.delete(out.id, ALICE)
    await files.create("alice", "batch", "c.jsonl", b"x" * 1500)
    assert await files.sweep(now=b.expires_at + 1) == 1
    assert await files.sweep(now=b.expires_at + 1) == 0  # removed once: its bytes given back once
    assert int(await r.get(keys.file_bytes("alice"))) == 1500


async def test_files_expire_and_the_sweep_deletes_them(r: redis.asyncio.Redis, tmp_path: Path) -> None:
    files = FileStore(Settings(files_dir=tmp_path / "files"), r)
    keep = await files.create("alice", "batch", "keep.jsonl", b"{}\n")
    f = await files.create("alice", "batch", "in.jsonl", b"{}\n", ttl_s=3600)
    assert keep.expires_at is None and f.expires_at == f.created_at + 3600
    assert (await files.get(f.id, ALICE)).expires_at == f.expires_at
    assert await files.sweep(now=f.expires_at - 1) == 0, "not due yet"
    assert await files.content(f.id, ALICE) == "{}\n"

    assert await files.sweep(now=f.expires_at + 1) == 1
    with pytest.raises(NotFound):
        await files.get(f.id, ALICE)
    assert not (tmp_path / "files" / f"{f.id}.jsonl").exists()
    assert not await r.exists(keys.file(f.id)) and await r.zscore(keys.files("alice"), f.id) is None
    assert await r.zcard(keys.FILES_EXPIRING) == 0
    assert [x.id for x in (await files.list(ALICE, None, 10, None)).data] == [keep.id], "the other file stays"

    # due but not yet swept (no runner polled since): already gone for clients
    g = await files.create("alice", "batch", "g.jsonl", b"{}\n", ttl_s=3600)
    meta = json.loads(await r.hget(keys.file(g.id), "meta"))
    await r.hset(keys.file(g.id), "meta", json.dumps({**meta, "expires_at": int(time.time()) - 1}))
    with pytest.raises(NotFound):
        await files.content(g.id, ALICE)
    assert [x.id for x in (await files.list(ALICE, None, 10, None)).data] == [keep.id]


async def make_runner(r: redis.asyncio.Redis, **settings: object) -> tuple[BatchRunner, BatchService, Settings]:
    s = Settings(**settings)  # redis_url: the module's server, where the Celery messages go
    store = JobStore(r, 600)
    service = JobService(s, r, store, make_celery(s))
    files = FileStore(s, r)
    runner = BatchRunner(s, r, Admission(s, r, service), files)
    return runner, BatchService(r, files, runner.me, 30), s


async def create(batches: BatchService, n: int, who: Principal = ALICE) -> str:
    text = "\n".join(line(i, max_tokens=4) for i in range(n)) + "\n"
    f = await batches.files.create(who.key_id, "batch", "in.jsonl", text.encode())
    b = await batches.create(BatchCreate(input_file_id=f.id, endpoint=CHAT, completion_window="24h"), who)
    return b.id


async def test_runner_keeps_the_window_then_expires_the_batch(r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, _ = await make_runner(r, redis_url=own_redis, batch_window=3)
    bid = await create(batches, 5)
    await runner.advance(bid)
    b = await batches.get(bid, ALICE)
    assert b.status == "in_progress" and b.request_counts.total == 5
    running = await r.hgetall(keys.batch_part(bid, "running"))
    assert sorted(running) == ["0", "1", "2"], "no more than batch_window lines unfinished"
    job = json.loads(running["0"])["jobs"][0]
    assert json.loads(await r.hget(keys.job(job), "request"))["priority"] == 9
    with pytest.raises(NotFound):
        await batches.get(bid, BOB)

    rec = json.loads(await r.hget(keys.batch(bid), "record"))
    rec["batch"]["expires_at"] = int(time.time()) - 1  # the completion window is over
    await r.hset(keys.batch(bid), "record", json.dumps(rec))
    await runner.advance(bid)
    b = await batches.get(bid, ALICE)
    assert b.status == "expired" and b.expired_at and b.output_file_id is None
    assert (b.request_counts.completed, b.request_counts.failed) == (0, 5)
    errs = [OutputLine.model_validate_json(x) for x in (await batches.files.read(b.error_file_id)).splitlines()]
    assert [(e.custom_id, e.error.code) for e in errs if e.error] == [(f"c{i}", "batch_expired") for i in range(5)]
    assert json.loads(await r.hget(keys.job(job), "status")) == "cancelled", "its queued jobs never run"
    assert not await r.sismember(keys.BATCHES_ACTIVE, bid)
    assert await r.hget(keys.STATS, keys.stat("batch_line", "error")) == "5"
    metrics = exposition(await snapshot(r, "inferq-tiny", 10, 60)).decode()
    assert 'inferq_batch_lines_total{outcome="error"} 5.0' in metrics and "inferq_batches_active 0.0" in metrics
    assert not await r.exists(keys.batch_part(bid, "lines"), keys.batch_part(bid, "running"))


async def test_an_output_file_is_one_line_per_answer_for_any_line_reader(r: redis.asyncio.Redis,
                                                                        own_redis: str) -> None:
    """JSON strings may hold U+2028, U+2029 and U+0085 raw, and str.splitlines (as many clients read
    a JSONL file) ends a line at each: the output files write them escaped, the same JSON."""
    runner, batches, _ = await make_runner(r, redis_url=own_redis)
    ids = ["a\u2028b", "c\u2029d", "e\x85f", "plain"]
    text = "".join(json.dumps({"custom_id": c, "method": "POST", "url": CHAT, "body": {
        "messages": [{"role": "user", "content": c}], "max_tokens": 4}}, ensure_ascii=False) + "\n" for c in ids)
    f = await batches.files.create("alice", "batch", "in.jsonl", text.encode())
    b = await batches.create(BatchCreate(input_file_id=f.id, endpoint=CHAT, completion_window="24h"), ALICE)
    await runner.advance(b.id)
    await batches.cancel(b.id, ALICE)
    await runner.advance(b.id)
    done = await batches.get(b.id, ALICE)
    assert done.status == "cancelled" and done.error_file_id is not None
    got = await batches.files.read(done.error_file_id)
    assert sorted(json.loads(x)["custom_id"] for x in got.splitlines()) == sorted(ids)
    assert lines.jsonl(['{"a":"x\u2028y"}']) == b'{"a":"x\\u2028y"}\n'


async def test_cancel_while_validating_and_after(r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, _ = await make_runner(r, redis_url=own_redis)
    early = await create(batches, 2)
    assert (await batches.cancel(early, ALICE)).status == "cancelling"
    await runner.advance(early)
    b = await batches.get(early, ALICE)
    assert b.status == "cancelled" and b.request_counts.total == 0
    with pytest.raises(InvalidRequest, match="cancelled"):
        await batches.cancel(early, ALICE)

    later = await create(batches, 4)
    await runner.advance(later)
    await batches.cancel(later, ALICE)
    await runner.advance(later)
    b = await batches.get(later, ALICE)
    assert b.status == "cancelled" and (b.request_counts.completed, b.request_counts.failed) == (0, 4)
    listed = await batches.list(ALICE, 1, None)
    assert [x.id for x in listed.data] == [later] and listed.has_more
    assert [x.id for x in (await batches.list(ALICE, 5, later)).data] == [early]
    assert (await batches.list(BOB, 5, None)).data == []


async def test_a_line_that_can_never_fit_its_keys_limit_is_answered_not_waited_on(
        r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, _ = await make_runner(r, redis_url=own_redis, max_concurrent_jobs_per_key=1)
    text = line(0, url="/v1/completions", prompt=["a", "b"]) + "\n" + line(1, url="/v1/completions") + "\n"
    f = await batches.files.create("alice", "batch", "in.jsonl", text.encode())
    b = await batches.create(BatchCreate(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"),
                             ALICE)
    await runner.advance(b.id)
    got = OutputLine.model_validate_json(await r.hget(keys.batch_part(b.id, "results"), "0"))
    assert got.response is not None and got.response.status_code == 429
    assert got.response.body["error"]["code"] == "too_many_jobs"
    assert list(await r.hgetall(keys.batch_part(b.id, "running"))) == ["1"], "the next line runs"
    with pytest.raises(NotFound):
        await batches.get(b.id + ":results", ALICE)  # not a batch id: never reaches another key


async def test_only_the_lease_holder_changes_a_batch_and_a_line_counts_once(
        r: redis.asyncio.Redis, own_redis: str) -> None:
    holder, batches, s = await make_runner(r, redis_url=own_redis, batch_window=2)
    other = BatchRunner(s, r, holder.admission, holder.files)  # another gateway's runner
    bid = await create(batches, 3)
    with pytest.raises(LeaseLost):
        await other.advance(bid)  # it may read, but none of its writes lands
    assert (await batches.get(bid, ALICE)).status == "validating"
    assert not await r.exists(keys.batch_part(bid, "lines"))
    await holder.advance(bid)
    assert (await batches.get(bid, ALICE)).status == "in_progress"
    out = lines.unanswered("c0", "cancelled", "test")
    await holder._answer(bid, 0, out)
    await holder._answer(bid, 0, out)  # a step run again after an interruption
    assert (await batches.get(bid, ALICE)).request_counts.failed == 1
    with pytest.raises(LeaseLost):
        await other._answer(bid, 1, out)
    assert await r.hget(keys.batch_part(bid, "results"), "1") is None


async def queued_messages(r: redis.asyncio.Redis, model: str = "inferq-tiny") -> int:
    return sum([await r.llen(q) for q in keys.queue_lists(model)])


async def test_a_line_a_dead_runner_queued_but_never_recorded_is_adopted_not_queued_again(
        r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, s = await make_runner(r, redis_url=own_redis, batch_window=2)
    text = line(0, url="/v1/completions", prompt=["a", "b"]) + "\n" + line(1, url="/v1/completions") + "\n"
    f = await batches.files.create("alice", "batch", "in.jsonl", text.encode())
    bid = (await batches.create(BatchCreate(input_file_id=f.id, endpoint="/v1/completions",
                                            completion_window="24h"), ALICE)).id
    rec = BatchRecord.model_validate_json(await r.hget(keys.batch(bid), "record"))
    assert rec.secret and len(rec.secret) == 32
    # a runner before this one queued the first of line 0's two jobs, then died: nothing recorded
    ids = line_job_ids(rec, 0, 2)
    assert ids == line_job_ids(rec, 0, 2) and len(set(ids)) == 2 and all(keys.is_job_id(i) for i in ids)
    assert ids != line_job_ids(rec.model_copy(update={"secret": "x" * 32}), 0, 2), "the secret makes them"
    first = lines.prepare(line(0, url="/v1/completions", prompt=["a", "b"]), s).jobs[0]
    [dead] = await runner.admission.queue(rec.subject, rec.owner, [first], ids[:1])
    assert await queued_messages(r) == 1

    await runner.advance(bid)
    running = {int(i): json.loads(v) for i, v in (await r.hgetall(keys.batch_part(bid, "running"))).items()}
    assert running[0]["jobs"] == ids, "line 0 runs as the jobs its ids name"
    assert (await runner.store.get(ids[0])).created_at == dead.created_at, "the dead runner's job, not a new one"
    assert json.loads(await r.hget(keys.job(ids[1]), "request"))["prompt"] == "b"
    assert await queued_messages(r) == 3, "line 0's two jobs and line 1's one, each queued once"


async def test_a_job_id_is_queued_once(r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, _, _ = await make_runner(r, redis_url=own_redis)
    service = runner.admission.service
    await r.delete(*keys.queue_lists("inferq-tiny"))
    req = JobRequest(prompt="one", max_tokens=2)
    a = await service.submit(req, owner="alice", job_id="job-" + "a" * 32)
    b = await service.submit(JobRequest(prompt="two", max_tokens=2), owner="bob", job_id=a.id)
    assert (b.id, b.created_at, b.owner, b.request.prompt) == (a.id, a.created_at, "alice", "one")
    assert await queued_messages(r) == 1
    with pytest.raises(AlreadyQueued):
        await runner.store.submit(a, keys.queue_lists("inferq-tiny")[0], "message", 100)


async def test_cancelling_a_batch_stops_the_jobs_a_dead_runner_queued_unrecorded(
        r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, s = await make_runner(r, redis_url=own_redis, batch_window=1)
    bid = await create(batches, 3)
    await runner.advance(bid)  # line 0 runs
    rec = BatchRecord.model_validate_json(await r.hget(keys.batch(bid), "record"))
    orphan = line_job_ids(rec, 1, 1)  # line 1, queued by a runner that died before recording it
    await runner.admission.queue(rec.subject, rec.owner, lines.prepare(line(1, max_tokens=4), s).jobs, orphan)
    await batches.cancel(bid, ALICE)
    await runner.advance(bid)
    b = await batches.get(bid, ALICE)
    assert b.status == "cancelled" and b.request_counts.failed == 3
    assert json.loads(await r.hget(keys.job(orphan[0]), "status")) == "cancelled"


async def test_a_batchs_output_files_expire_as_it_asked(r: redis.asyncio.Redis, own_redis: str) -> None:
    runner, batches, _ = await make_runner(r, redis_url=own_redis)
    f = await batches.files.create("alice", "batch", "in.jsonl", (line(0) + "\n").encode())
    b = await batches.create(BatchCreate(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                                         output_expires_after={"anchor": "created_at", "seconds": 7200}), ALICE)
    await runner.advance(b.id)
    await batches.cancel(b.id, ALICE)
    await runner.advance(b.id)
    done = await batches.get(b.id, ALICE)
    assert done.status == "cancelled" and done.error_file_id is not None
    out = await batches.files.get(done.error_file_id, ALICE)
    assert out.purpose == "batch_output" and out.expires_at == out.created_at + 7200
    with pytest.raises(ValidationError, match="seconds"):
        BatchCreate(input_file_id=f.id, endpoint=CHAT, completion_window="24h",
                    output_expires_after={"anchor": "created_at", "seconds": 60})
