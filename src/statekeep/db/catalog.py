"""What a store declares about itself, once, next to its tables: the entries of :mod:`statekeep.stores`.

A :class:`StoreSpec` names a store (or an integration that keeps data), its SQL
schema and tables, its migrations, which columns are sealed with an owner's data
key, which columns PostgreSQL must not sample into its statistics, and how one
owner is erased from it. Cross-cutting work (erasure, re-sealing, ``statekeep db
upgrade``, opening a store to read it) reads these declarations instead of naming
the stores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import sqlalchemy as sa

from statekeep.db.engine import Database
from statekeep.db.migrations import Migration, current_version, upgrade

if TYPE_CHECKING:
    from statekeep.config import Settings

#: What an erase hook works through: the store object, or the Database of an integration's tables.
H = TypeVar("H")


@dataclass(frozen=True)
class Erasing:
    """One owner's erasure as an erase hook sees it.

    Attributes:
        owner: The owner erased.
        run_ids: The owner's runs, found before anything was deleted (working state is keyed by run).
        session_ids: The owner's context sessions, likewise (the Agents SDK items are keyed by session).
    """

    owner: str
    run_ids: tuple[str, ...] = ()
    session_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Erased:
    """What an erase hook removed: its receipt section, where it rewrote bytes, what it cannot reach."""

    counts: dict[str, Any]
    locations: tuple[str, ...] = ()
    not_reached: tuple[str, ...] = ()

    def __add__(self, other: Erased) -> Erased:
        """Two passes of one hook as one (counts added up, locations and lines kept once each)."""
        counts = {k: self.counts.get(k, 0) + other.counts.get(k, 0) for k in {**self.counts, **other.counts}}
        locations = tuple(dict.fromkeys((*self.locations, *other.locations)))
        return Erased(counts, locations, tuple(dict.fromkeys((*self.not_reached, *other.not_reached))))


#: An erase hook: given the store (None when the caller has none) and the erasure, what it removed;
#: None when there is nothing to erase from (the receipt's section is then None).
Eraser = Callable[[H | None, Erasing], Erased | None]


@dataclass(frozen=True)
class StoreSpec(Generic[H]):
    """One store's (or data-keeping integration's) declaration.

    Attributes:
        name: The store's name: its migration table (``<name>_migrations``), its section of an
            erasure receipt, its key in :func:`statekeep.keys.reencrypt`'s report.
        metadata: Its tables, in the schema of its own (PostgreSQL; mapped away on SQLite).
        migrations: Its numbered migrations; ``statekeep db upgrade`` applies them.
        lives_in: The SQL store whose URL (and database) holds the tables: by default the store
            itself when it has tables (``context``, ``working``, ``workflow``); ``workflow`` for
            the key ring, the audit log and the LangGraph saver; ``context`` for the Agents SDK
            items. None without SQL tables of its own (memory, at ``STATEKEEP_MEMORY_URL``).
        sealed: ``{table: columns}`` holding values sealed with an owner's data key; re-sealed
            after a key rotation.
        no_statistics: ``{table: columns}`` that PostgreSQL's ANALYZE must not sample into
            pg_statistic (erasure does not rewrite it). A migration applies them with
            :func:`statekeep.db.dialects.no_statistics`; a column added later needs a new one.
        erase: How one owner is erased (None: nothing to erase, or not reached yet).
        part_of: The store whose records these rows hang off (the Agents SDK items hang off
            context sessions): erased just before it, and again just after it, so that a row
            added meanwhile goes too.
        enabled: Whether these settings use the store at all (the key ring: not with
            ``STATEKEEP_KEYS=none``); None for always.
    """

    name: str
    metadata: sa.MetaData | None = None
    migrations: Sequence[Migration] = ()
    _: KW_ONLY
    lives_in: str | None = None
    sealed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    no_statistics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    erase: Eraser[H] | None = None
    part_of: str | None = None
    enabled: Callable[[Settings], bool] | None = None

    def __post_init__(self) -> None:
        if self.lives_in is None and self.metadata is not None:  # a store's tables live with it
            object.__setattr__(self, "lives_in", self.name)

    @property
    def schema(self) -> str | None:
        """The SQL schema of its tables (their metadata's), None without tables."""
        return None if self.metadata is None else self.metadata.schema

    def table(self, name: str) -> sa.Table:
        """One of the declared tables, by its name without the schema."""
        assert self.metadata is not None, f"the {self.name} store has no tables"
        return self.metadata.tables[f"{self.schema}.{name}" if self.schema else name]

    def upgrade(self, db: Database) -> int:
        """Apply the store's pending migrations to ``db`` (see :func:`statekeep.db.upgrade`); its version."""
        assert self.schema is not None, f"the {self.name} store has no SQL schema"
        return upgrade(db, self.name, self.schema, self.migrations)

    def version(self, db: Database) -> int:
        """The store's schema version in ``db``, 0 where it was never created."""
        assert self.schema is not None, f"the {self.name} store has no SQL schema"
        return current_version(db, self.name, self.schema)


def by_owner(store: Any, erasing: Erasing) -> Erased | None:
    """An erase hook for a store that erases an owner itself (its ``delete_owner``): its counts."""
    return None if store is None else Erased(store.delete_owner(erasing.owner))
