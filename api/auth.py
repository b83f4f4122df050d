"""API keys: who is calling.

Keys come from ``INFERQ_API_KEYS`` (comma-separated) and ``INFERQ_API_KEYS_FILE`` (one
``KEY [name] [tenant=T] [weight=W] [priority=LO[-HI]] [class=batch] [role=operator]`` a line; blank lines
and ``#`` comments are skipped). A key's tenant (default: the key itself) and weight (default 1) set its
fair share of the queue (shared/fairshare.py); its priorities (default: the default priority and later,
5-9) are the ones its requests may ask for; ``class=batch`` makes every job of the key batch work
(docs/design.md, "Service classes"); an operator key may replace or unload any key's run-time
LoRA adapters (others only their own). With no key configured, auth is off and every caller is anonymous
(and may use every priority). The gateway never keeps or logs a raw key after start-up: a key is known by
its SHA-256 digest, compared in constant time, and identified by :func:`key_id` (a digest prefix),
which is what job records store as their ``owner``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from inferq.api.errors import to_response
from inferq.shared.errors import Unauthenticated
from inferq.shared.fairshare import TENANT_PATTERN, Share
from inferq.shared.keys import PRIORITIES
from inferq.shared.schemas import DEFAULT_PRIORITY, SERVICE_CLASSES
from inferq.shared.settings import Settings

#: The priorities a key may ask for unless its keys-file line says otherwise: the default one and
#: later. No key can put its work ahead of other keys' default-priority work without the operator's word.
DEFAULT_PRIORITIES = range(DEFAULT_PRIORITY, PRIORITIES[-1] + 1)
#: Every priority: callers without auth (one tenant, as before keys), and keys given ``priority=0-9``.
ALL_PRIORITIES = PRIORITIES


def key_id(key: str) -> str:
    """The public identity of a key: ``key-`` and the first 16 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Principal:
    """The caller of one request."""

    key_id: str | None  # None: auth is off
    name: str | None
    ip: str
    priorities: range = ALL_PRIORITIES  # those its requests may ask for
    operator_key: bool = False  # the keys file's ``operator`` option
    batch_only: bool = False  # the keys file's ``class=batch``: its jobs are batch work

    @property
    def operator(self) -> bool:
        """Whether it may manage what any key made (run-time LoRA adapters): an operator key, or
        any caller without auth."""
        return self.key_id is None or self.operator_key

    @property
    def subject(self) -> str:
        """Whom limits and Idempotency-Keys are counted for: the key, or the client IP without auth."""
        return self.key_id or f"ip:{self.ip}"

    def may_see(self, owner: str | None) -> bool:
        """Whether a job with this ``owner`` exists for the caller (without auth: every job)."""
        return self.key_id is None or owner == self.key_id


@dataclass(frozen=True)
class KeySpec:
    """What the keys file says of a key besides the key."""

    name: str | None = None
    tenant: str | None = None  # None: the key is a tenant of its own
    weight: float = 1.0
    priorities: range = DEFAULT_PRIORITIES
    operator: bool = False  # role=operator: may manage what any key made (run-time LoRA adapters)
    batch_only: bool = False  # class=batch: every job of the key is batch work


@dataclass(frozen=True)
class _Key:
    digest: bytes
    id: str
    name: str | None
    share: Share
    priorities: range
    operator: bool
    batch_only: bool


class KeyRing:
    def __init__(self, keys: dict[str, KeySpec]) -> None:
        """``keys`` maps each raw key to what the keys file says of it."""
        self._keys = [_Key(hashlib.sha256(k.encode()).digest(), key_id(k), spec.name,
                           Share(spec.tenant or key_id(k), spec.weight), spec.priorities, spec.operator,
                           spec.batch_only)
                      for k, spec in keys.items()]
        self._shares = {k.id: k.share for k in self._keys}

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        keys: dict[str, KeySpec] = {}
        for k in settings.api_keys.get_secret_value().split(","):
            if k.strip():
                keys[k.strip()] = KeySpec()
        if settings.api_keys_file is not None:
            keys.update(read_keys_file(settings.api_keys_file))
        return cls(keys)

    def share(self, owner: str | None) -> Share:
        """The fair share of the jobs of key ``owner`` (a :func:`key_id`; None: auth is off)."""
        return self._shares.get(owner or "", Share())

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
        return Principal(found.id, found.name, ip, found.priorities, found.operator, found.batch_only)


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


def read_keys_file(path: Path) -> dict[str, KeySpec]:
    """``KEY [name] [tenant=T] [weight=W] [priority=LO[-HI]] [class=batch] [role=operator]`` per line; blank
    lines and lines starting with ``#`` are skipped. A bad option is a ValueError naming its line (never the key)."""
    out: dict[str, KeySpec] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, *rest = line.split()
        words, options = list(rest), {}
        while words and (m := _OPTION.fullmatch(words[-1])):
            options[m[1]] = m[2]
            words.pop()
        where = f"{path}, line {number}"
        out[key] = KeySpec(" ".join(words) or None, *_options(options, where), _priorities(options, where),
                           _operator(options, where), _batch_only(options, where))
    return out


_OPTION = re.compile(r"(tenant|weight|priority|class|role)=(\S*)")


def _batch_only(options: dict[str, str], where: str) -> bool:
    """``class=batch``: every job of the key is batch work; ``class=interactive`` (the default): its
    requests choose."""
    value = options.get("class", "interactive")
    if value not in SERVICE_CLASSES:
        raise ValueError(f"{where}: class= must be one of {', '.join(SERVICE_CLASSES)}")
    return value == "batch"


def _operator(options: dict[str, str], where: str) -> bool:
    """``role=operator``: the key may manage what any key made; ``role=user`` (the default): its own."""
    role = options.get("role", "user")
    if role not in ("user", "operator"):
        raise ValueError(f"{where}: role= must be user or operator")
    return role == "operator"


def _priorities(options: dict[str, str], where: str) -> range:
    """``priority=LO``: LO and every later priority (LO-9); ``priority=LO-HI``: those alone."""
    value = options.get("priority")
    if value is None:
        return DEFAULT_PRIORITIES
    m = re.fullmatch(r"(\d)(?:-(\d))?", value)
    low, high = (int(m[1]), int(m[2] or ALL_PRIORITIES[-1])) if m else (1, 0)
    if low > high:
        raise ValueError(f"{where}: priority= must be LO or LO-HI, priorities from {ALL_PRIORITIES[0]} (first) "
                         f"to {ALL_PRIORITIES[-1]} (last), LO <= HI")
    return range(low, high + 1)


def _options(options: dict[str, str], where: str) -> tuple[str | None, float]:
    tenant = options.get("tenant")
    if tenant is not None and not TENANT_PATTERN.fullmatch(tenant):
        raise ValueError(f"{where}: tenant= must be 1 to 64 letters, digits and ._:@- (starting with a "
                         "letter or digit)")
    try:
        weight = float(options.get("weight", "1"))
    except ValueError:
        weight = float("nan")
    if not 0.01 <= weight <= 1000:  # also refuses nan
        raise ValueError(f"{where}: weight= must be a number from 0.01 to 1000")
    return tenant, weight
