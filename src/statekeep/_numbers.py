"""Numbers every backend and ``datetime`` can take: the checks shared by the stores' input validation.

Python ints and floats are unbounded or may be NaN; a database column is 64-bit
and ``timedelta`` overflows past ~2.7 million years. Checked up front, a bad
number is an :class:`InvalidInputError` naming its field instead of an
OverflowError or a driver error halfway through a write.
"""

from __future__ import annotations

import contextlib
import math
import numbers
from datetime import timedelta

from statekeep.errors import InvalidInputError

MAX_INT = 2**63 - 1
#: The longest duration accepted anywhere: a century (sleeps, waits, leases, expiries, ages).
MAX_SECONDS = 100 * 366 * 86_400.0


def check_int(value: object, field: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An integer (an int or a numpy integer, not a bool) from ``minimum`` to ``maximum``, as an int.

    Raises:
        InvalidInputError: naming ``field``.
    """
    number = int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None
    if number is None or not minimum <= number <= maximum:
        bound = f">= {minimum}" if maximum == MAX_INT else f"from {minimum} to {maximum}"
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
