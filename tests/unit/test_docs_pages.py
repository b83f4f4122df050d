"""The API's browser docs (``/docs``, Swagger UI; ``/redoc``) load every script, style and icon from
the gateway itself, never from a CDN, so they work offline. (tests/integration/test_console.py
renders them in a headless Chromium, which reaches nothing outside this machine.)"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from inferq.api.app import create_app
from inferq.shared.settings import Settings

#: No Redis needed: the pages are static, and the app's lifespan (which opens Redis) is not entered.
NO_REDIS = "redis://127.0.0.1:9/0"
ASSET = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
#: Each page's assets by media type, with a string each holds near its start.
EXPECTED = {
    "/docs": {"text/javascript": "SwaggerUIBundle", "text/css": ".swagger-ui", "image/png": "PNG"},
    "/redoc": {"text/javascript": "Redoc", "image/png": "PNG"},
}


@pytest.fixture(scope="module")
def gateway() -> TestClient:
    return TestClient(create_app(Settings(redis_url=NO_REDIS)))


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_only_local_assets(gateway: TestClient, page: str) -> None:
    html = gateway.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert "://" not in html.text, "an absolute URL: another origin"
    assert "'/openapi.json'" in html.text or '"/openapi.json"' in html.text
    urls = ASSET.findall(html.text)
    assert {u.rsplit(".", 1)[-1] for u in urls} >= ({"js", "css", "png"} if page == "/docs" else {"js", "png"})
    seen = set()
    for url in urls:
        assert url.startswith("/docs/assets/"), url
        r = gateway.get(url)
        assert r.status_code == 200, url
        media = r.headers["content-type"].split(";")[0]
        assert EXPECTED[page][media].encode() in r.content[:4096], url
        assert len(r.content) > (100_000 if media != "image/png" else 100), url  # the real file, not a stub
        seen.add(media)
    assert seen == set(EXPECTED[page])


def test_swagger_ui_asks_no_online_validator(gateway: TestClient) -> None:
    assert '"validatorUrl": null' in gateway.get("/docs").text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_pages_may_load_nothing_from_elsewhere(gateway: TestClient, page: str) -> None:
    policy = gateway.get(page).headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy


def test_only_the_listed_assets_are_served(gateway: TestClient) -> None:
    for path in ("/docs/assets/nothing.js", "/docs/assets/..%2F__init__.py", "/docs/assets/", "/docs/oauth2-redirect"):
        assert gateway.get(path).status_code == 404, path
    paths = gateway.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc"))]


def test_with_api_keys_the_docs_are_off() -> None:
    keyed = TestClient(create_app(Settings(redis_url=NO_REDIS, api_keys="sk-docs")))
    for path in ("/docs", "/redoc", "/docs/assets/swagger-ui-bundle.js"):
        assert keyed.get(path).status_code == 404, path
