"""Uploaded and batch output files: metadata in Redis; contents in Redis or in a folder.

Every file's metadata and owner sit in the hash ``keys.file(id)``, and its id in the owner's
listing. Its contents (UTF-8 text: JSONL) are the hash's ``content`` field, or, with
``INFERQ_FILES_DIR``, the file ``{files_dir}/{id}.jsonl``: a folder every gateway mounts (a
shared volume), which keeps large files out of Redis' memory. ``DELETE /v1/files/{id}`` removes
one; a file with ``expires_at`` is not found from then on, and the next batch runner's poll
deletes it (:meth:`FileStore.sweep`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

from redis.asyncio import Redis
from starlette.concurrency import run_in_threadpool

from inferq.api.auth import Principal
from inferq.api.batches.schemas import FileList, FileObject, FilePurpose
from inferq.shared import keys, lua
from inferq.shared.errors import InvalidRequest, NotFound
from inferq.shared.redis import hash_fields, texts
from inferq.shared.settings import Settings

_FILE_ID = re.compile(keys.FILE_ID_PATTERN)


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def file_not_found(file_id: str, param: str = "file_id") -> NotFound:
    return NotFound(f"no file {file_id[:80]!r}", param=param, code="file_not_found")


class FileStore:
    def __init__(self, settings: Settings, redis: Redis) -> None:
        self.redis = redis
        self.max_bytes = settings.max_file_bytes
        self.quota = settings.max_file_bytes_per_key
        self._reserve = lua.register(redis, "file_reserve")
        self._remove_script = lua.register(redis, "file_remove")
        self.ttl_s = settings.file_ttl_s  # an upload's, unless it names its own
        self.dir = settings.files_dir
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, file_id: str) -> Path:
        assert self.dir is not None
        return self.dir / f"{file_id}.jsonl"

    async def create(self, owner: str | None, purpose: FilePurpose, filename: str, data: bytes,
                     limited: bool = True, ttl_s: int | None = None) -> FileObject:
        """Keep ``data`` as a new file of ``owner``'s, for ``ttl_s`` seconds (None: until deleted);
        400 when it is too large or over the owner's quota (an upload: ``limited``), or not
        UTF-8. A batch's output is written whatever its size, and counts towards the quota."""
        if limited and len(data) > self.max_bytes:
            raise InvalidRequest(f"the file has {len(data)} bytes; at most {self.max_bytes} "
                                 "(INFERQ_MAX_FILE_BYTES)", param="file", code="file_too_large")
        try:
            text = data.decode()
        except UnicodeDecodeError as e:
            raise InvalidRequest(f"the file is not UTF-8 text (byte {e.start}); a batch input file is "
                                 "JSONL", param="file", code="invalid_file_format") from None
        await self._count(owner, len(data), limited)
        try:
            return await self._write(owner, purpose, filename, data, text, ttl_s)
        except BaseException:  # not kept after all: its bytes go back
            await self.redis.decrby(keys.file_bytes(owner), len(data))
            raise

    async def _count(self, owner: str | None, size: int, limited: bool) -> None:
        """Count ``size`` bytes against the owner's quota; an upload past it (``limited``) is refused."""
        used = int(await self._reserve(keys=[keys.file_bytes(owner)], args=[size, self.quota if limited else 0]))
        if used >= 0:
            raise InvalidRequest(f"the file has {size} bytes and this key stores {used} of at most {self.quota} "
                                 "(INFERQ_MAX_FILE_BYTES_PER_KEY); delete files to make room", param="file",
                                 code="file_quota_exceeded")

    async def _write(self, owner: str | None, purpose: FilePurpose, filename: str, data: bytes, text: str,
                     ttl_s: int | None) -> FileObject:
        now = int(time.time())
        meta = FileObject(id=new_file_id(), bytes=len(data), created_at=now, filename=filename[:255] or "file.jsonl",
                          purpose=purpose, expires_at=now + ttl_s if ttl_s else None)
        fields = {"meta": meta.model_dump_json(), "owner": json.dumps(owner), "size": str(len(data))}
        if self.dir is None:
            fields["content"] = text
        else:
            await run_in_threadpool(_write_atomically, self._path(meta.id), data)
        async with self.redis.pipeline(transaction=True) as p:
            p.hset(keys.file(meta.id), mapping=hash_fields(fields))
            p.zadd(keys.files(owner), {meta.id: time.time()})
            if meta.expires_at is not None:
                p.zadd(keys.FILES_EXPIRING, {meta.id: meta.expires_at})
            await p.execute()
        return meta

    async def get(self, file_id: str, caller: Principal, param: str = "file_id") -> FileObject:
        """The file's metadata, if ``caller`` may see it; another key's file is "not found" too
        (``param``: the request field that named the file)."""
        meta, owner = (await self.redis.hmget(keys.file(file_id), ["meta", "owner"])
                       if _FILE_ID.fullmatch(file_id) else (None, None))
        if meta is None or owner is None or not caller.may_see(json.loads(owner)):
            raise file_not_found(file_id, param)
        f = FileObject.model_validate_json(meta)
        if _expired(f):  # not yet swept
            raise file_not_found(file_id, param)
        return f

    async def content(self, file_id: str, caller: Principal) -> str:
        await self.get(file_id, caller)
        return await self.read(file_id)

    async def read(self, file_id: str) -> str:
        """The contents, whoever owns the file (for the runner: it checked ownership at create)."""
        if self.dir is None:
            text = await self.redis.hget(keys.file(file_id), "content")
            if text is None:
                raise file_not_found(file_id)
            return str(text)
        try:
            return (await run_in_threadpool(self._path(file_id).read_bytes)).decode()
        except FileNotFoundError:
            raise file_not_found(file_id) from None

    async def delete(self, file_id: str, caller: Principal) -> None:
        await self.get(file_id, caller)
        await self._remove(file_id)

    async def _remove(self, file_id: str) -> None:
        owner = json.loads(await self.redis.hget(keys.file(file_id), "owner") or "null")
        if self.dir is not None:
            await run_in_threadpool(self._path(file_id).unlink, True)
        await self._remove_script(keys=[keys.file(file_id), keys.files(owner), keys.FILES_EXPIRING,
                                        keys.file_bytes(owner)], args=[file_id])

    async def sweep(self, now: float | None = None, most: int = 100) -> int:
        """Delete up to ``most`` files whose time is up; how many (every gateway's batch runner
        calls this each poll: two that delete one file at once both succeed)."""
        due = texts(await self.redis.zrangebyscore(keys.FILES_EXPIRING, "-inf", time.time() if now is None else now,
                                                   start=0, num=most))
        for file_id in due:
            await self._remove(file_id)  # off the expiring set last: a failed delete is tried again
        return len(due)

    async def list(self, caller: Principal, purpose: str | None, limit: int, after: str | None,
                   newest_first: bool = True) -> FileList:
        """The caller's files, newest first (or oldest); ``after``: continue after that file id."""
        read = self.redis.zrevrange if newest_first else self.redis.zrange
        ids = texts(await read(keys.files(caller.key_id), 0, -1))
        if after is not None:
            ids = ids[ids.index(after) + 1:] if after in ids else []
        out: list[FileObject] = []
        for chunk in (ids[i:i + 100] for i in range(0, len(ids), 100)):
            async with self.redis.pipeline(transaction=False) as p:
                for i in chunk:
                    p.hget(keys.file(i), "meta")
                metas = await p.execute()
            found = [f for f in (FileObject.model_validate_json(m) for m in metas if m) if not _expired(f)]
            out += [f for f in found if purpose is None or f.purpose == purpose]
            if len(out) > limit:
                break
        page = out[:limit]
        return FileList(data=page, has_more=len(out) > limit,
                        first_id=page[0].id if page else None, last_id=page[-1].id if page else None)


def _expired(f: FileObject) -> bool:
    return f.expires_at is not None and f.expires_at <= time.time()


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
