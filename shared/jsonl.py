"""JSON lines that stay one line for any reader. A JSON string may hold U+2028, U+2029 and U+0085
unescaped, and ``str.splitlines`` (how many clients read a JSONL file or a command's output) ends a
line at each; written as ``\\u`` escapes they are the same JSON, and every reader sees one line."""

from __future__ import annotations

_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def one_line(raw: str) -> str:
    """``raw`` (JSON text without a raw ``\\n``) with the line breaks JSON leaves raw escaped."""
    return raw.translate(_LINE_BREAKS)
