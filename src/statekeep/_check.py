"""Every argument check in one place: what untrusted input must be before any store takes it.

The stores, the runtime, the CLI and the web console call these where data enters
(public entry points, command-line options, request bodies); internal code that
has already checked its input does not check again. Each check returns the value
(converted where that is the point: an int from a numpy integer, a float from an
int) or raises :class:`~statekeep.errors.InvalidInputError` naming the field, so
bad input fails before anything is encoded, embedded or written.

Why these limits:

- **Numbers.** Python ints and floats are unbounded or may be NaN; a database
  column is 64-bit and ``timedelta`` overflows past ~2.7 million years.
- **Text.** PostgreSQL refuses NUL characters, and no database can encode a lone
  surrogate (``"\\ud800"``, which Python strings allow but UTF-8 does not).
- **JSON.** ``json.dumps`` recurses once per level of nesting, so a value nested
  100,000 deep raised a bare ``RecursionError``; a lone surrogate is escaped as
  ASCII by ``json.dumps``, stored, and then breaks every reader that encodes text
  as UTF-8. :func:`json_problem` finds both with an explicit stack (it never
  recurses); :func:`parse` is its counterpart for JSON text from outside.

Record shapes (a context message, a memory to write) are checked by their own
types, with these checks as their parts.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from statekeep.errors import InvalidInputError

#: The longest identifier (run, session, owner, key, memory id) every backend stores.
MAX_ID = 255
#: The largest integer a 64-bit database column holds.
MAX_INT = 2**63 - 1
#: The longest duration accepted anywhere: a century (sleeps, waits, leases, expiries, ages).
MAX_SECONDS = 100 * 366 * 86_400.0
#: The deepest nesting of lists and objects a stored JSON document may have (the
#: document as stored: an envelope a store wraps around a value counts too).
MAX_DEPTH = 64

T = TypeVar("T")

# -- numbers -------------------------------------------------------------------------------


def check_int(value: object, field: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An integer (an int or a numpy integer, not a bool) from ``minimum`` to ``maximum``, as an int.

    Raises:
        InvalidInputError: naming ``field``.
    """
    number = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    if number is None or not minimum <= number <= maximum:
        bound = f">= {minimum}" if maximum == MAX_INT else f"from {minimum} to {maximum}"
        if number is not None and number > maximum == MAX_INT:
            bound += f", at most {MAX_INT} (the largest integer a database column holds)"
        raise InvalidInputError(f"must be an int {bound}", field=field)
    return number


def check_seconds(value: object, field: str, *, positive: bool = False, past_is_zero: bool = False) -> float:
    """A number of seconds (any real number but a bool), >= 0 (> 0 if ``positive``), at most a century.

    NaN, infinities and ints too big for a float fail the range test. With
    ``past_is_zero``, a negative number (a deadline already past) is 0.

    Raises:
        InvalidInputError: naming ``field``.
    """
    seconds = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            seconds = float(value)
    if past_is_zero and seconds < 0:
        seconds = 0.0
    if not 0 <= seconds <= MAX_SECONDS or (positive and seconds == 0):
        floor = "> 0" if positive else ">= 0"
        raise InvalidInputError(f"must be a finite number of seconds {floor}, at most a century", field=field)
    return seconds


def check_duration(value: object, field: str, *, positive: bool = True) -> timedelta:
    """A ``timedelta`` > 0 (>= 0 unless ``positive``), at most a century.

    Raises:
        InvalidInputError: naming ``field``.
    """
    if not isinstance(value, timedelta):
        raise InvalidInputError(f"must be a timedelta, not {type(value).__name__}", field=field)
    check_seconds(value.total_seconds(), field, positive=positive)
    return value


def check_number(
    value: object, field: str, *, minimum: float = 0.0, maximum: float = 1.0, open_below: bool = False
) -> float:
    """A finite real number (not a bool) from ``minimum`` to ``maximum``, as a float.

    With ``open_below``, the number must be above ``minimum``, not equal to it.

    Raises:
        InvalidInputError: naming ``field``.
    """
    number = math.nan
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            number = float(value)
    low_ok = number > minimum if open_below else number >= minimum
    if not (low_ok and number <= maximum):
        low = "(" if open_below else "["
        raise InvalidInputError(
            f"must be a number in {low}{minimum:g}, {maximum:g}], got {value!r}", field=field
        )
    return number


# -- text --------------------------------------------------------------------------------


def check_unicode(text: str, field: str) -> str:
    """``text`` itself, if it can be encoded as UTF-8 (to a database or to a model's API).

    Raises:
        InvalidInputError: naming ``field``, for a lone surrogate.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(
            "must be valid Unicode text (it contains a lone surrogate)", field=field
        ) from None
    return text


def check_storable(text: str, field: str) -> str:
    """``text`` itself, if every backend can store it in a text column.

    Raises:
        InvalidInputError: naming ``field``, for NUL characters or lone surrogates.
    """
    if "\x00" in text:
        raise InvalidInputError("must not contain NUL characters", field=field)
    return check_unicode(text, field)


def check_text(value: object, field: str, *, limit: int = MAX_ID, allow_empty: bool = False) -> str:
    """A string of at most ``limit`` characters that every backend can store.

    Non-empty unless ``allow_empty``; no NUL characters, no lone surrogates.
    """
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > limit:
        raise InvalidInputError(f"must be a non-empty string of at most {limit} characters", field=field)
    return check_storable(value, field)


def check_id(value: object, field: str) -> str:
    """An identifier (run, session, owner, key, memory id): non-empty, at most :data:`MAX_ID` characters."""
    return check_text(value, field, limit=MAX_ID)


def check_run_id(run_id: object) -> str:
    """A run id: a non-empty string of at most :data:`MAX_ID` characters that every backend can store.

    Run ids are the workflow store's, and the working-state store keys its versions
    by them; it lives on this floor because the working store never imports the
    workflow store.
    """
    return check_id(run_id, "run_id")


def check_optional_id(value: object, field: str) -> str | None:
    """None, or an identifier as :func:`check_id` takes it."""
    return None if value is None else check_id(value, field)


def check_time(value: object, field: str) -> datetime | None:
    """``None`` or a timezone-aware datetime."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInputError("must be a timezone-aware datetime", field=field)
    return value


def check_choice(value: object, allowed: tuple[T, ...], field: str) -> T:
    """Exactly one of ``allowed`` (a string, not a list of one)."""
    if isinstance(value, str):
        for option in allowed:
            if value == option:
                return option
    raise InvalidInputError(f"{value!r} is not one of {list(allowed)}", field=field)


def check_choices(values: object, allowed: tuple[T, ...], field: str) -> tuple[T, ...]:
    """None (no choice), one of ``allowed``, or an iterable of them."""
    if values is None:
        return ()
    if not isinstance(values, str | Iterable):
        raise InvalidInputError(f"must be one of {list(allowed)} or a list of them", field=field)
    items = (values,) if isinstance(values, str) else tuple(cast(Iterable[object], values))
    return tuple(check_choice(v, allowed, field) for v in items)


# -- JSON --------------------------------------------------------------------------------


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


def check_json_object(value: object, field: str) -> dict[str, Any]:
    """A JSON object (None is ``{}``) that survives a round trip unchanged: string keys, no NaN, no NUL."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidInputError("must be a dict", field=field)
    check_json(value, field)  # depth and lone surrogates, before json.dumps can recurse
    try:
        text = json.dumps(dict(value), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"must be JSON: {exc}", field=field) from exc
    again: dict[str, Any] = json.loads(text)
    if again != dict(value) or "\\u0000" in text:
        raise InvalidInputError("must survive a JSON round trip unchanged (string keys, no NUL)", field=field)
    return again
