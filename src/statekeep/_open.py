"""Opening stores to read them, creating nothing: a missing database or folder is an error naming it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from statekeep.errors import ConfigError

if TYPE_CHECKING:
    from statekeep.config import Settings
    from statekeep.db import Database
    from statekeep.memory import Embedder, MemoryStore


def sql_setting(settings: Settings, store: str) -> str:
    """The name of the setting that gives ``store`` its URL."""
    url = settings.url_for(store)
    return "STATEKEEP_DATABASE_URL" if url == settings.database_url else f"STATEKEEP_{store.upper()}_URL"


def find_sql(settings: Settings, store: str) -> Database | None:
    """:func:`open_sql`, or None when the database holds no such store (a context-only database)."""
    return _open_sql(settings, store, missing_ok=True)


def open_sql(settings: Settings, store: str) -> Database:
    """The database of one SQL store, checked to exist and to hold the store's current schema.

    Nothing is created: a SQLite file that is not there, a schema never
    created, or one older than this code is an error naming the setting.
    :func:`find_sql` returns None instead for a schema never created.

    Raises:
        ConfigError: the database is missing, unreachable, or not (yet) a statekeep database.
    """
    db = _open_sql(settings, store, missing_ok=False)
    assert db is not None
    return db


def _open_sql(settings: Settings, store: str, *, missing_ok: bool) -> Database | None:
    from statekeep.db import Database
    from statekeep.db.dialects import dialect_of
    from statekeep.db.engine import normalize_url
    from statekeep.stores import declaration

    url, setting = settings.url_for(store), sql_setting(settings, store)
    parsed = normalize_url(url, setting=setting)
    file = dialect_of(parsed).file_of(parsed)
    if file is not None and not file.is_file():
        raise ConfigError(
            setting,
            url,
            "no database file there; nothing was created. Check the setting (or --home, "
            "--database-url), or create the stores with `statekeep db upgrade`",
        )
    db = Database(url, setting=setting)
    try:
        db.check()
        spec = declaration(store)
        migrations, applied = len(spec.migrations), spec.version(db)
    except BaseException:
        db.dispose()
        raise
    if applied < migrations or (applied == 0 and missing_ok):
        db.dispose()
        if applied == 0 and missing_ok:
            return None
        reason = (
            f"holds no {store} store yet"
            if applied == 0
            else f"holds the {store} store at schema version {applied}; this statekeep needs {migrations}"
        )
        raise ConfigError(setting, url, f"{reason}: run `statekeep db upgrade` (nothing was changed)")
    return db


def open_memory(
    settings: Settings, embedder: Embedder | None = None, *, read_only: bool = True
) -> MemoryStore:
    """The memory store; read-only by default: a LanceDB folder is opened without its writer lock.

    LanceDB readers are safe beside the one writer (a worker), so searches,
    lists and exports work while agents run. A folder that does not exist is an
    error naming ``STATEKEEP_MEMORY_URL``, never a new empty one.

    Raises:
        ConfigError: the folder is missing or holds no memories; the database is unreachable.
    """
    from statekeep.memory import open_memory_store

    memory = settings.memory
    if memory.backend != "lancedb" or not read_only:
        return open_memory_store(settings.memory_url, embedder)
    from statekeep.memory.lancedb import LanceDBMemoryStore

    return LanceDBMemoryStore(memory.location, embedder, read_only=True)
