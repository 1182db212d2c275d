"""Engines and transactions, one :class:`Database` per URL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

from statekeep._extras import requires
from statekeep._redact import redact_url
from statekeep.db import aio, rewrite
from statekeep.db.dialects import Dialect, dialect_of
from statekeep.errors import ConfigError, ErasureError, StorageError

_DRIVERS = {
    "sqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
}


def normalize_url(url: str | URL, *, setting: str = "STATEKEEP_DATABASE_URL") -> URL:
    """Parse a database URL and pin its driver (psycopg 3 for PostgreSQL).

    Raises:
        ConfigError: the URL is malformed or names an unsupported database.
    """
    if not isinstance(url, str | URL):
        raise ConfigError(setting, repr(url), f"must be a URL string, not {type(url).__name__}")
    if "\x00" in str(url):
        raise ConfigError(setting, str(url), "contains a NUL character")
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except sa.exc.ArgumentError as exc:
        raise ConfigError(setting, str(url), "not a database URL") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in _DRIVERS:
        raise ConfigError(setting, str(url), "supported databases are sqlite and postgresql")
    if backend.startswith("postgres") and driver not in ("psycopg", "psycopg2", ""):
        raise ConfigError(setting, str(url), "PostgreSQL is reached through psycopg 3")
    return parsed.set(drivername=_DRIVERS[backend])


#: Seconds a pooled connection may sit idle and still be handed out without a ping (as HikariCP's
#: alive-bypass window). A busy process reuses its connections without the extra round trip; one
#: idle longer is pinged at checkout, and replaced if the server dropped it (a restart, a timeout).
PING_AFTER_IDLE = 0.5


def _ping_idle_connections(engine: Engine, ping_after: float) -> None:
    @sa.event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["statekeep_idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("statekeep_idle_since")
        if since is None or time.monotonic() - since <= ping_after:
            return  # new, or used a moment ago
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:  # the pool replaces the connection and checks out again
            raise sa.exc.DisconnectionError(f"a pooled connection was dead: {exc}") from exc


class Database:
    """One SQL database: an engine, its dialect hooks, and transactions.

    Stores that share a URL can share a ``Database``, so that a step's completion
    and the working-state version it produced commit in one transaction.

    Examples:
        >>> db = Database("sqlite:///:memory:")
        >>> with db.begin() as conn:
        ...     _ = conn.execute(sa.text("SELECT 1"))
    """

    def __init__(
        self,
        url: str | URL,
        *,
        setting: str = "STATEKEEP_DATABASE_URL",
        ping_after: float = PING_AFTER_IDLE,
        **engine_kw: Any,
    ):
        self.url = normalize_url(url, setting=setting)
        self.setting = setting
        self.dialect: Dialect = dialect_of(self.url)
        _ensure_folder(self.dialect.file_of(self.url), self.url, setting)
        kw: dict[str, Any] = self.dialect.engine_options()
        kw.update(engine_kw)
        with requires("postgres", "PostgreSQL"):  # the engine imports its driver, psycopg
            self.engine: Engine = sa.create_engine(self.url, **kw)
        if not kw.get("pool_pre_ping"):
            _ping_idle_connections(self.engine, ping_after)
        self.dialect.configure(self.engine)
        self._ping_after = None if kw.get("pool_pre_ping") else ping_after
        self._async_kw = kw
        # an in-memory SQLite database lives in one connection: no second engine can see it
        self._async_ok = not self.in_memory and not ({"poolclass", "creator", "module"} & kw.keys())
        self._async_engines: dict[asyncio.AbstractEventLoop, AsyncEngine] = {}
        #: schema translation for stores: ``{"statekeep_working": None}`` on SQLite.
        self._schema_map: dict[str | None, str | None] = {}

    @property
    def name(self) -> str:
        """The dialect name: ``sqlite`` or ``postgresql``."""
        return self.dialect.name

    @property
    def in_memory(self) -> bool:
        """True for an in-memory SQLite database: it lives in one connection, whatever its URL says.

        Two such databases are never the same one, and no thread or process but this
        engine's connection can see it.
        """
        return self.dialect.in_memory(self.url)

    def register_schema(self, schema: str) -> None:
        """Map a store's logical schema onto this backend (dropped on SQLite)."""
        self._schema_map[schema] = schema if self.dialect.has_schemas else None

    def _options(self, write: bool) -> dict[str, Any]:
        opts: dict[str, Any] = {"schema_translate_map": dict(self._schema_map)}
        opts.update(self.dialect.write_options() if write else self.dialect.read_options())
        return opts

    def begin(self, what: str | None = None) -> AbstractContextManager[Connection]:
        """A write transaction: commits on success, rolls back on any exception.

        Raises:
            StorageError: the database failed (unreachable, a dropped connection, a full
                disk...); the message says ``what`` was being done.
        """
        return self._transaction(True, what or f"writing to {self!r}")

    def read(self, what: str | None = None) -> AbstractContextManager[Connection]:
        """A read transaction (a consistent snapshot on both backends).

        Raises:
            StorageError: the database failed; the message says ``what`` was being done.
        """
        return self._transaction(False, what or f"reading from {self!r}")

    @property
    def async_capable(self) -> bool:
        """True when code driven on an event loop reaches this database through an async driver."""
        return self._async_ok and aio.available(self.name)

    def _current_engine(self) -> Engine:
        """The engine for this call: inside :func:`statekeep.db.aio.drive`, the loop's async one."""
        if not (self._async_ok and aio.active()):
            return self.engine
        loop = asyncio.get_running_loop()
        engine = self._async_engines.get(loop)
        if engine is None:
            from sqlalchemy.ext.asyncio import create_async_engine

            url = self.url.set(drivername=self.dialect.async_driver)
            engine = create_async_engine(url, **self._async_kw)
            if self._ping_after is not None:
                _ping_idle_connections(engine.sync_engine, self._ping_after)
            self.dialect.configure(engine.sync_engine)
            self._async_engines[loop] = engine
            aio.at_end(loop, self._close_async)
        return engine.sync_engine

    async def _close_async(self, loop: asyncio.AbstractEventLoop) -> None:
        engine = self._async_engines.pop(loop, None)
        if engine is not None:
            await engine.dispose()

    @contextmanager
    def _transaction(self, write: bool, what: str) -> Iterator[Connection]:
        try:
            with self._current_engine().connect() as conn:
                conn = conn.execution_options(**self._options(write=write))
                with conn.begin():
                    yield conn
        except sa.exc.DBAPIError as exc:
            raise storage_error(exc, what) from exc

    def check(self) -> None:
        """Connect once, so that a bad URL or a dead server fails at start-up.

        Raises:
            ConfigError: naming the setting, when the database cannot be reached.
        """
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError as exc:
            reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
            raise ConfigError(self.setting, str(self.url), f"cannot connect: {reason}") from exc

    def scrub(self, owner: str) -> str:
        """After erasing ``owner``, leave no deleted bytes in the database's files (SQLite: truncate the WAL).

        Returns what was done, for an erasure receipt.

        Raises:
            ErasureError: a reader kept the old bytes for :data:`statekeep.db.rewrite.WAIT`
                seconds; erase again once it is done.
        """
        try:
            done = self.dialect.scrub(self.engine, rewrite.WAIT)
        except sa.exc.DBAPIError as exc:
            raise storage_error(exc, f"scrubbing {self!r}") from exc
        if done is None:
            reason = (
                f"a reader of {self!r} kept the write-ahead log, whose old frames hold the deleted rows, "
                f"for {rewrite.WAIT:g} s: end it (close the connection or its transaction)"
            )
            raise ErasureError(owner, "truncating the write-ahead log", reason)
        return done

    def dispose(self) -> None:
        """Close every pooled connection (call in a child process after fork)."""
        self.engine.dispose()

    def __repr__(self) -> str:
        shown: str | None = self.__dict__.get("_repr")
        if shown is None:  # the URL never changes: redacted once, not on every transaction's label
            shown = self.__dict__["_repr"] = (
                f"Database({redact_url(self.url.render_as_string(hide_password=True))!r})"
            )
        return shown


def _ensure_folder(file: Path | None, url: URL, setting: str) -> None:
    """Create the folder of a database file (SQLite), so that a fresh home just works."""
    if file is None:
        return
    folder = file.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(setting, str(url), f"cannot create folder {folder}: {exc.strerror}") from exc


def storage_error(exc: Exception, what: str) -> StorageError:
    """Wrap a driver error (or a StorageError raised for one) in the statekeep tree; keep its first line."""
    if isinstance(exc, StorageError) and isinstance(exc.__cause__, sa.exc.SQLAlchemyError):
        exc = exc.__cause__
    reason = (str(getattr(exc, "orig", exc)).strip().splitlines() or [type(exc).__name__])[0]
    return StorageError(f"{what}: {reason}")
