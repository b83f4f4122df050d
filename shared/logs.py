"""Logging for every inferq process: plain lines (the default) or JSON, one object per line.

``INFERQ_LOG_FORMAT=json`` turns on JSON (python-json-logger). Every line then carries the
process's ``component`` (gateway, worker) and, where known, ``worker_id`` and ``model``; a line
logged while a job is being handled carries its ``job_id`` too. The job comes from a context
variable (:func:`job_context`) that asyncio copies into every task a job's coroutine starts, so a
log call needs no ``extra=``; an explicit ``extra={"job_id": ...}`` wins over it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from urllib.parse import unquote_plus

from pythonjsonlogger.json import JsonFormatter

from inferq.shared.settings import Settings

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The job a log line is about (set around the code that handles one job).
current_job: ContextVar[str | None] = ContextVar("inferq_job", default=None)
#: Fields every line of this process carries (component, worker_id, model), set once known.
_process: dict[str, str] = {}


class JobFields(logging.Filter):
    """Adds ``job_id`` (from :data:`current_job`) and the process's fields to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            record.job_id = current_job.get()
        for k, v in _process.items():
            if getattr(record, k, None) is None:
                setattr(record, k, v)
        return True


#: A query parameter as it appears in a URL or a log line: a name, ``=``, and a value that ends at
#: ``&``, whitespace, ``#``, or a quote closing the text around it (a quote inside the value is kept)
_PARAM = re.compile(r"""([^\s?&=#"'/]+)=((?:[^&\s#"']|["'](?=\S))*)""")
#: Arguments a line's parameters may hold a key in and :func:`hide_keys` can edit one by one
_PLAIN = (str, int, float, type(None))


#: Words that make a query parameter's name a secret's (:func:`_is_key_name`)
_SECRET_WORDS = ("key", "token", "secret", "passw", "auth", "credential", "signature")


def _is_key_name(name: str) -> bool:
    """Whether a query parameter's name may hold a secret: ``api_key`` as the gateway decodes it
    (``%XX``, ``+``), and every misspelling of it or another credential's name a client may send a
    key under (``api+key``, ``api_key%00``, ``api_key[]``, ``api%255Fkey`` encoded twice, ``apikey``,
    ``token``): decoded until it no longer changes, in any case, its letters and digits hold one
    of :data:`_SECRET_WORDS`. The gateway refuses such a key, but it must not reach a log either."""
    for _ in range(4):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    flat = re.sub(r"[\W_]+", "", name.casefold())
    return any(word in flat for word in _SECRET_WORDS)


def hide_keys(text: str) -> str:
    """``text`` with the value of every query parameter whose name may hold a secret
    (:func:`_is_key_name`) as ``***``."""
    if "=" not in text:
        return text
    return _PARAM.sub(lambda m: f"{m[1]}=***" if _is_key_name(m[1]) else m[0], text)


class RedactKeys(logging.Filter):
    """Hides API keys given in query strings (``?api_key=``, however spelled): a WebSocket client
    (the browser console) may send its key there, and uvicorn's access and socket lines print the
    query. Plain arguments are edited in place (uvicorn's access formatter reads them one by one);
    a line with other arguments (a dict) is formatted first."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(record.msg, str) and isinstance(args, tuple) and all(isinstance(a, _PLAIN) for a in args):
            record.args = tuple(hide_keys(a) if isinstance(a, str) else a for a in args)
            record.msg = hide_keys(record.msg)
            return True
        try:
            text = record.getMessage()
        except Exception:  # a line that does not format: its handler reports that
            return True
        hidden = hide_keys(text)
        if hidden != text:
            record.msg, record.args = hidden, None
        return True


def redact_keys() -> None:
    """Install :class:`RedactKeys` on the loggers that print request paths (uvicorn's; the root
    handler :func:`setup` adds has it too)."""
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        log = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in log.filters):
            log.addFilter(RedactKeys())


@contextmanager
def job_context(job_id: str) -> Iterator[None]:
    """Lines logged inside (and in tasks started inside) are about ``job_id``."""
    token = current_job.set(job_id)
    try:
        yield
    finally:
        current_job.reset(token)


def set_process_fields(**fields: str | None) -> None:
    """Fields every later line of this process carries (e.g. ``worker_id`` once it is chosen)."""
    _process.update({k: v for k, v in fields.items() if v is not None})


def formatter(fmt: str, prefix: str = "") -> logging.Formatter:
    """The formatter for ``fmt`` ('plain' or 'json'); ``prefix`` goes before a plain line's logger name."""
    if fmt == "json":
        return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s %(job_id)s",
                             rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                             timestamp=False)
    return logging.Formatter(PLAIN_FORMAT.replace("%(name)s", f"{prefix}%(name)s"))


def setup(settings: Settings, component: str, prefix: str = "") -> None:
    """Configure the root logger, as ``logging.basicConfig`` does: only if it has no handler yet
    (a host that set up logging, a test runner, keeps its own). Later calls only update the
    process fields."""
    set_process_fields(component=component, model=settings.model_name)
    redact_keys()
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(settings.log_format, prefix))
    handler.addFilter(JobFields())
    handler.addFilter(RedactKeys())
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
