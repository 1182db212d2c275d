"""Pure mapping between :class:`Memory` records and flat rows, shared by the stored backends."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from statekeep.memory._dedupe import identity
from statekeep.memory._types import Memory, Provenance

#: Flat columns every stored backend keeps (besides the vector).
COLUMNS = (
    "id",
    "owner",
    "content",
    "kind",
    "tags",
    "metadata",
    "source",
    "session_id",
    "run_id",
    "event_id",
    "trust",
    "model",
    "created_us",
    "expires_us",
    "superseded_by",
    "duplicate_of",
    "key",
    "dedupe_key",
    "duplicate_score",
    "seq",
)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_us(value: datetime | None) -> int | None:
    """A timezone-aware time as integer microseconds since the epoch (exact, no timezone quirks)."""
    if value is None:
        return None
    delta = value.astimezone(UTC) - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int | None) -> datetime | None:
    """Inverse of :func:`to_us`."""
    if value is None:
        return None
    return _EPOCH + timedelta(microseconds=int(value))


def to_row(memory: Memory) -> dict[str, Any]:
    """A memory as a flat row (metadata as JSON text, times as microseconds)."""
    p = memory.provenance
    return {
        "id": memory.id,
        "owner": memory.owner,
        "content": memory.content,
        "kind": memory.kind,
        "tags": list(memory.tags),
        "metadata": json.dumps(dict(memory.metadata), ensure_ascii=False),
        "source": p.source,
        "session_id": p.session_id,
        "run_id": p.run_id,
        "event_id": p.event_id,
        "trust": memory.trust,
        "model": memory.model,
        "created_us": to_us(memory.created_at),
        "expires_us": to_us(memory.expires_at),
        "superseded_by": memory.superseded_by,
        "duplicate_of": memory.duplicate_of,
        "key": memory.key,
        "dedupe_key": identity(memory.content, memory.key),
        "duplicate_score": memory.duplicate_score,
        "seq": memory.seq,
    }


def from_row(row: dict[str, Any]) -> Memory:
    """Inverse of :func:`to_row`; extra keys (scores, vectors, ``dedupe_key``) are ignored."""
    created = from_us(row["created_us"])
    assert created is not None
    metadata = row["metadata"]
    return Memory(
        id=row["id"],
        owner=row["owner"],
        content=row["content"],
        kind=row["kind"],
        tags=tuple(row["tags"] or ()),
        metadata=json.loads(metadata) if isinstance(metadata, str) else dict(metadata or {}),
        provenance=Provenance(row["source"], row["session_id"], row["run_id"], row["event_id"], row["trust"]),
        model=row["model"],
        created_at=created,
        expires_at=from_us(row["expires_us"]),
        superseded_by=row["superseded_by"],
        duplicate_of=row["duplicate_of"],
        key=row["key"],
        duplicate_score=None if row["duplicate_score"] is None else float(row["duplicate_score"]),
        seq=int(row["seq"]),
    )
