"""Pure JSON helpers: exact encoding and stable hashes."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from statekeep._check import MAX_DEPTH, json_problem


class NotJSONError(ValueError):
    """Internal: a value does not survive a JSON round trip (callers wrap it)."""


def to_json(value: Any, *, limit: int = MAX_DEPTH) -> str:
    """Encode ``value`` as compact JSON, refusing anything that would not decode back equal.

    Tuples, non-string keys, NaN and arbitrary objects are refused, so what a
    replay returns is exactly what the first execution returned. So are what the
    other stores refuse (:func:`statekeep._check.json_problem`): nesting deeper
    than ``limit`` (``MAX_DEPTH``; checked without recursion, before encoding)
    and lone surrogates, which ``json.dumps`` would escape as ASCII and store, and
    every reader that encodes text as UTF-8 would then fail on. An envelope the
    engine wraps around a value it already stored passes ``limit=MAX_DEPTH + 1``.
    """
    problem = json_problem(value, limit)
    if problem is not None:
        raise NotJSONError(f"{type(value).__name__} value {problem}")
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise NotJSONError(str(exc)) from exc
    decoded = loads(text)
    if decoded != value or not _same_shape(decoded, value):
        raise NotJSONError(f"{type(value).__name__} value does not survive a JSON round trip unchanged")
    return text


def _same_shape(decoded: Any, value: Any) -> bool:
    """Equality misses tuple-vs-list and int-vs-bool; compare container types too."""
    if isinstance(value, bool) or isinstance(decoded, bool):
        return type(decoded) is type(value)
    if isinstance(value, dict):
        return isinstance(decoded, dict) and all(_same_shape(decoded[k], v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value) is list and all(_same_shape(d, v) for d, v in zip(decoded, value, strict=True))
    return True


def digest(value: Any) -> str:
    """A stable sha256 of a JSON value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def loose_digest(value: Any) -> str:
    """A sha256 of any value: JSON where possible, ``repr`` for the rest (for journal input hashes)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


_RAW_DECODE = json.JSONDecoder().raw_decode


def loads(text: str | None) -> Any:
    """Decode stored JSON text (None stays None).

    Every step a replay re-walks parses its output here, so the common case skips
    ``json.loads``' whitespace handling: text this module wrote has none around it.
    Anything else (surrounding whitespace, or no JSON at all) goes through
    ``json.loads``, which decodes it or raises its usual error.
    """
    if text is None:
        return None
    try:
        value, end = _RAW_DECODE(text)
    except ValueError:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)
