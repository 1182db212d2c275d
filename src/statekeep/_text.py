"""Text every backend can store: the check shared by the stores' input validation.

PostgreSQL refuses NUL characters in text, and no database can encode a lone
surrogate (``"\\ud800"``, which Python strings allow but UTF-8 does not). SQLite
would take the first and the driver would fail on the second mid-write; a
check up front turns both into a clear :class:`InvalidInputError` on every
backend, before anything is written.
"""

from __future__ import annotations

from statekeep.errors import InvalidInputError

MAX_ID = 255


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


def check_id(value: object, field: str, limit: int = MAX_ID) -> str:
    """An identifier: a non-empty string of at most ``limit`` characters that every backend can store."""
    if not isinstance(value, str) or not value or len(value) > limit:
        raise InvalidInputError(f"must be a non-empty string of at most {limit} characters", field=field)
    return check_storable(value, field)
