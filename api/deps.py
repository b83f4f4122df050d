"""FastAPI dependencies: the process-wide objects the lifespan creates, typed for routes.

Each is ``async def``: FastAPI runs a plain ``def`` dependency in its thread pool, a thread
hand-off per dependency per request (four for a WebSocket job) for what is an attribute read."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request, WebSocket
from starlette.requests import HTTPConnection

from inferq.api.admission import Admission
from inferq.api.auth import KeyRing, Principal
from inferq.api.batches.files import FileStore
from inferq.api.batches.service import BatchService
from inferq.api.embed_coalesce import EmbedCoalescer
from inferq.api.service import JobService
from inferq.api.streams import StreamHub
from inferq.shared.errors import Unauthenticated


async def get_service(conn: HTTPConnection) -> JobService:
    return conn.app.state.service


async def get_hub(conn: HTTPConnection) -> StreamHub:
    return conn.app.state.hub


async def get_admission(conn: HTTPConnection) -> Admission:
    return conn.app.state.admission


async def get_embed(conn: HTTPConnection) -> EmbedCoalescer:
    return conn.app.state.embed


async def get_caller(conn: HTTPConnection) -> Principal:
    """The authenticated caller; 401 (``authentication_error``) when auth is on and the key is bad."""
    keyring: KeyRing = conn.app.state.keyring
    return keyring.authenticate(conn)


async def get_ws_caller(ws: WebSocket) -> Principal | Unauthenticated:
    """For WebSockets, which must be accepted before they can be told why: the caller, or the
    error to send (the key may also come as ``?api_key=``)."""
    keyring: KeyRing = ws.app.state.keyring
    try:
        return keyring.authenticate(ws, allow_query=True)
    except Unauthenticated as e:
        return e


Service = Annotated[JobService, Depends(get_service)]
Admit = Annotated[Admission, Depends(get_admission)]
Caller = Annotated[Principal, Depends(get_caller)]
WsCaller = Annotated[Principal | Unauthenticated, Depends(get_ws_caller)]
Hub = Annotated[StreamHub, Depends(get_hub)]
Embed = Annotated[EmbedCoalescer, Depends(get_embed)]
#: The ``Idempotency-Key`` header of the OpenAI routes: a repeat answers from the same jobs.
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


async def get_files(conn: HTTPConnection) -> FileStore:
    return conn.app.state.files


async def get_batches(conn: HTTPConnection) -> BatchService:
    return conn.app.state.batches


Files = Annotated[FileStore, Depends(get_files)]
Batches = Annotated[BatchService, Depends(get_batches)]
__all__ = ["Service", "Hub", "Request", "Admit", "Caller", "WsCaller", "Principal", "Files", "Batches",
           "IdempotencyKey", "Embed"]
