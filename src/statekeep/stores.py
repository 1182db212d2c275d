"""Every store of statekeep and every integration that keeps data, in one list.

Each declares itself once, next to its tables (a :class:`~statekeep.db.catalog.StoreSpec`:
schema, tables, migrations, sealed columns, statistics policy, how one owner is erased).
Erasure, re-sealing, ``statekeep db upgrade``, opening a store to read it, the
runtime and the console read :data:`DECLARATIONS` through :func:`declared` and
:func:`declaration` instead of naming the stores, so a new store is one line here
and one declaration beside its tables.

The list names each declaration by import path: reading it imports nothing an
extra installs, and a declaration that needs an extra (the LangGraph saver's needs
``langgraph``) is left out of an install without it.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

from statekeep.db.catalog import Erased, Erasing, StoreSpec
from statekeep.errors import MissingDependencyError

if TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.db import Database
    from statekeep.memory import MemoryStore

#: Every declaration, by name, where it is; in the order erasure goes through them: working state
#: before the runs that name it, the data keys last (whatever sealed bytes remain go unreadable).
DECLARATIONS: dict[str, str] = {
    "working": "statekeep.working.sql:STORE",
    "workflow": "statekeep.workflow.tables:STORE",
    "context": "statekeep.context.tables:STORE",
    "agents": "statekeep.integrations._agents_items:STORE",
    "langgraph": "statekeep.integrations.langgraph._tables:STORE",
    "memory": "statekeep.stores:MEMORY",
    "langgraph_store": "statekeep.integrations.langgraph.store:REGISTRATIONS",
    "audit": "statekeep.audit:STORE",
    "keys": "statekeep.keys.ring:STORE",
}
#: The declarations an extra brings, with the packages it installs: absent, not an error, from an
#: install without them (any other failure to import a declaration is raised).
OPTIONAL: dict[str, tuple[str, ...]] = {
    "langgraph": ("langgraph", "numpy"),  # the integration's package imports its store, which needs numpy
    "langgraph_store": ("langgraph", "numpy"),
}


def _forget(memory: MemoryStore | None, erasing: Erasing) -> Erased | None:
    """The owner's memories, through the memory store's own erasure (its receipt, as a dict)."""
    if memory is None:
        return None
    receipt = memory.forget(erasing.owner)
    return Erased(receipt.as_dict(), receipt.locations, receipt.not_reached)


#: Long-term memory: its tables (LanceDB or pgvector), their migrations and statistics are its
#: backends' own, at ``STATEKEEP_MEMORY_URL``; erasure goes through :meth:`MemoryStore.forget`.
MEMORY: StoreSpec[MemoryStore] = StoreSpec("memory", erase=_forget)


@functools.cache
def declaration(name: str) -> StoreSpec[Any]:
    """The declaration of one store, by name.

    Raises:
        KeyError: no store has that name.
        MissingDependencyError: the store comes with an extra that is not installed.
    """
    module, _, attribute = DECLARATIONS[name].partition(":")
    spec: StoreSpec[Any] = getattr(importlib.import_module(module), attribute)
    assert spec.name == name, f"{DECLARATIONS[name]} declares {spec.name!r}, listed as {name!r}"
    return spec


def declared() -> list[StoreSpec[Any]]:
    """Every declaration of this install, in the list's order (an extra's only with the extra)."""
    found = []
    for name in DECLARATIONS:
        try:
            found.append(declaration(name))
        except MissingDependencyError:
            if name not in OPTIONAL:
                raise
        except ImportError as exc:  # only the extra's own packages may be missing
            if (exc.name or "").partition(".")[0] not in OPTIONAL.get(name, ()):
                raise
    return found


class Databases:
    """The SQL databases of some settings' stores, opened on first ask; stores at one URL share one.

    Examples:
        >>> from statekeep.config import Settings
        >>> dbs = Databases(Settings.load(database_url="sqlite:///:memory:", env={}))
        >>> dbs.of("keys") is dbs.of("workflow")  # the key ring lives with the workflow store
        True
        >>> dbs.dispose()
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._by_url: dict[str, Database] = {}

    def of(self, name: str) -> Database:
        """The database that holds the tables of the store ``name`` (its ``lives_in`` store's URL).

        Raises:
            ConfigError: the URL is malformed.
        """
        from statekeep.db import Database

        home = declaration(name).lives_in
        assert home is not None, f"the {name} store has no SQL tables"
        url = self.settings.url_for(home)
        if url not in self._by_url:
            self._by_url[url] = Database(url, setting=f"STATEKEEP_{home.upper()}_URL")
        return self._by_url[url]

    def dispose(self) -> None:
        """Close every connection of every database opened here."""
        for db in self._by_url.values():
            db.dispose()
