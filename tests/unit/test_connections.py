"""The uvicorn options the gateway is started with (api/connections.py); what they do is tested
against a real gateway process in tests/integration/test_slow_clients.py."""

from __future__ import annotations

import pickle

from inferq.api.connections import GatewayHttp, GatewayWebSocket, HeadLimits, uvicorn_options
from inferq.shared.settings import Settings


def test_the_protocols_carry_the_settings_and_pickle_for_worker_processes() -> None:
    """``inferq api --workers N`` hands uvicorn's config to N spawned processes."""
    options = uvicorn_options(Settings(http_header_timeout_s=3, http_max_header_bytes=20_000, http_keep_alive_s=7))
    back = pickle.loads(pickle.dumps(options))
    assert back["http"].func is GatewayHttp and back["http"].keywords == {"limits": HeadLimits(3, 20_000)}
    assert back["ws"] is GatewayWebSocket and back["timeout_keep_alive"] == 7


def test_the_defaults() -> None:
    s = Settings()
    assert (s.http_header_timeout_s, s.http_body_timeout_s, s.http_max_header_bytes, s.http_keep_alive_s) == \
        (10, 30, 16 * 1024, 75)


def test_idle_connections_outlive_common_clients_keep_alive() -> None:
    """A server that closes an idle connection no later than its client gives up on it races the
    client's next request on it: the request fails ("Server disconnected without sending a
    response"). httpx (and the openai SDK on it) keeps idle connections 5 s, aiohttp 15 s; the
    gateway keeps them longer, and longer than a load balancer's common idle timeout (60 s)."""
    import httpx

    keep = Settings().http_keep_alive_s
    assert keep > httpx.Limits().keepalive_expiry and keep > 15 and keep > 60
