"""Stored text shown to people literally: control characters, ANSI escapes and bidi controls made visible."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


# What a terminal would act on instead of showing: C0 and C1 control codes (but newline and tab),
# DEL, invisible formatting and bidi controls, and lone surrogates (no terminal encoding takes them).
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff]"
)


def visible(text: str, *, json_text: bool = False) -> str:
    """``text`` with every character a terminal would act on, rather than show, written as an escape.

    ESC, CR and the other control codes, bidi overrides and zero-width characters
    become ``\\x1b``, ``\\r``, ``\\u202e``...; newlines, tabs and every printable
    character (any script, emoji) are kept. With ``json_text``, ``text`` is JSON and
    the escapes are JSON's own (``\\u001b``), so it stays JSON that decodes the same.
    """
    return _INVISIBLE.sub(_escape_json if json_text else _escape, text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    short = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(code)
    return short or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def _escape_json(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def pretty(value: Any) -> str:
    """A JSON value as indented JSON text, every invisible character escaped (for <pre> and terminals)."""
    return visible(json.dumps(value, indent=2, ensure_ascii=False, default=str), json_text=True)
