"""Every Redis key, channel and Celery queue name inferq uses, in one place.

Layout (``{id}`` is the job id, which is also the Celery task id and the vLLM request id):

==============================  ========  ==========================================================
key                             type      holds
==============================  ========  ==========================================================
inferq:job:{id}                 hash      the job record (:class:`shared.schemas.JobRecord` fields)
inferq:job:{id}:log             stream    every stream event of the job, in ``seq`` order (replay)
inferq:job:{id}:chan            pub/sub   the same events, live
inferq:control                  pub/sub   control messages to all workers (cancel)
inferq:workers:{model}          zset      worker id -> last heartbeat (unix s); the reaper removes dead ones
inferq:worker:{wid}             string    the worker's :class:`shared.schemas.WorkerInfo` (TTL)
inferq:worker:{wid}:jobs        set       ids of the jobs the worker is running (for the reaper)
inferq:tokenizer:{digest}       hash      a model's tokenizer as a worker published it for gateways
                                          (``tokenizer``, ``config``, ``chat_template``; TTL, kept by
                                          the heartbeats of the workers that name it)
inferq:reaper                   string    lock: one worker at a time looks for dead workers (TTL)
inferq:queued                   zset      queued job ids -> time queued (the reaper finds lost messages)
inferq:unsent                   zset      ids of jobs handed back whose new message is not known to be sent
                                          -> time requeued (the reaper's sweep sends it)
inferq:stats                    hash      cluster-wide counters (jobs ended by model, status and code;
                                          redeliveries; reaped workers; submissions): /metrics
inferq:models                   zset      served model name -> last heartbeat (unix s); never pruned:
                                          readers keep only models seen within worker_ttl_s
inferq:adapters                 hash      LoRA adapter name -> its :class:`shared.schemas.AdapterInfo` (JSON)
inferq:adapter-ids              string    counter: the last adapter id given out (ids are unique in the fleet)
inferq:control:adapters         pub/sub   adapter loads and unloads for a model's workers
inferq:adapter-reply:{nonce}    list      workers' answers to one run-time load (TTL)
inferq.q.{model}[:{p}]          list      the model's Celery queue, one list per priority p (kombu)
inferq.q.{model}.w.{wid}[:{p}]  list      the worker's lane: jobs other workers of the model passed to it because it
                                          holds their prompt's prefix or adapter (only it consumes it)
inferq:load:{model}             hash      worker id -> the jobs it runs right now (cache-affine pull's loads)
inferq:kv:{model}:{hash}        zset      engines holding the prompt prefix whose last block hashes to {hash}
                                          -> the time the entry lapses (cache-affine pull's index; TTL)
inferq:lora-demand:{model}:{w}  hash      adapter -> jobs taken for it in demand window {w} (adapter homes; TTL)
inferq:affinity:{model}         string    cache-affine pull switched at run time: 'off' or 'prefix' (absent:
                                          each worker's INFERQ_AFFINITY)
inferq:cancelled:{list}         zset      job ids cancelled while queued whose message is still in the
                                          list -> cancel time: not counted in the queue's depth (TTL)
inferq:fair:{list}              zset      job ids whose message waits in the list -> virtual finish tag
                                          (fair share between keys: shared/fairshare.py; TTL)
inferq:fair:{list}:state        hash      ``v``: the virtual time (the tag last claimed); ``t|{tenant}``:
                                          the tenant's last finish tag (TTL)
inferq:fair:{list}:queued       hash      tenant -> its jobs queued in the list, not yet taken (TTL)
inferq:waiting:{model}          pub/sub   an interactive job of a tenant with few queued: workers make room for it
                                          (running-slot fair share, worker/jobs/room.py)
inferq:room:{model}:{tenant}    string    rooms workers made for a waiting tenant (jobs handed back) that no claim
                                          of its jobs has used yet (TTL)
inferq:standby:{model}          zset      multi-model worker id -> last heartbeat: workers that hold the model
                                          asleep (or not started yet) and can wake it
inferq:swappers                 zset      multi-model worker id -> last heartbeat
inferq:swapper:{sid}            string    the multi-model worker's :class:`shared.schemas.SwapperInfo` (TTL)
inferq:waking:{model}           string    the multi-model worker waking the model now (TTL): no other one swaps
                                          to it meanwhile
inferq:swap-stats               hash      swaps by the model woken: ``n|{model}``, ``nms|{model}`` (their
                                          durations' sum, ms), ``le|{model}|{bound}`` (those within bound s);
                                          first starts: ``cold|{model}``, ``coldms|{model}``: /metrics
unacked, unacked_index          hash,zset kombu's delivered-but-unacked messages (the reaper sweeps)
inferq:rate:{subject}           zset      submission times of the last minute (sliding window; TTL)
inferq:active:{subject}         zset      the subject's unfinished job ids -> submit time (TTL)
inferq:idem:{subject}:{hash}    string    an Idempotency-Key's request fingerprint and job ids (TTL)
inferq:file:{id}                hash      a file's metadata (``meta``) and owner; ``content`` when the
                                          contents live in Redis (else INFERQ_FILES_DIR/{id})
inferq:files:{owner}            zset      the owner's file ids -> created_at (listing)
inferq:batch:{id}               hash      a batch: ``record`` (api.batches.schemas.BatchRecord JSON),
                                          ``cancel`` (time a cancel was asked)
inferq:batch:{id}:lines         list      the validated request lines, until the batch ends
inferq:batch:{id}:running       hash      line index -> ids of its unfinished jobs (JSON list)
inferq:batch:{id}:results       hash      line index -> its output or error line
inferq:batch:{id}:lease         string    the gateway advancing the batch (TTL: batch_lease_s)
inferq:batches:{owner}          zset      the owner's batch ids -> created_at (listing)
inferq:batches:active           set       batches not yet ended: what gateways advance
==============================  ========  ==========================================================
"""

from __future__ import annotations

import re

PREFIX = "inferq"
#: A job id: ``job-`` and 32 lowercase hex digits (128 random bits). Routes check an id against it
#: before it reaches Redis: anything else names no job (``404 job_not_found``, as an unknown id).
JOB_ID_PATTERN = r"job-[0-9a-f]{32}"
_JOB_ID = re.compile(JOB_ID_PATTERN)
#: What a client may send as a model name: it becomes part of Redis key and queue names, so no
#: ``:`` (the separator of keys and of a queue's priority lists), no spaces, no glob characters.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9._/@+-]+$"
#: The longest model name (a client's ``model``, an operator's INFERQ_SERVED_MODEL_NAME).
MODEL_NAME_MAX_LEN = 256
CONTROL_CHANNEL = f"{PREFIX}:control"
#: pub/sub: a model's name, when a job is queued for it and no worker holds it awake (the gateway's
#: ``loading`` event): multi-model workers that hold it asleep read their demand at once
WANTED_CHANNEL = f"{PREFIX}:wanted"
ADAPTERS = f"{PREFIX}:adapters"
#: counter: the last LoRA adapter id given out (shared/adapters.py)
ADAPTER_IDS = f"{PREFIX}:adapter-ids"
ADAPTER_CHANNEL = f"{PREFIX}:control:adapters"
MODELS = f"{PREFIX}:models"
#: hash: cluster-wide counters, one field per (kind, labels): see :func:`stat`.
STATS = f"{PREFIX}:stats"
STAT_SEP = "|"  # never in a model name (MODEL_NAME_PATTERN), a status, a code or a reason
REAPER_LOCK = f"{PREFIX}:reaper"
#: zset: queued job id -> time it was (re)queued; the reaper re-sends one whose message was lost.
QUEUED = f"{PREFIX}:queued"
#: zset: id of a job handed back -> time it was requeued, until its new message is sent; the
#: reaper sends the message of one left there (its sender failed or died).
UNSENT = f"{PREFIX}:unsent"
#: kombu's Redis transport keeps delivered-but-unacked messages here (its defaults).
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"
TASK_NAME = "inferq.generate"
#: Job priorities, 0 (most urgent) .. 9; kombu keeps one Redis list per priority.
PRIORITIES = range(10)
PRIORITY_SEP = ":"


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the form of a job id (:data:`JOB_ID_PATTERN`)."""
    return _JOB_ID.fullmatch(value) is not None


def job(job_id: str) -> str:
    """The job record hash; lives ``Settings.job_ttl_s``."""
    return f"{PREFIX}:job:{job_id}"


def job_log(job_id: str) -> str:
    """The job's event log (a Redis stream); lives as long as the record."""
    return f"{PREFIX}:job:{job_id}:log"


def job_channel(job_id: str) -> str:
    """The pub/sub channel the job's events are published on."""
    return f"{PREFIX}:job:{job_id}:chan"


def workers(model: str) -> str:
    """Sorted set of the model's workers, scored by last heartbeat time."""
    return f"{PREFIX}:workers:{model}"


def worker(worker_id: str) -> str:
    """The worker's self-description and engine stats; expires ``Settings.worker_ttl_s``."""
    return f"{PREFIX}:worker:{worker_id}"


def tokenizer_files(digest: str) -> str:
    """A model's tokenizer as a worker published it for gateways (a hash; worker/engine/tokenizer_files.py),
    named by the files' digest."""
    return f"{PREFIX}:tokenizer:{digest}"


def queue(model: str) -> str:
    """The Celery queue that feeds the model's workers."""
    return f"{PREFIX}.q.{model}"


def queue_lists(model: str) -> list[str]:
    """The Redis lists holding the queue's messages, one per priority (kombu's naming)."""
    return priority_lists(queue(model))


LANE_SEP = ".w."


def lane(model: str, worker_id: str) -> str:
    """The worker's lane: a Celery queue of the model's jobs that only that worker consumes."""
    return f"{queue(model)}{LANE_SEP}{worker_id}"


def is_lane(q: str) -> bool:
    """Whether Celery queue ``q`` is a worker's lane (:func:`lane`), not a model's queue."""
    return LANE_SEP in q


def priority_lists(q: str) -> list[str]:
    """The Redis lists of Celery queue ``q``, one per priority (kombu's naming)."""
    return [q if p == 0 else f"{q}{PRIORITY_SEP}{p}" for p in PRIORITIES]


def worker_loads(model: str) -> str:
    """Worker id -> the jobs it runs (taken, not passed on, not ended), as it last wrote: what
    cache-affine pull compares, live (a heartbeat is up to a beat old)."""
    return f"{PREFIX}:load:{model}"


def prefix_holders(model: str, block_hash: str) -> str:
    """Sorted set: the engines that hold the prompt prefix ending with this block, each scored by
    the time its entry lapses (cache-affine pull's index, worker/jobs/prefix_index.py)."""
    return f"{PREFIX}:kv:{model}:{block_hash}"


def affinity_mode(model: str) -> str:
    """String: INFERQ_AFFINITY for the model's workers, set at run time ('off' or 'prefix'; absent:
    each worker's setting)."""
    return f"{PREFIX}:affinity:{model}"


def adapter_demand(model: str, window: int) -> str:
    """Hash: adapter name -> the jobs workers took for it in one window of ADAPTER_DEMAND_WINDOW_S
    (``window`` = its start // the window), for adapter homes (worker/jobs/homes.py)."""
    return f"{PREFIX}:lora-demand:{model}:{window}"


#: The length of one window of adapter demand (seconds); homes follow the last few.
ADAPTER_DEMAND_WINDOW_S = 10


def adapter_homes(model: str) -> str:
    """String: the model's adapter homes as a worker last planned them (an ``AdapterHomes``), which
    every worker uses while it serves the demand it reads (worker/jobs/homes.py)."""
    return f"{PREFIX}:lora-homes:{model}"


def queue_cancelled(queue_list: str) -> str:
    """Jobs cancelled while queued whose Celery message is still in ``queue_list`` (one of
    :func:`queue_lists`): the queue's depth is the list's length less these."""
    return f"{PREFIX}:cancelled:{queue_list}"


def fair_order(queue_list: str) -> str:
    """The jobs whose message waits in ``queue_list``, scored by virtual finish tag (fair share)."""
    return f"{PREFIX}:fair:{queue_list}"


def fair_state(queue_list: str) -> str:
    """The list's virtual time (``v``) and each tenant's last finish tag (``t|{tenant}``)."""
    return f"{PREFIX}:fair:{queue_list}:state"


def waiting(model: str) -> str:
    """Pub/sub: an interactive job of a tenant with few jobs queued in ``model``'s lists (its name and weight)."""
    return f"{PREFIX}:waiting:{model}"


def room(model: str, tenant: str) -> str:
    """Counter: rooms workers of ``model`` made for ``tenant`` that no claim of its jobs used yet (TTL)."""
    return f"{PREFIX}:room:{model}:{tenant}"


def fair_queued(queue_list: str) -> str:
    """Tenant -> its jobs queued in ``queue_list`` and not yet taken by a worker."""
    return f"{PREFIX}:fair:{queue_list}:queued"


#: zset: multi-model worker id -> last heartbeat (unix s).
SWAPPERS = f"{PREFIX}:swappers"
#: hash: swaps by the model woken (counts, durations' sum in ms, histogram buckets): see :func:`swap_stat`.
SWAP_STATS = f"{PREFIX}:swap-stats"
#: The bounds (seconds) of the swap-duration histogram's buckets.
SWAP_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def standby(model: str) -> str:
    """Sorted set: the multi-model workers that hold ``model`` asleep (or not yet started) and can wake
    it, scored by last heartbeat."""
    return f"{PREFIX}:standby:{model}"


def swapper(swapper_id: str) -> str:
    """A multi-model worker's self-description (:class:`shared.schemas.SwapperInfo`; TTL)."""
    return f"{PREFIX}:swapper:{swapper_id}"


def waking(model: str) -> str:
    """The multi-model worker waking ``model`` now (TTL): the others count the model as served meanwhile."""
    return f"{PREFIX}:waking:{model}"


def swap_stat(kind: str, model: str, bound: float | None = None) -> str:
    """A field of :data:`SWAP_STATS`: ``n|model``, ``nms|model``, ``le|model|bound`` (wakes of a model
    that slept), ``cold|model``, ``coldms|model`` (its first start)."""
    return STAT_SEP.join((kind, model) if bound is None else (kind, model, f"{bound:g}"))


def worker_jobs(worker_id: str) -> str:
    """Ids of the jobs a worker is running; the reaper requeues them if the worker dies."""
    return f"{PREFIX}:worker:{worker_id}:jobs"


def rate(subject: str) -> str:
    """Sliding-window log of the subject's submissions; expires a minute after the last one.

    ``subject`` is an API key's hash id, or ``ip:ADDRESS`` when auth is off."""
    return f"{PREFIX}:rate:{subject}"


def active_jobs(subject: str) -> str:
    """The subject's jobs not known to be finished, scored by submit time; expires ``job_ttl_s``."""
    return f"{PREFIX}:active:{subject}"


def idempotency(subject: str, key_hash: str) -> str:
    """One Idempotency-Key of one subject (the key itself is stored hashed); expires
    ``Settings.idempotency_ttl_s``."""
    return f"{PREFIX}:idem:{subject}:{key_hash}"


def stat(kind: str, *labels: str) -> str:
    """A field of :data:`STATS`: ``end|model|status|code``, ``requeue|model|reason``,
    ``reaped|model``, ``submitted|model``, ``served|model|tenant`` (tokens: prompt + output) or
    ``batch_line|outcome`` (shared/lua/prelude.lua's
    ``count`` builds the same)."""
    return STAT_SEP.join((kind, *labels))


#: set: the batches not yet ended; every gateway's runner looks here for work.
BATCHES_ACTIVE = f"{PREFIX}:batches:active"
#: zset: the files that expire, scored by when; every gateway's batch runner deletes those due.
FILES_EXPIRING = f"{PREFIX}:files:expiring"
#: File and batch ids: a prefix and 24 hex digits (96 random bits), as OpenAI's are prefixed.
FILE_ID_PATTERN = r"file-[0-9a-f]{24}"
BATCH_ID_PATTERN = r"batch_[0-9a-f]{24}"


def _owner(owner: str | None) -> str:
    return owner or "-"  # "-": auth is off (every caller is the same owner)


def file(file_id: str) -> str:
    """A file's metadata, owner and (without INFERQ_FILES_DIR) contents."""
    return f"{PREFIX}:file:{file_id}"


def files(owner: str | None) -> str:
    """The owner's file ids, scored by creation time."""
    return f"{PREFIX}:files:{_owner(owner)}"


def file_bytes(owner: str | None) -> str:
    """The bytes of the files the owner stores (counted against INFERQ_MAX_FILE_BYTES_PER_KEY)."""
    return f"{PREFIX}:file_bytes:{_owner(owner)}"


def batch(batch_id: str) -> str:
    """A batch's record and cancel request."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_part(batch_id: str, part: str) -> str:
    """One of a batch's working keys: ``lines``, ``running``, ``results`` or ``lease``."""
    return f"{PREFIX}:batch:{batch_id}:{part}"


def batches(owner: str | None) -> str:
    """The owner's batch ids, scored by creation time."""
    return f"{PREFIX}:batches:{_owner(owner)}"


def adapter_reply(nonce: str) -> str:
    """The list workers push their answers to one run-time adapter load onto."""
    return f"{PREFIX}:adapter-reply:{nonce}"
