"""LanceDB (DataFusion) SQL filters of the LanceDB backend: every value quoted, the owner always first.

Every value goes through :func:`quote`, so an owner such as ``a' OR '1'='1`` is
just a string.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from statekeep.memory._rows import to_us
from statekeep.memory._types import Filters


def quote(value: str) -> str:
    """A LanceDB (DataFusion) SQL string literal: single quotes doubled, nothing else is special."""
    return "'" + value.replace("'", "''") + "'"


def in_list(column: str, values: Sequence[str]) -> str:
    """``column`` is one of ``values`` (each quoted)."""
    return f"{column} IN ({', '.join(quote(v) for v in values)})"


def where(owner: str, filters: Filters | None = None, now: datetime | None = None, **eq: str) -> str:
    """The SQL filter of a scoped query: the owner always, then what was asked.

    ``now`` restricts to current (not superseded, not merged unless the filters
    include merged ones), unexpired memories.
    """
    parts = [f"owner = {quote(owner)}"] + [f"{k} = {quote(v)}" for k, v in eq.items()]
    if now is not None:
        merged = filters is not None and filters.include_merged
        parts.append("superseded_by IS NULL" if merged else "superseded_by IS NULL AND duplicate_of IS NULL")
        parts.append(f"(expires_us IS NULL OR expires_us > {to_us(now)})")
    if filters is not None:
        parts.extend(_filter_parts(filters))
    return " AND ".join(parts)


def _filter_parts(f: Filters) -> list[str]:
    parts = []
    if f.kinds:
        parts.append(in_list("kind", f.kinds))
    if f.tags:
        parts.append(f"array_has_all(tags, make_array({', '.join(quote(t) for t in f.tags)}))")
    if f.since is not None:
        parts.append(f"created_us >= {to_us(f.since)}")
    if f.until is not None:
        parts.append(f"created_us < {to_us(f.until)}")
    if f.sources:
        parts.append(in_list("source", f.sources))
    if f.min_trust is not None:
        parts.append(f"trust >= {f.min_trust!r}")
    if f.sessions:
        parts.append(in_list("session_id", f.sessions))
    return parts
