"""JSON every store can encode, store and read back: one check, run before anything is encoded.

``json.dumps`` recurses once per level of nesting, so a value nested 100,000 deep
raised a bare ``RecursionError`` from inside the encoder. A lone surrogate
(``"\\ud800"``, which Python strings allow and UTF-8 does not) is escaped as ASCII
by ``json.dumps``, so it was stored, and then broke every reader that encodes text
as UTF-8: a web response, a terminal, another language's JSON parser.

:func:`json_problem` finds both by walking the value with an explicit stack (it
never recurses, so no depth can exhaust Python's stack), and every store calls it
where JSON enters: context messages and pinned state, working state, workflow
input, outputs, events, decisions and tool arguments, and memory metadata.
:func:`parse` is its counterpart for JSON text from outside (a request body, a file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from statekeep.errors import InvalidInputError

#: The deepest nesting of lists and objects a stored JSON document may have (the
#: document as stored: an envelope a store wraps around a value counts too).
MAX_DEPTH = 64

_SURROGATE = re.compile("[\ud800-\udfff]")  # in a str, any of these is a lone surrogate
_SCALARS = frozenset({int, float, bool, type(None)})
_LONE = "contains a lone surrogate, which is not valid Unicode text"
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def _too_deep(limit: int) -> str:
    return f"is nested more than {limit} levels deep (lists and objects); flatten it"


def json_problem(value: object, limit: int = MAX_DEPTH) -> str | None:
    """Why ``value`` cannot be stored as JSON: nesting past ``limit``, or a lone surrogate; None if neither.

    Lists, tuples and mappings each count one level (a scalar is depth 0). Strings
    and mapping keys are checked for lone surrogates. Other types are left to the
    encoder, which refuses what it cannot encode. A cycle counts as too deep.
    """
    texts: list[object] = []  # every string and key, checked at once at the end
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict or isinstance(item, Mapping):
            texts.extend(item.keys())
            children: Iterable[object] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:  # only the value itself can be a scalar here
            texts.append(item)
            continue
        if depth >= limit:
            return _too_deep(limit)
        for child in children:
            kind = type(child)
            if kind is str:
                texts.append(child)
            elif kind not in _SCALARS:
                stack.append((child, depth + 1))
    try:
        joined = "".join(texts)  # type: ignore[arg-type]
    except TypeError:  # int keys, or a scalar value: only the strings matter
        joined = "".join(t for t in texts if isinstance(t, str))
    if not joined.isascii() and _SURROGATE.search(joined):
        return _LONE
    return None


def check_json(value: object, field: str, limit: int = MAX_DEPTH) -> None:
    """Refuse ``value`` if :func:`json_problem` finds a problem.

    Raises:
        InvalidInputError: naming ``field``; nothing was encoded or written.
    """
    problem = json_problem(value, limit)
    if problem is not None:
        raise InvalidInputError(problem, field=field)


def text_depth(text: str | bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text, without parsing it (strings are skipped)."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    depth = deepest = 0
    for byte in _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKET):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def parse(text: str | bytes, field: str, limit: int = MAX_DEPTH) -> Any:
    """Decode JSON text from outside: too deep, malformed or holding a lone surrogate is refused.

    The depth is measured on the text before it is decoded, so ``json.loads``
    never meets a nesting that could exhaust the stack.

    Raises:
        InvalidInputError: naming ``field``.
    """
    if text_depth(text) > limit:
        raise InvalidInputError(_too_deep(limit), field=field)
    try:
        value = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise InvalidInputError(f"is not JSON: {exc}", field=field) from None
    check_json(value, field, limit)
    return value
