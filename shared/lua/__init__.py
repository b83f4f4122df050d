"""Every Lua script inferq runs in Redis, one ``.lua`` file each in this folder.

Each script is the file's text after a header: ``STATUS`` (each :class:`JobStatus` as the job hash
stores it, a JSON string) and ``STATUS_TERMINAL``, written from the enum, then ``prelude.lua``'s
helpers (counters, the last seq of a log, completing and logging an event the caller made).
Scripts never spell a status or build an error or event object of their own: the caller passes
events in, as JSON (:func:`event_json`), and a script fills in what only it knows (the seq, a
number in a message's ``{placeholder}``).

Scripts: ``job_*`` (a job's record, log and channel: shared/store.py), ``worker_*`` and ``lock_*``
(the heartbeat, the reaper, idempotency keys), ``rate``/``reserve`` (admission), ``queue_oldest``
(queue metrics), ``batch_*`` (the batch runner).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from inferq.shared.schemas import TERMINAL_STATUSES, DoneEvent, ErrorEvent, JobStatus, LoadingEvent, RestartEvent


def _lua_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _header() -> str:
    stored = {s.value: json.dumps(s.value) for s in JobStatus}  # as hash_fields() stores a status
    statuses = ", ".join(f"{name} = {_lua_string(v)}" for name, v in stored.items())
    terminal = ", ".join(_lua_string(stored[str(s)]) for s in sorted(TERMINAL_STATUSES))
    return f"local STATUS = {{{statuses}}}\nlocal STATUS_TERMINAL = {{{terminal}}}\n"


@cache
def source(name: str) -> str:
    """The full text of script ``name`` (its file without ``.lua``), header and prelude first."""
    folder = resources.files(__package__)
    body = (folder / f"{name}.lua").read_text()
    return _header() + (folder / "prelude.lua").read_text() + body


def register(redis: Redis, name: str) -> AsyncScript:
    """Script ``name`` on ``redis`` (sent by hash, loaded again when Redis has lost it)."""
    return redis.register_script(source(name))


def names() -> list[str]:
    """Every script in the folder."""
    return sorted(p.name.removesuffix(".lua") for p in resources.files(__package__).iterdir()
                  if p.name.endswith(".lua") and p.name != "prelude.lua")


def event_json(event: DoneEvent | ErrorEvent | RestartEvent | LoadingEvent) -> str:
    """An event for a script to complete and log (its ``seq`` set there): the fields given, compact."""
    fields = event.model_dump(mode="json", exclude_unset=True, exclude_none=True)
    return json.dumps({"type": event.type, **fields}, separators=(",", ":"))
