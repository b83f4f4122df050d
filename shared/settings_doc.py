"""The settings reference, docs/settings.md, generated from :class:`~inferq.shared.settings.Settings`.

    python -m inferq.shared.settings_doc > docs/settings.md

One table per part of the class (the ``# --- name ---`` comments in shared/settings.py), one row per
field: its environment variable, type and range, default, and the field's ``description``. A unit
test (tests/unit/test_settings_doc.py) fails when the file and this output differ.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from inferq.shared.settings import Settings

PREFIX = "INFERQ_"
COMMAND = "python -m inferq.shared.settings_doc > docs/settings.md"

INTRO = f"""# Settings

Every setting is an environment variable with the `{PREFIX}` prefix, read once per process by one
pydantic-settings class ([shared/settings.py](../shared/settings.py)); the gateway, the workers and
`inferq up` read the same names, so give them the same values. Booleans take `true`/`false` (or
`1`/`0`); lists are comma-separated; sizes are in bytes and durations in seconds unless the name
says otherwise. A value outside its range stops the process at start with pydantic's message.

This page is generated from the code: `{COMMAND}`.
"""

_SECTION = re.compile(r"^\s*# -+ (?P<name>.+?) -+\s*$")
_FIELD = re.compile(r"^    (?P<name>[a-z_][a-z0-9_]*)\s*:")
_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "string (secret)"}


def sections() -> list[tuple[str, list[str]]]:
    """The class's fields in order, grouped under the ``# --- name ---`` comment above them."""
    out: list[tuple[str, list[str]]] = [("settings", [])]
    for line in inspect.getsource(Settings).splitlines():
        if m := _SECTION.match(line):
            out.append((m["name"], []))
        elif (m := _FIELD.match(line)) and m["name"] in Settings.model_fields:
            out[-1][1].append(m["name"])
    missing = [n for n in Settings.model_fields if not any(n in names for _, names in out)]
    if missing:
        out.append(("other", missing))
    return [(name, names) for name, names in out if names]


def type_text(info: FieldInfo) -> str:
    """The field's type for a reader: ``integer, ≥ 1``, ``'plain' or 'json'``, ``path (optional)``."""
    ann: Any = info.annotation
    optional = False
    if isinstance(ann, types.UnionType) or typing.get_origin(ann) is typing.Union:
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        optional = len(args) < len(typing.get_args(ann))
        ann = args[0] if len(args) == 1 else ann
    if typing.get_origin(ann) is typing.Literal:
        text = " or ".join(f"`{v}`" for v in typing.get_args(ann))
    else:
        text = _TYPES.get(ann, getattr(ann, "__name__", str(ann)))
    bounds = []
    for m in info.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign} {_num(getattr(m, attr))}")
    if bounds:
        text += ", " + ", ".join(bounds)
    return text + (" (optional)" if optional else "")


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _human(name: str, v: int | float) -> str:
    """A hint beside a large number: ``1 MiB``, ``24 h``."""
    if name.endswith("_bytes") and v >= 1024:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if v >= size and v % size == 0:
                return f" ({v // size} {unit})"
    if name.endswith("_s") and v >= 3600:
        return f" ({v / 86400:g} days)" if v % 86400 == 0 and v > 86400 else f" ({v / 3600:g} h)"
    return ""


def default_text(name: str, info: FieldInfo) -> str:
    """The default as a reader would write it; ``unset`` for None, ``empty`` for an empty string."""
    v = info.get_default(call_default_factory=True)
    if isinstance(v, SecretStr):
        v = v.get_secret_value()
    if v is None:
        return "unset"
    if v == "":
        return "empty"
    if isinstance(v, Path):
        home = Path.home()
        v = "~/" + str(v.relative_to(home)) if v.is_relative_to(home) else str(v)
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, int | float):
        return f"`{_num(v)}`{_human(name, v)}"
    return f"`{v}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The whole of docs/settings.md."""
    fields = Settings.model_fields
    parts = [INTRO]
    for section, names in sections():
        parts.append(f"## {section[0].upper()}{section[1:]}\n")
        rows = ["| variable | type | default | what it does |", "|---|---|---|---|"]
        for name in names:
            info = fields[name]
            rows.append(f"| `{PREFIX}{name.upper()}` | {_cell(type_text(info))} | {_cell(default_text(name, info))} "
                        f"| {_cell(info.description or '')} |")
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
