"""Records of the long-term memory store: memories, their provenance, search results, receipts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from statekeep._check import (
    check_choice,
    check_choices,
    check_duration,
    check_id,
    check_json_object,
    check_number,
    check_optional_id,
    check_text,
    check_time,
)
from statekeep.errors import InvalidInputError

MemoryKind = Literal["semantic", "episodic", "procedural"]
SourceKind = Literal["user_supplied", "agent_inferred", "system_verified", "imported"]
SearchMode = Literal["vector", "text", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = ("vector", "text", "hybrid")
#: What ``remember`` does with a memory that matches one already stored (see :class:`MemoryStore`).
DedupeMode = Literal["exact", "similar", "none"]
#: Why ``remember`` did not add a new, independently searchable memory.
DedupeReason = Literal["same_key", "same_text", "similar"]

MEMORY_KINDS: tuple[MemoryKind, ...] = ("semantic", "episodic", "procedural")
SOURCE_KINDS: tuple[SourceKind, ...] = ("user_supplied", "agent_inferred", "system_verified", "imported")
DEDUPE_MODES: tuple[DedupeMode, ...] = ("exact", "similar", "none")

#: The longest memory (and search query), in characters.
MAX_CONTENT = 65_536
#: The longest tag, in characters.
MAX_TAG = 128
#: The most results one search returns.
MAX_K = 1000

#: The trust a memory gets from its source kind when the caller does not set one.
DEFAULT_TRUST: Mapping[SourceKind, float] = {
    "system_verified": 1.0,
    "user_supplied": 0.8,
    "imported": 0.5,
    "agent_inferred": 0.4,
}


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a memory came from: the session, run and event, and what kind of source.

    Examples:
        >>> Provenance("user_supplied", session_id="s-1", run_id="r-7", event_id="e-42").trust
        0.8
    """

    source: SourceKind = "agent_inferred"
    session_id: str | None = None
    run_id: str | None = None
    event_id: str | None = None
    #: How far the memory may be believed, in [0, 1]; defaults from ``source`` (``DEFAULT_TRUST``).
    trust: float | None = None

    def __post_init__(self) -> None:
        if self.trust is None and isinstance(self.source, str) and self.source in DEFAULT_TRUST:
            object.__setattr__(self, "trust", DEFAULT_TRUST[self.source])

    def as_dict(self) -> dict[str, Any]:
        """The provenance as a JSON-ready dict."""
        return {
            "source": self.source,
            "session_id": self.session_id,
            "run_id": self.run_id,
            "event_id": self.event_id,
            "trust": self.trust,
        }


@dataclass(frozen=True, slots=True)
class MemoryInput:
    """One memory to write, before the store gives it an id, a time and an embedding."""

    content: str
    kind: MemoryKind = "semantic"
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    provenance: Provenance = field(default_factory=Provenance)
    expires_at: datetime | None = None
    #: The fact's identity, when the caller knows it: a later memory with the same key is the same fact.
    key: str | None = None


@dataclass(frozen=True, slots=True)
class Dedupe:
    """What ``remember`` did with a memory that matched one of the owner's memories.

    ``same_key`` and ``same_text`` (the same text after normalisation): nothing
    was stored, and the existing memory was returned (``stored`` is False).
    ``similar`` (only with ``dedupe="similar"``): the new memory was stored and
    linked to ``existing_id`` with ``duplicate_of``; ``similarity`` is the cosine.
    """

    reason: DedupeReason
    existing_id: str
    stored: bool
    similarity: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The outcome as a JSON-ready dict."""
        return {
            "reason": self.reason,
            "existing_id": self.existing_id,
            "stored": self.stored,
            "similarity": self.similarity,
        }


@dataclass(frozen=True, slots=True, eq=True)
class Memory:
    """One stored memory of one owner.

    ``superseded_by`` names the memory that replaced this one; ``duplicate_of``
    names the earlier memory this one was merged into (only with
    ``dedupe="similar"``; ``duplicate_score`` is their cosine similarity).
    Search returns neither kind unless asked (``include_merged=True`` returns
    merged ones); both stay readable with :meth:`MemoryStore.get` and in exports.
    ``seq`` is the store's write order; search breaks score ties by content, then by it.
    ``dedupe`` is not stored: it tells the caller of ``remember`` what that call did.
    """

    id: str
    owner: str
    content: str
    kind: MemoryKind
    tags: tuple[str, ...]
    metadata: Mapping[str, Any]
    provenance: Provenance
    model: str
    created_at: datetime
    expires_at: datetime | None = None
    superseded_by: str | None = None
    duplicate_of: str | None = None
    key: str | None = None
    duplicate_score: float | None = None
    seq: int = 0
    dedupe: Dedupe | None = field(default=None, compare=False)

    @property
    def trust(self) -> float:
        """The memory's trust, from its provenance."""
        return float(self.provenance.trust if self.provenance.trust is not None else 0.0)

    @property
    def is_current(self) -> bool:
        """True unless superseded or a duplicate of another memory."""
        return self.superseded_by is None and self.duplicate_of is None

    def as_dict(self) -> dict[str, Any]:
        """The memory as a JSON-ready dict (times in ISO 8601)."""
        return {
            "id": self.id,
            "owner": self.owner,
            "content": self.content,
            "kind": self.kind,
            "tags": list(self.tags),
            "metadata": dict(self.metadata),
            "provenance": self.provenance.as_dict(),
            "model": self.model,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "superseded_by": self.superseded_by,
            "duplicate_of": self.duplicate_of,
            "duplicate_score": self.duplicate_score,
            "key": self.key,
            "seq": self.seq,
        }


@dataclass(frozen=True, slots=True)
class SearchResult:
    """A memory found by a search, with its score (higher is better).

    For vector search the score is the cosine similarity; for hybrid search it
    is the reciprocal-rank-fusion score of the vector and full-text rankings.
    """

    memory: Memory
    score: float


@dataclass(frozen=True, slots=True)
class ForgetReceipt:
    """What an erasure removed, and where.

    ``locations`` lists every place that was rewritten so that no copy remains
    (a table, its TOAST and indexes; a LanceDB table's data files, old versions
    and indexes). ``not_reached`` says plainly what erasure cannot touch by itself.
    """

    owner: str
    removed: int
    memory_ids: tuple[str, ...]
    backend: str
    locations: tuple[str, ...]
    not_reached: tuple[str, ...]
    finished_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict."""
        return {
            "owner": self.owner,
            "removed": self.removed,
            "memory_ids": list(self.memory_ids),
            "backend": self.backend,
            "locations": list(self.locations),
            "not_reached": list(self.not_reached),
            "finished_at": self.finished_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class Filters:
    """Search filters; every field narrows. Built by :meth:`MemoryStore.search`."""

    kinds: tuple[MemoryKind, ...] = ()
    tags: tuple[str, ...] = ()  # a memory must carry every one of these tags
    since: datetime | None = None
    until: datetime | None = None
    sources: tuple[SourceKind, ...] = ()
    min_trust: float | None = None
    #: Only memories of one of these sessions (``provenance.session_id``).
    sessions: tuple[str, ...] = ()
    #: Also return memories merged into another one (``duplicate_of``; superseded ones never).
    include_merged: bool = False

    def matches(self, memory: Memory) -> bool:
        """True when ``memory`` passes every filter (the pure reference used by tests and memory)."""
        return (
            (not self.kinds or memory.kind in self.kinds)
            and set(self.tags) <= set(memory.tags)
            and (self.since is None or memory.created_at >= self.since)
            and (self.until is None or memory.created_at < self.until)
            and (not self.sources or memory.provenance.source in self.sources)
            and (self.min_trust is None or memory.trust >= self.min_trust)
            and (not self.sessions or memory.provenance.session_id in self.sessions)
        )


# -- checks of what callers pass in (before anything is embedded or written) ---------------


def check_tags(tags: object) -> tuple[str, ...]:
    """Tags: an iterable of non-empty strings (a single string is one tag)."""
    if tags is None:
        return ()
    items = (tags,) if isinstance(tags, str) else tags
    if not isinstance(items, Iterable) or isinstance(items, Mapping):
        raise InvalidInputError("must be a list of strings", field="tags")
    return tuple(dict.fromkeys(check_text(t, "tags", limit=MAX_TAG) for t in items))


def check_provenance(provenance: object) -> Provenance:
    """A :class:`Provenance` with a known source kind and a trust in [0, 1]."""
    if provenance is None:
        return Provenance()
    if not isinstance(provenance, Provenance):
        raise InvalidInputError("must be a Provenance", field="provenance")
    check_choice(provenance.source, SOURCE_KINDS, "provenance.source")
    check_number(provenance.trust, "provenance.trust")
    for name in ("session_id", "run_id", "event_id"):
        value = getattr(provenance, name)
        if value is not None:
            check_id(value, f"provenance.{name}")
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
        kind=check_choice(item.kind, MEMORY_KINDS, "kind"),
        tags=check_tags(item.tags),
        metadata=check_json_object(item.metadata, "metadata"),
        provenance=check_provenance(item.provenance),
        expires_at=expires,
        key=check_optional_id(item.key, "key"),
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
    sessions: Iterable[str] | str | None = None,
) -> Filters:
    """Validate search filters into a :class:`Filters`."""
    if not isinstance(include_merged, bool):
        raise InvalidInputError("must be True or False", field="include_merged")
    if sessions is not None and (not isinstance(sessions, Iterable) or isinstance(sessions, Mapping)):
        raise InvalidInputError("must be a session id or a list of them", field="sessions")
    items = () if sessions is None else (sessions,) if isinstance(sessions, str) else tuple(sessions)
    return Filters(
        kinds=check_choices(kinds, MEMORY_KINDS, "kinds"),
        tags=check_tags(tags),
        since=check_time(since, "since"),
        until=check_time(until, "until"),
        sources=check_choices(sources, SOURCE_KINDS, "sources"),
        min_trust=None if min_trust is None else check_number(min_trust, "min_trust"),
        include_merged=include_merged,
        sessions=tuple(dict.fromkeys(check_id(s, "sessions") for s in items)),
    )
