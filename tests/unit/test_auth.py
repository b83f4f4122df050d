"""API key parsing and lookup, without any server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from starlette.requests import Request

from inferq.api.admission import check_idempotency_key, fingerprint
from inferq.api.auth import KeyRing, KeySpec, Principal, key_id
from inferq.shared.errors import InvalidRequest, Unauthenticated
from inferq.shared.settings import Settings


def conn(auth: bytes | None = None, query: bytes = b"") -> Request:
    headers = [(b"authorization", auth)] if auth is not None else []
    return Request({"type": "http", "headers": headers, "query_string": query, "client": ("10.0.0.1", 5)})


def test_keys_from_env_and_file(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# comment\n\nsk-file   ops team\nsk-bare\n")
    ring = KeyRing.from_settings(Settings(api_keys=" sk-a, ,sk-b ", api_keys_file=f))
    assert ring.enabled
    for key, name in (("sk-a", None), ("sk-b", None), ("sk-file", "ops team"), ("sk-bare", None)):
        found = ring.lookup(key)
        assert found is not None and found.id == key_id(key) and found.name == name
    assert ring.lookup("sk-") is None and ring.lookup("sk-a ") is None
    assert "sk-a" not in repr(Settings(api_keys="sk-a"))  # a secret: never printed


def test_key_id_is_a_sha256_prefix() -> None:
    assert key_id("sk-a") == "key-" + hashlib.sha256(b"sk-a").hexdigest()[:16]


@pytest.mark.parametrize(("auth", "query", "ok"), [
    (b"Bearer sk-a", b"", True), (b"bearer \t sk-a ", b"", True), (None, b"", False),
    (b"Bearer", b"", False), (b"Basic sk-a", b"", False), (b"Bearer sk-x", b"", False),
    (b"Bearer \xe9\xff", b"", False), (None, b"api_key=sk-a", None),
])
def test_bearer_header(auth: bytes | None, query: bytes, ok: bool | None) -> None:
    ring = KeyRing({"sk-a": KeySpec()})
    for allow_query in (False, True):
        expect = ok if ok is not None else allow_query  # ?api_key= only where allowed (WebSockets)
        if expect:
            assert ring.authenticate(conn(auth, query), allow_query=allow_query).key_id == key_id("sk-a")
        else:
            with pytest.raises(Unauthenticated):
                ring.authenticate(conn(auth, query), allow_query=allow_query)


def test_auth_off_is_anonymous_per_ip() -> None:
    p = KeyRing({}).authenticate(conn(b"Bearer whatever"))
    assert p == Principal(None, None, "10.0.0.1") and p.subject == "ip:10.0.0.1"
    assert p.may_see(None) and p.may_see("key-1")
    owner = Principal("key-1", None, "10.0.0.1")
    assert owner.subject == "key-1" and owner.may_see("key-1")
    assert not owner.may_see("key-2") and not owner.may_see(None)


def test_idempotency_key_format_and_fingerprint() -> None:
    assert check_idempotency_key("a" * 255) == "a" * 255
    for bad in ("", "a" * 256, "é", "a\nb"):
        with pytest.raises(InvalidRequest):
            check_idempotency_key(bad)
    assert fingerprint("jobs", {"a": 1, "b": 2}) == fingerprint("jobs", {"b": 2, "a": 1})
    assert fingerprint("jobs", {"a": 1}) != fingerprint("chat", {"a": 1})
