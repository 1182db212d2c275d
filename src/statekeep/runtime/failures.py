"""Failures of model and tool calls, classified: transient ones are retried, permanent ones are not.

Transient: timeouts, reset or refused connections, HTTP 408, 409, 425, 429 and
5xx, and any error that says ``retryable = True``. Permanent: everything else (a
400 with the provider's message, 401, 403, a schema error, a bug). The wait
before a retry is the provider's ``Retry-After`` when it gave one, otherwise an
exponential backoff with jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from statekeep.errors import ModelError
from statekeep.models import parse_retry_after, retryable_status
from statekeep.workflow import RetryPolicy

#: A backoff delay is drawn from [(1 - JITTER) * d, d]: workers that failed together do not retry together.
JITTER = 0.5


@dataclass(frozen=True)
class Failure:
    """A classified failure: its message, whether a retry may succeed, the status and the asked-for wait."""

    error: str
    transient: bool
    status: int | None = None
    retry_after: float | None = None


def classify(exc: BaseException) -> Failure:
    """Classify what a model or a tool raised.

    Examples:
        >>> classify(TimeoutError("read timed out")).transient
        True
        >>> classify(ValueError("no such lead")).transient
        False
    """
    if isinstance(exc, ModelError):
        return Failure(str(exc), exc.retryable, exc.status, exc.retry_after)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    flag = getattr(exc, "retryable", getattr(exc, "transient", None))
    status = _status(exc)
    retry_after = _retry_after(exc)
    if isinstance(flag, bool):
        return Failure(text, flag, status, retry_after)
    if status is not None:
        return Failure(text, retryable_status(status), status, retry_after)
    return Failure(text, _transport(exc), None, retry_after)


def backoff(policy: RetryPolicy, attempt: int, retry_after: float | None) -> float:
    """Seconds to wait after failed attempt ``attempt``: the provider's wish, or the backoff with jitter."""
    if retry_after is not None:
        return retry_after
    delay = policy.delay(attempt)
    return delay * (1 - JITTER * random.random())


def _status(exc: BaseException) -> int | None:
    for holder in (exc, getattr(exc, "response", None)):
        for name in ("status_code", "status"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def _retry_after(exc: BaseException) -> float | None:
    value = getattr(exc, "retry_after", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    headers: Any = getattr(getattr(exc, "response", None), "headers", None)
    try:
        return parse_retry_after(dict(headers)) if headers else None
    except (TypeError, ValueError):
        return None


def _transport(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(
        names
        & {"TransportError", "TimeoutException", "NetworkError", "ConnectError", "Timeout", "ConnectionError"}
    )
