"""API keys in query strings never reach a log line, whatever spelling of ``api_key`` the client
used: the gateway decodes query names (``api%5Fkey`` is ``api_key``), so the logs hide the value of
every parameter whose decoded name is ``api_key``, in any case, and of every name a client may have
sent a key under by mistake (``api+key``, ``api_key[]``, ``token``: shared/logs.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from uvicorn.logging import AccessFormatter, DefaultFormatter

from inferq.shared import logs
from inferq.shared.settings import Settings

SECRET = "sk-Secret_123"
KEY_NAMES = ["api_key", "api%5Fkey", "api%5fkey", "%61pi_key", "%61%70%69%5F%6B%65%79", "API_KEY", "Api_Key",
             "api%5FKEY", "api_key+", "+api_key",
             # misspelled: the gateway does not read a key there, but a client sent one all the same
             "api+key", "api_key%00", "api_key[]", "api%255Fkey", "api%25255Fkey", "api_keys", "xapi_key", "api-key",
             "key", "api%5Fkey2", "apikey", "token", "access_token", "client_SECRET", "password", "auth"]
OTHER_NAMES = ["after", "model", "n", "api", "user", "stream"]


@pytest.fixture
def captured() -> Iterator[dict[str, io.StringIO]]:
    """What uvicorn's access and error loggers and a JSON root-style handler write, formatted as
    the gateway formats them, with the gateway's redaction installed and only it: a library
    imported earlier in the same process (litellm, by the frameworks test) adds its own filters to
    uvicorn's loggers, which rewrite the same lines their own way."""
    foreign = {}
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        log = logging.getLogger(name)
        foreign[name] = [f for f in log.filters if not isinstance(f, logs.RedactKeys)]
        for f in foreign[name]:
            log.removeFilter(f)
    logs.redact_keys()
    out = {"uvicorn.access": io.StringIO(), "uvicorn.error": io.StringIO(), "inferq.test.urls": io.StringIO()}
    formats = {"uvicorn.access": AccessFormatter('%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
                                                 use_colors=False),
               "uvicorn.error": DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False),
               "inferq.test.urls": logs.formatter("json")}
    added = []
    for name, stream in out.items():
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formats[name])
        if name == "inferq.test.urls":  # what logs.setup puts on the root handler
            handler.addFilter(logs.RedactKeys())
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        added.append((log, handler, log.propagate))
        log.propagate = False
    yield out
    for log, handler, propagate in added:
        log.removeHandler(handler)
        log.propagate = propagate
    for name, filters in foreign.items():
        for f in filters:
            logging.getLogger(name).addFilter(f)


@pytest.mark.parametrize("name", KEY_NAMES)
def test_every_spelling_of_api_key_is_hidden_in_access_and_socket_lines(captured, name: str) -> None:
    query = f"after=3&{name}={SECRET}&model=m%3D1"
    # as uvicorn logs an HTTP request and a WebSocket (uvicorn/protocols/...: get_path_with_query_string)
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", f"/v1/queue?{query}",
                                             "1.1", 401)
    logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" [accepted]', "127.0.0.1:6", f"/v1/generate?{query}")
    logging.getLogger("inferq.test.urls").warning("fetched %s", f"http://h/x?{query}")
    access, error = captured["uvicorn.access"].getvalue(), captured["uvicorn.error"].getvalue()
    line = json.loads(captured["inferq.test.urls"].getvalue())["message"]
    for text in (access, error, line):
        assert SECRET not in text and "Secret" not in text, text
        assert f"after=3&{name}=***&model=m%3D1" in text, text
    assert access.strip() == (f'INFO:     127.0.0.1:5 - "GET /v1/queue?after=3&{name}=***&model=m%3D1 HTTP/1.1" '
                              "401 Unauthorized")
    assert error.strip() == (f'INFO:     127.0.0.1:6 - "WebSocket /v1/generate?after=3&{name}=***&model=m%3D1" '
                             "[accepted]")


@pytest.mark.parametrize("name", OTHER_NAMES)
def test_other_parameters_are_left_as_they_are(captured, name: str) -> None:
    path = f"/v1/queue?{name}=visible&after=2"
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 200)
    assert f'"GET {path} HTTP/1.1" 200' in captured["uvicorn.access"].getvalue()


def test_a_key_whose_value_holds_quotes_or_semicolons_is_hidden_whole(captured) -> None:
    for value in ('ab"cd', "ab;cd", "ab'cd=ef"):
        logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" [accepted]', "c", f"/x?api%5Fkey={value}")
    text = captured["uvicorn.error"].getvalue()
    assert "cd" not in text and text.count('"WebSocket /x?api%5Fkey=***" [accepted]') == 3, text


def test_a_key_inside_other_arguments_is_hidden(captured) -> None:
    """uvicorn's trace lines print the whole ASGI scope (a dict); its query string holds the key."""
    scope = {"type": "websocket", "path": "/v1/generate", "query_string": f"%61pi_key={SECRET}".encode()}
    logging.getLogger("uvicorn.error").info("%s [%d] Started scope=%s", "ASGI", 1, scope)
    text = captured["uvicorn.error"].getvalue()
    assert SECRET not in text and "%61pi_key=***" in text and "Started scope=" in text


def test_the_root_handler_of_a_process_hides_keys(monkeypatch, capsys) -> None:
    """Every line a gateway or worker logs through its own root handler, not only uvicorn's."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logs, "_process", {})
    logs.setup(Settings(log_format="json"), "gateway")
    logging.getLogger("inferq.test.anywhere").warning("proxy said %s", f"GET /v1/generate?API%5Fkey={SECRET}")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "proxy said GET /v1/generate?API%5Fkey=***"
