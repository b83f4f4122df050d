"""API keys: who is calling.

Keys come from ``INFERQ_API_KEYS`` (comma-separated) and ``INFERQ_API_KEYS_FILE`` (one ``KEY [name]``
a line; blank lines and ``#`` comments are skipped). With no key configured, auth is off and every
caller is anonymous. The gateway never keeps or logs a raw key after start-up: a key is known by
its SHA-256 digest, compared in constant time, and identified by :func:`key_id` (a digest prefix),
which is what job records store as their ``owner``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from inferq.api.errors import to_response
from inferq.shared.errors import Unauthenticated
from inferq.shared.settings import Settings


def key_id(key: str) -> str:
    """The public identity of a key: ``key-`` and the first 16 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    key_id: str | None  # None: auth is off
    name: str | None
    ip: str

    @property
    def subject(self) -> str:
        """Whom limits and Idempotency-Keys are counted for: the key, or the client IP without auth."""
        return self.key_id or f"ip:{self.ip}"

    def may_see(self, owner: str | None) -> bool:
        """Whether a job with this ``owner`` exists for the caller (without auth: every job)."""
        return self.key_id is None or owner == self.key_id


@dataclass(frozen=True)
class _Key:
    digest: bytes
    id: str
    name: str | None


class KeyRing:
    def __init__(self, keys: dict[str, str | None]) -> None:
        """``keys`` maps each raw key to its name (or None)."""
        self._keys = [_Key(hashlib.sha256(k.encode()).digest(), key_id(k), n) for k, n in keys.items()]

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        keys: dict[str, str | None] = {}
        for k in settings.api_keys.get_secret_value().split(","):
            if k.strip():
                keys[k.strip()] = None
        if settings.api_keys_file is not None:
            keys.update(read_keys_file(settings.api_keys_file))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def lookup(self, key: str) -> _Key | None:
        """The configured key equal to ``key``; every configured key is compared, in constant time."""
        digest = hashlib.sha256(key.encode()).digest()
        found = None
        for k in self._keys:
            if hmac.compare_digest(k.digest, digest):
                found = k
        return found

    def authenticate(self, conn: HTTPConnection, *, allow_query: bool = False) -> Principal:
        """The caller of ``conn``; raises :class:`Unauthenticated` when a key is needed and not valid.

        The key is read from ``Authorization: Bearer KEY``, or (``allow_query``, for browsers'
        WebSockets, which cannot set headers) from the ``api_key`` query parameter."""
        ip = conn.client.host if conn.client else "unknown"
        if not self.enabled:
            return Principal(None, None, ip)
        scheme, *rest = conn.headers.get("authorization", "").split(None, 1) or [""]
        token = rest[0].strip() if scheme.lower() == "bearer" and rest else ""
        if not token and allow_query:
            token = conn.query_params.get("api_key", "")
        if not token:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer KEY'", code="missing_api_key")
        found = self.lookup(token)
        if found is None:
            raise Unauthenticated("invalid API key", code="invalid_api_key")
        return Principal(found.id, found.name, ip)


class KeyBeforeBody:
    """A pure ASGI middleware: a POST to one of ``paths`` (uploads: large bodies) without a valid
    key is answered 401 before any of its body is read. FastAPI reads and parses a form body before
    it resolves a route's dependencies, the key among them; the route still checks the key itself."""

    def __init__(self, app: ASGIApp, keyring: KeyRing, paths: Iterable[str]) -> None:
        self.app, self.keyring, self.paths = app, keyring, frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            try:
                self.keyring.authenticate(HTTPConnection(scope))
            except Unauthenticated as e:
                return await to_response(e)(scope, receive, send)
        await self.app(scope, receive, send)


def read_keys_file(path: Path) -> dict[str, str | None]:
    """``KEY [name]`` per line; blank lines and lines starting with ``#`` are skipped."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, *name = line.split(None, 1)
        out[key] = name[0].strip() if name else None
    return out
