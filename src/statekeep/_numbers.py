"""Numbers every backend and ``datetime`` can take: the checks shared by the stores' input validation.

Python ints and floats are unbounded or may be NaN; a database column is 64-bit
and ``timedelta`` overflows past ~2.7 million years. Checked up front, a bad
number is an :class:`InvalidInputError` naming its field instead of an
OverflowError or a driver error halfway through a write.
"""

from __future__ import annotations

import math
from datetime import timedelta

from statekeep.errors import InvalidInputError

MAX_INT = 2**63 - 1
#: The longest duration accepted anywhere: a century (sleeps, waits, leases, expiries, ages).
MAX_SECONDS = 100 * 366 * 86_400.0


def check_int(value: object, field: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An int (not a bool) from ``minimum`` to ``maximum``.

    Raises:
        InvalidInputError: naming ``field``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        bound = f">= {minimum}" if maximum == MAX_INT else f"from {minimum} to {maximum}"
        raise InvalidInputError(f"must be an int {bound}", field=field)
    return value


def check_seconds(value: object, field: str, *, positive: bool = False) -> float:
    """A finite number of seconds (not a bool), >= 0 (> 0 if ``positive``), at most a century.

    Raises:
        InvalidInputError: naming ``field``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or value > MAX_SECONDS
    ):
        floor = "> 0" if positive else ">= 0"
        raise InvalidInputError(f"must be a finite number of seconds {floor}, at most a century", field=field)
    return float(value)


def check_duration(value: object, field: str, *, positive: bool = True) -> timedelta:
    """A ``timedelta`` > 0 (>= 0 unless ``positive``), at most a century.

    Raises:
        InvalidInputError: naming ``field``.
    """
    if not isinstance(value, timedelta):
        raise InvalidInputError(f"must be a timedelta, not {type(value).__name__}", field=field)
    check_seconds(value.total_seconds(), field, positive=positive)
    return value
