"""Validation of every public argument: pure functions that raise ``InvalidInputError``.

Each runs before anything is embedded or written, so bad input writes nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from statekeep._json import check_json
from statekeep._numbers import check_duration
from statekeep._text import check_storable
from statekeep.errors import InvalidInputError
from statekeep.memory._types import (
    MEMORY_KINDS,
    SOURCE_KINDS,
    Filters,
    MemoryInput,
    MemoryKind,
    Provenance,
    SourceKind,
)

MAX_OWNER = 255
MAX_CONTENT = 65_536
MAX_TAG = 128
MAX_K = 1000
T = TypeVar("T")


def check_text(value: object, field: str, *, limit: int, allow_empty: bool = False) -> str:
    """A string of at most ``limit`` characters that every backend can store (no NUL, no lone surrogate)."""
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > limit:
        raise InvalidInputError(f"must be a non-empty string of at most {limit} characters", field=field)
    return check_storable(value, field)


def check_owner(owner: object) -> str:
    """An owner id: any non-empty string (wildcards, quotes and slashes are just characters)."""
    return check_text(owner, "owner", limit=MAX_OWNER)


def check_id(memory_id: object) -> str:
    """A memory id, as returned by ``remember``."""
    return check_text(memory_id, "memory_id", limit=MAX_OWNER)


def check_k(k: object) -> int:
    """The number of results: an int in 1..1000."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"must be an int from 1 to {MAX_K}", field="k")
    return k


def check_time(value: object, field: str) -> datetime | None:
    """``None`` or a timezone-aware datetime."""
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInputError("must be a timezone-aware datetime", field=field)
    return value


def _choices(values: Iterable[T] | T | None, allowed: tuple[T, ...], field: str) -> tuple[T, ...]:
    if values is None:
        return ()
    if not isinstance(values, str | Iterable):
        raise InvalidInputError(f"must be one of {list(allowed)} or a list of them", field=field)
    items = (values,) if isinstance(values, str) else tuple(cast(Iterable[T], values))
    bad = [v for v in items if not isinstance(v, str) or v not in allowed]
    if bad:
        raise InvalidInputError(f"{bad[0]!r} is not one of {list(allowed)}", field=field)
    return items


def _choice(value: object, allowed: tuple[T, ...], field: str) -> T:
    """Exactly one of ``allowed`` (a string, not a list of one)."""
    if isinstance(value, str):
        for option in allowed:
            if value == option:
                return option
    raise InvalidInputError(f"{value!r} is not one of {list(allowed)}", field=field)


def check_tags(tags: object) -> tuple[str, ...]:
    """Tags: an iterable of non-empty strings (a single string is one tag)."""
    if tags is None:
        return ()
    items = (tags,) if isinstance(tags, str) else tags
    if not isinstance(items, Iterable) or isinstance(items, Mapping):
        raise InvalidInputError("must be a list of strings", field="tags")
    return tuple(dict.fromkeys(check_text(t, "tags", limit=MAX_TAG) for t in items))


def check_metadata(metadata: object) -> dict[str, Any]:
    """A JSON object that survives a round trip unchanged."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError("must be a dict", field="metadata")
    check_json(metadata, "metadata")  # depth and lone surrogates, before json.dumps can recurse
    try:
        text = json.dumps(dict(metadata), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"must be JSON: {exc}", field="metadata") from exc
    again: dict[str, Any] = json.loads(text)
    if again != dict(metadata) or "\\u0000" in text:
        raise InvalidInputError(
            "must survive a JSON round trip unchanged (string keys, no NUL)", field="metadata"
        )
    return again


def check_provenance(provenance: object) -> Provenance:
    """A :class:`Provenance` with a known source kind and a trust in [0, 1]."""
    if provenance is None:
        return Provenance()
    if not isinstance(provenance, Provenance):
        raise InvalidInputError("must be a Provenance", field="provenance")
    _choice(provenance.source, SOURCE_KINDS, "provenance.source")
    trust = provenance.trust
    if isinstance(trust, bool) or not isinstance(trust, int | float) or not 0.0 <= trust <= 1.0:
        raise InvalidInputError("must be a number from 0 to 1", field="provenance.trust")
    for name in ("session_id", "run_id", "event_id"):
        value = getattr(provenance, name)
        if value is not None:
            check_text(value, f"provenance.{name}", limit=MAX_OWNER)
    return provenance


def check_input(item: object, now: datetime) -> MemoryInput:
    """Validate one memory to write; a plain string is a semantic memory with default provenance."""
    if isinstance(item, str):
        item = MemoryInput(item)
    if not isinstance(item, MemoryInput):
        raise InvalidInputError("each item must be a string or a MemoryInput", field="items")
    expires = check_time(item.expires_at, "expires_at")
    if expires is not None and expires <= now:
        raise InvalidInputError("must be in the future", field="expires_at")
    return MemoryInput(
        content=check_text(item.content, "content", limit=MAX_CONTENT),
        kind=_choice(item.kind, MEMORY_KINDS, "kind"),
        tags=check_tags(item.tags),
        metadata=check_metadata(item.metadata),
        provenance=check_provenance(item.provenance),
        expires_at=expires,
        key=None if item.key is None else check_text(item.key, "key", limit=MAX_OWNER),
    )


def expiry(expires_at: datetime | None, ttl: timedelta | None, now: datetime) -> datetime | None:
    """The expiry time from an absolute time or a time-to-live (not both)."""
    if ttl is None:
        return expires_at
    if expires_at is not None:
        raise InvalidInputError("give expires_at or ttl, not both", field="ttl")
    return now + check_duration(ttl, "ttl")


def check_filters(
    kinds: Iterable[MemoryKind] | MemoryKind | None,
    tags: Iterable[str] | str | None,
    since: datetime | None,
    until: datetime | None,
    sources: Iterable[SourceKind] | SourceKind | None,
    min_trust: float | None,
    include_merged: bool = False,
) -> Filters:
    """Validate search filters into a :class:`Filters`."""
    if min_trust is not None and (
        isinstance(min_trust, bool)
        or not isinstance(min_trust, int | float)
        or not math.isfinite(min_trust)
        or not 0 <= min_trust <= 1
    ):
        raise InvalidInputError("must be a number from 0 to 1", field="min_trust")
    if not isinstance(include_merged, bool):
        raise InvalidInputError("must be True or False", field="include_merged")
    return Filters(
        kinds=_choices(kinds, MEMORY_KINDS, "kinds"),
        tags=check_tags(tags),
        since=check_time(since, "since"),
        until=check_time(until, "until"),
        sources=_choices(sources, SOURCE_KINDS, "sources"),
        min_trust=None if min_trust is None else float(min_trust),
        include_merged=include_merged,
    )
